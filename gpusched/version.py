"""gpusched's one version: the installed distribution's, as pyproject.toml
sets it. `gpusched --version`, `GET /api/version/` and the admin's header
all read it here, so they cannot disagree. A checkout run without being
installed (no distribution metadata) reads pyproject.toml itself."""

from __future__ import annotations

import re
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "gpusched"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        found = re.search(r'^version\s*=\s*"([^"]+)"', _PYPROJECT.read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found[1] if found else "0+unknown"
