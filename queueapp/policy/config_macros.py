"""llama-swap's macros in a model's config, and the names a model answers to.

llama-swap (internal/config/macros.go) replaces `${name}` in every value of
a model with the config's `macros` and the model's own (a model's wins),
then `${MODEL_ID}`; a macro may name another. Keys are no macro targets,
except those of `filters.setParamsByID`, which are expanded too and then
registered as aliases of their model (internal/config/load.go). `${PORT}`
(given at start) and `${env.NAME}` (llama-swap's own environment) are left
as they are: gpusched reads the file, it does not run it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# ${name} in a config value (internal/config/macros.go, macroPatternRegex).
_MACRO = re.compile(r"\$\{([a-zA-Z0-9_-]+)\}")
# Macros may name macros; a bounded depth of them is expanded.
_MACRO_PASSES = 8


def model_macros(config: Mapping, entry: Mapping) -> dict[str, object]:
    """The macros a model's values see: the config's, then the model's own."""
    shared = config.get("macros")
    own = entry.get("macros")
    return {
        **(shared if isinstance(shared, Mapping) else {}),
        **(own if isinstance(own, Mapping) else {}),
    }


def expand_macros(text: str, macros: Mapping[str, object], *, model_id: str) -> str:
    """`text` with `macros` and `${MODEL_ID}` replaced, as often as a macro
    names another; `${PORT}`, `${env.NAME}` and unknown names stay."""
    values = {str(name): _scalar_text(value) for name, value in macros.items()}
    values["MODEL_ID"] = model_id
    for _ in range(_MACRO_PASSES):
        expanded = _MACRO.sub(lambda found: values.get(found.group(1), found.group(0)), text)
        if expanded == text:
            break
        text = expanded
    return text


def _scalar_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def set_params_names(config: Mapping, model_id: str, entry: Mapping) -> list[str]:
    """The keys of a model's `filters.setParamsByID`, macros expanded, in
    the config's order: each a name llama-swap answers to (its own id
    among them, when listed)."""
    filters = entry.get("filters")
    by_id = filters.get("setParamsByID") if isinstance(filters, Mapping) else None
    if not isinstance(by_id, Mapping):
        return []
    macros = model_macros(config, entry)
    return [expand_macros(str(key), macros, model_id=model_id) for key in by_id]


def alias_names(config: Mapping, model_id: str, entry: Mapping) -> list[str]:
    """A model's `aliases`, macros expanded."""
    aliases = entry.get("aliases")
    if not isinstance(aliases, list):
        return []
    macros = model_macros(config, entry)
    return [expand_macros(str(alias), macros, model_id=model_id) for alias in aliases]
