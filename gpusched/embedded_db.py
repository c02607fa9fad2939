"""The embedded PostgreSQL that runs when DATABASE_URL is unset.

`pgserver` ships PostgreSQL binaries inside a wheel, so a fresh machine needs
neither a server nor root setup. The server listens on a Unix socket in its
data folder under ./var/ (no TCP port to collide with) and outlives the
process that started it: every process of the system (web, cluster, tests,
manage.py) attaches to the same one, and `manage.py run_all` stops it on
Ctrl-C, but not after a crash: the next `make run` attaches to it. Started
as root, pgserver runs PostgreSQL as a `pgserver` system user.
`ensure_running` also restarts a server stopped since this process attached.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from urllib.parse import quote

from gpusched.paths import var_dir

DEFAULT_DATA_DIR = var_dir() / "pgdata"
DATABASE_NAME = "gpusched"


def data_dir() -> Path:
    return Path(os.environ.get("GPUSCHED_PGDATA", DEFAULT_DATA_DIR)).resolve()


def ensure_running() -> str:
    """Start the embedded server if needed; return a DATABASE_URL for it."""
    # pgserver keeps its lock file in the user's runtime folder; platformdirs
    # warns on every start when XDG_RUNTIME_DIR is unset (root shells, CI).
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = var_dir() / "run"
        runtime.mkdir(parents=True, exist_ok=True)
        runtime.chmod(0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    import pgserver

    pgdata = data_dir()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode=None)
    # pgserver keeps one handle per folder and process; the server behind a
    # handle from an earlier call may have been stopped since (a restart).
    with server._lock:
        server.ensure_postgres_running()
    info = server.get_postmaster_info()
    if DATABASE_NAME not in server.psql("SELECT datname FROM pg_database;"):
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    host = quote(str(info.socket_dir), safe="")
    return f"postgresql://postgres@{host}:{info.port}/{DATABASE_NAME}"


def stop() -> None:
    """Stop the embedded server if it runs (a fast shutdown: sessions end)."""
    pgdata = data_dir()
    if not (pgdata / "postmaster.pid").exists():
        return
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]  # made at import time by pgserver

    user = "pgserver" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError:
        pass  # already stopped
