"""pg_dump and pg_restore for gpusched's database: `manage.py backup` and
`manage.py restore`.

Why the binaries are pgserver's by default: the embedded database needs no
PostgreSQL installed on the machine, so neither may its backups; the wheel
ships pg_dump and pg_restore beside the server. A pg_dump refuses a server of
a newer major version than its own, so the version is checked first and the
error names the override (`--pg-dump`, GPUSCHED_PG_DUMP) instead of
pg_dump's own message.

Why an exported snapshot: the command counts the jobs it reports in the same
snapshot pg_dump reads (`pg_dump --snapshot`), so "3 queued, 1 running" is
what the file holds, not what the queue held a moment earlier or later.

The connection goes to the tools through libpq's environment (PGHOST, ...),
never their command line, where any user of the machine could read the
password in the process list.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

# Where a tool's version is in its `--version` line: "pg_dump (PostgreSQL) 16.2".
VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.\d+)?")
# libpq's variable for each connection option dj_database_url may set.
LIBPQ_OPTIONS = {
    "sslmode": "PGSSLMODE",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "connect_timeout": "PGCONNECT_TIMEOUT",
}
# The tools' own exit codes say little; their last lines say what failed.
ERROR_LINES_SHOWN = 8


class ArchiveError(Exception):
    """A backup or restore that cannot go on, with a message for the operator."""


@dataclass(frozen=True)
class ServerSnapshot:
    """A snapshot exported by the open transaction, and the server's major version."""

    snapshot_id: str
    server_major: int


def pgserver_bin() -> Path | None:
    """The folder of the binaries pgserver ships, found without importing it
    (its import starts nothing, but warns where XDG_RUNTIME_DIR is unset)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def tool_path(name: str, *, given: str, variable: str, option: str) -> Path:
    """The `name` binary to run: `given` (an option or `variable`), else pgserver's."""
    if given:
        path = Path(given).expanduser()
        where = f"{option} / {variable}"
    else:
        folder = pgserver_bin()
        if folder is None:
            raise ArchiveError(
                f"no {name}: the pgserver package is not installed; "
                f"give one with {option} PATH or {variable}"
            )
        path = folder / name
        where = "pgserver's"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ArchiveError(f"{where} {name} is not an executable file: {path}")
    return path


def tool_major(tool: Path) -> int:
    """The major version of a PostgreSQL client tool."""
    answer = _run([str(tool), "--version"], env=None)
    match = VERSION.search(answer.stdout)
    if match is None:
        raise ArchiveError(f"{tool} --version did not say a PostgreSQL version: {answer.stdout!r}")
    return int(match[1])


def snapshot_export() -> ServerSnapshot:
    """Make the caller's new transaction a read-only repeatable read and
    export its snapshot for pg_dump; must be the transaction's first statement."""
    assert connection.in_atomic_block, "the snapshot lives as long as the caller's transaction"
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursor.execute("SELECT pg_export_snapshot(), current_setting('server_version_num')::int")
        snapshot_id, version_num = cursor.fetchone()
    return ServerSnapshot(snapshot_id=snapshot_id, server_major=version_num // 10000)


def dump(*, tool: Path, database: dict[str, Any], path: Path, snapshot: ServerSnapshot) -> int:
    """pg_dump the database in custom format (-Fc) to `path`, as `snapshot`
    sees it; the size written. The file appears only once complete, so a
    failed backup never replaces a good one."""
    major = tool_major(tool)
    if major < snapshot.server_major:
        raise ArchiveError(
            f"{tool} is pg_dump {major}, older than the server (PostgreSQL "
            f"{snapshot.server_major}); pg_dump must be at least the server's version: "
            f"give a pg_dump {snapshot.server_major} or later with --pg-dump PATH or "
            "GPUSCHED_PG_DUMP"
        )
    partial = path.with_name(f".{path.name}.partial")
    command = [str(tool), "--format=custom", f"--snapshot={snapshot.snapshot_id}"]
    try:
        _run([*command, f"--file={partial}"], env=libpq_environment(database))
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path.stat().st_size


def restore(*, tool: Path, database: dict[str, Any], path: Path) -> None:
    """pg_restore `path` into the database, all or nothing (one transaction).
    The objects become the connecting user's (no owners or grants restored):
    the roles of the server the backup came from need not exist here."""
    _run(
        [
            str(tool),
            "--single-transaction",
            "--exit-on-error",
            "--no-owner",
            "--no-acl",
            f"--dbname={database['NAME']}",
            str(path),
        ],
        env=libpq_environment(database),
    )


def schema_empty() -> None:
    """Drop everything in the public schema, where gpusched's tables, sequences
    and trigger functions live, and create it empty again."""
    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA public CASCADE")
        cursor.execute("CREATE SCHEMA public")


def database_description(database: dict[str, Any]) -> str:
    """`gpusched on 127.0.0.1:5432`, for messages: no user, no password."""
    host = str(database.get("HOST") or "localhost")
    port = f":{database['PORT']}" if database.get("PORT") else ""
    return f"{database['NAME']} on {host}{port}"


def libpq_environment(database: dict[str, Any]) -> dict[str, str]:
    """This process's environment with the connection to `database` (a
    Django DATABASES entry) in libpq's variables."""
    env = dict(os.environ)
    for key, variable in (
        ("HOST", "PGHOST"),
        ("PORT", "PGPORT"),
        ("USER", "PGUSER"),
        ("PASSWORD", "PGPASSWORD"),
        ("NAME", "PGDATABASE"),
    ):
        if database.get(key):
            env[variable] = str(database[key])
    for option, variable in LIBPQ_OPTIONS.items():
        value = (database.get("OPTIONS") or {}).get(option)
        if value is not None:
            env[variable] = str(value)
    return env


def _run(command: list[str], *, env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    try:
        answer = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ArchiveError(f"cannot run {command[0]}: {exc}") from None
    if answer.returncode != 0:
        lines = answer.stderr.strip().splitlines()[-ERROR_LINES_SHOWN:]
        raise ArchiveError(
            f"{Path(command[0]).name} failed (exit {answer.returncode}): " + "\n".join(lines)
        )
    return answer
