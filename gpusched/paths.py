"""Where gpusched keeps what it writes: `var_dir()`.

A checkout keeps it in ./var/ (gitignored), so `make run` needs no
setting; a service installed from a wheel has no checkout to write into
and names a folder of its own with GPUSCHED_VAR_DIR (the unit files in
deploy/ use /var/lib/gpusched)."""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    configured = os.environ.get("GPUSCHED_VAR_DIR", "").strip()
    return Path(configured) if configured else CHECKOUT / "var"
