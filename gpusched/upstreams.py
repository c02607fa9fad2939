"""The GPUs named in `LLAMA_SWAP_URL`: one llama-swap upstream per GPU, the
API key gpusched sends to each (`LLAMA_SWAP_API_KEY`) and the config file
each llama-swap runs with (`LLAMA_SWAP_CONFIG`).

`LLAMA_SWAP_URL` is a comma-separated list; each entry is `NAME=URL`, or a
bare URL, named `gpu0`, `gpu1`, … by its position. One URL is one GPU, named
`gpu0`. Plain Python: settings read it at start-up, and the dispatcher and
`make run` at call time (a test may change the setting).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

# A GPU's name appears in URLs, metrics labels and a django-q2 cluster name.
GPU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_UPSTREAM = "http://127.0.0.1:9292"


class UpstreamListInvalid(ValueError):
    """`LLAMA_SWAP_URL` cannot be read; the message says which entry and why."""


@dataclass(frozen=True)
class Upstream:
    name: str
    url: str


def default_gpu_name(position: int) -> str:
    return f"gpu{position}"


def parse_upstreams(text: str) -> list[Upstream]:
    """The GPUs of a `LLAMA_SWAP_URL` value, in order."""
    upstreams: list[Upstream] = []
    entries = [entry.strip() for entry in text.split(",")]
    for position, entry in enumerate(entries):
        if not entry:
            raise UpstreamListInvalid(
                f"LLAMA_SWAP_URL: entry {position + 1} is empty (entries are comma-separated)"
            )
        name, separator, url = entry.partition("=")
        if not separator:
            name, url = default_gpu_name(position), entry
        name, url = name.strip(), url.strip().rstrip("/")
        if not GPU_NAME.fullmatch(name):
            raise UpstreamListInvalid(
                f"LLAMA_SWAP_URL: {name!r} is not a GPU name (letters, digits, '_', '.', '-'; "
                "at most 64, starting with a letter or digit)"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamListInvalid(
                f"LLAMA_SWAP_URL: {url!r} (GPU {name}) is not an http:// or https:// URL"
            )
        if any(upstream.name == name for upstream in upstreams):
            raise UpstreamListInvalid(f"LLAMA_SWAP_URL: the GPU name {name!r} is given twice")
        upstreams.append(Upstream(name=name, url=url))
    return upstreams


def dispatch_cluster_name(gpu: str) -> str:
    """The django-q2 cluster (its queue in the broker) of one GPU's dispatcher."""
    return f"dispatch-{gpu}"


# --- llama-swap's API key -------------------------------------------------------

API_KEY_VARIABLE = "LLAMA_SWAP_API_KEY"
API_KEY_FILE_VARIABLE = "LLAMA_SWAP_API_KEY_FILE"
# What a key may hold: it travels in a header, and llama-swap refuses a key
# with a space; ',' and '=' separate the `NAME=KEY` entries.
_KEY_TEXT = re.compile(r"[!-~]+")


class ApiKeysInvalid(ValueError):
    """The API key setting cannot be read; the message names the variable and
    why, never the key."""


@dataclass(frozen=True, repr=False)
class ApiKeys:
    """gpusched's key for each GPU's llama-swap: one for every GPU
    (`for_every_gpu`), or one per GPU name. Its repr names the GPUs, never a
    key (`manage.py diffsettings` prints settings)."""

    for_every_gpu: str | None = None
    by_gpu: tuple[tuple[str, str], ...] = ()

    def key_for(self, gpu: str) -> str | None:
        """The key sent to GPU `gpu`'s llama-swap; None: none is sent."""
        if self.for_every_gpu is not None:
            return self.for_every_gpu
        return dict(self.by_gpu).get(gpu)

    def __bool__(self) -> bool:
        return self.for_every_gpu is not None or bool(self.by_gpu)

    def __repr__(self) -> str:
        if self.for_every_gpu is not None:
            return "ApiKeys(<one key for every GPU>)"
        return f"ApiKeys(<a key for {', '.join(name for name, _ in self.by_gpu) or 'no GPU'}>)"


def parse_api_keys(text: str, *, gpu_names: Sequence[str], source: str) -> ApiKeys:
    """The keys of a `LLAMA_SWAP_API_KEY` value (or its file's text):
    one key for every GPU, or `NAME=KEY` entries separated by commas (or
    lines, in a file), each NAME a GPU of `gpu_names`. A value with '=' is
    entries, so a key that holds '=' is given per GPU (`gpu0=abc==`).
    `source` names the variable in the messages, which never show a key."""
    entries = [entry.strip() for entry in re.split(r"[,\n]", text.strip())]
    if entries == [""]:
        raise ApiKeysInvalid(f"{source} is empty")
    if len(entries) == 1 and "=" not in entries[0]:
        return ApiKeys(for_every_gpu=_key_checked(entries[0], source=source, where="the key"))
    keys: list[tuple[str, str]] = []
    for position, entry in enumerate(entries, start=1):
        name, separator, key = (part.strip() for part in entry.partition("="))
        if not entry:
            raise ApiKeysInvalid(
                f"{source}: entry {position} is empty (entries are NAME=KEY, comma-separated)"
            )
        if not separator:
            raise ApiKeysInvalid(
                f"{source}: entry {position} is not NAME=KEY (several keys are given per GPU, "
                "e.g. gpu0=KEY0,gpu1=KEY1; one key alone is for every GPU)"
            )
        if name not in gpu_names:
            # Not echoed: what comes before a '=' may be a key's own text.
            raise ApiKeysInvalid(
                f"{source}: entry {position} names no GPU of LLAMA_SWAP_URL (it names "
                f"{', '.join(gpu_names)}); a key for every GPU has no '=' in it"
            )
        if any(known == name for known, _ in keys):
            raise ApiKeysInvalid(f"{source}: the GPU {name!r} is given twice")
        keys.append((name, _key_checked(key, source=source, where=f"the key of {name}")))
    return ApiKeys(by_gpu=tuple(keys))


def _key_checked(key: str, *, source: str, where: str) -> str:
    if not key:
        raise ApiKeysInvalid(f"{source}: {where} is empty")
    if not _KEY_TEXT.fullmatch(key):
        raise ApiKeysInvalid(
            f"{source}: {where} holds a space or a character that is not printable ASCII "
            "(llama-swap refuses a key with a space; a header carries it)"
        )
    return key


def api_keys_from_environment(environ: Mapping[str, str], *, gpu_names: Sequence[str]) -> ApiKeys:
    """The keys `LLAMA_SWAP_API_KEY` gives, or the file `LLAMA_SWAP_API_KEY_FILE`
    names (same format: for systemd credentials and secrets); no key when
    both are unset or empty. Both set is an error: which one wins would be
    a guess."""
    value = environ.get(API_KEY_VARIABLE, "").strip()
    path = environ.get(API_KEY_FILE_VARIABLE, "").strip()
    if value and path:
        raise ApiKeysInvalid(
            f"{API_KEY_VARIABLE} and {API_KEY_FILE_VARIABLE} are both set; set one of them"
        )
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise ApiKeysInvalid(f"{API_KEY_FILE_VARIABLE}: cannot read {path}: {reason}") from None
        return parse_api_keys(text, gpu_names=gpu_names, source=f"{API_KEY_FILE_VARIABLE} ({path})")
    if value:
        return parse_api_keys(value, gpu_names=gpu_names, source=API_KEY_VARIABLE)
    return ApiKeys()


def bearer_headers(key: str | None) -> dict[str, str]:
    """The header that carries `key` to llama-swap (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


# --- llama-swap's config file -----------------------------------------------------

CONFIG_VARIABLE = "LLAMA_SWAP_CONFIG"


class ConfigPathsInvalid(ValueError):
    """`LLAMA_SWAP_CONFIG` cannot be read; the message says which entry and why."""


@dataclass(frozen=True)
class ConfigPaths:
    """The llama-swap config file of each GPU: one for every GPU
    (`for_every_gpu`), or one per GPU name; none when the variable is unset."""

    for_every_gpu: str | None = None
    by_gpu: tuple[tuple[str, str], ...] = ()

    def path_for(self, gpu: str) -> str | None:
        """GPU `gpu`'s config file; None: llama-swap's default routing."""
        if self.for_every_gpu is not None:
            return self.for_every_gpu
        return dict(self.by_gpu).get(gpu)


def parse_config_paths(text: str, *, gpu_names: Sequence[str]) -> ConfigPaths:
    """The files of a `LLAMA_SWAP_CONFIG` value: one path for every GPU, or
    `NAME=PATH` entries separated by commas, each NAME a GPU of `gpu_names`.
    A value with '=' is entries, so a path that holds '=' is given per GPU."""
    text = text.strip()
    if not text:
        return ConfigPaths()
    if "=" not in text:
        if "," in text:
            raise ConfigPathsInvalid(
                f"{CONFIG_VARIABLE}: several files are given per GPU "
                "(NAME=PATH,NAME=PATH); one path alone is for every GPU"
            )
        return ConfigPaths(for_every_gpu=text)
    paths: list[tuple[str, str]] = []
    for position, entry in enumerate((entry.strip() for entry in text.split(",")), start=1):
        name, separator, path = (part.strip() for part in entry.partition("="))
        if not separator or not name or not path:
            raise ConfigPathsInvalid(
                f"{CONFIG_VARIABLE}: entry {position} ({entry!r}) is not NAME=PATH "
                "(entries are comma-separated, e.g. gpu0=/etc/llama-swap/config.yaml)"
            )
        if name not in gpu_names:
            raise ConfigPathsInvalid(
                f"{CONFIG_VARIABLE}: {name!r} is not a GPU of LLAMA_SWAP_URL "
                f"(it names {', '.join(gpu_names)})"
            )
        if any(known == name for known, _ in paths):
            raise ConfigPathsInvalid(f"{CONFIG_VARIABLE}: the GPU {name!r} is given twice")
        paths.append((name, path))
    return ConfigPaths(by_gpu=tuple(paths))
