"""Prepared statements for the SQL between two GPU jobs.

Django sends each query with its parameters merged into the text
(client-side binding), so PostgreSQL plans it anew every time: about a
millisecond for the claim's candidate query alone, on the path of every
front-door call and every dispatch. The statements of a claim, a
submission and a job's end go through `prepared_cursor()` instead: a
server-side-binding cursor on the same connection (the same transaction),
whose statements psycopg prepares on first use and PostgreSQL keeps for the
connection's life. Everything else keeps Django's cursors, which never
prepare (a prepared statement is per connection, and only these few are
worth keeping).

The cursor is Django's wrapper around psycopg's, so errors are Django's and
the test tools that capture queries see these statements too. A statement
prepared here names its columns rather than `*`: a prepared plan must not
change its result type under a running process after a migration.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.conf import settings
from django.db import connection
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Model

M = TypeVar("M", bound=Model)

# psycopg prepares a server-binding cursor's statement after this many
# executions on a connection; Django turns preparing off (None) by default.
PREPARE_AFTER = 0


def prepared_cursor() -> CursorWrapper:
    """A cursor whose statements are prepared once per connection; `%s` and
    `%(name)s` placeholders as usual, values only (no identifiers)."""
    connection.ensure_connection()
    raw = connection.connection
    assert raw is not None  # ensure_connection opened it
    if raw.prepare_threshold is None:
        # Only server-binding cursors prepare; Django's own cursors on this
        # connection (client-side binding) never do, whatever the threshold.
        raw.prepare_threshold = PREPARE_AFTER
    connection.validate_thread_sharing()
    # django-stubs types these as taking Django's wrapper; they wrap psycopg's.
    cursor: Any = ServerBindingCursor(raw)  # type: ignore[call-arg]  # the stubs omit psycopg's arguments
    if connection.queries_logged:
        return _LoggedPreparedCursor(cursor, connection)
    return connection.make_cursor(cursor)


class _LoggedPreparedCursor(CursorDebugWrapper):
    """Logs a prepared statement with its values merged in, as Django's own
    cursors log theirs (Django can read back only a client-side query)."""

    def debug_sql(
        self,
        sql: str | None = None,
        params: Any = None,
        use_last_executed_query: bool = False,
        many: bool = False,
    ) -> Any:
        if use_last_executed_query and not many and sql is not None:
            sql = self.db.ops.compose_sql(sql, params)
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


def model_columns(model: type[Model]) -> list[str]:
    """The columns of `model` a prepared statement names (never `*`)."""
    return [field.attname for field in model._meta.concrete_fields]


def select_list(alias: str, model: type[Model]) -> str:
    """`model`'s columns for a select list, qualified by `alias`."""
    return ", ".join(f"{alias}.{column}" for column in model_columns(model))


def from_row(model: type[M], values: Any) -> M:
    """A `model` instance from the values of `select_list`'s columns."""
    return model.from_db(connection.alias, model_columns(model), values)


def commit_without_flush_wait() -> None:
    """This transaction's COMMIT returns before its WAL reaches the disk
    (`SET LOCAL synchronous_commit TO OFF`, for this transaction only).

    For the front door's admission and end, whose caller waits on an open
    connection: that caller is the durable party (it resends a call that
    got no answer). A PostgreSQL crash loses at most the last fraction of a
    second of such commits (wal_writer_delay), never their atomicity: a
    transaction is there whole or not at all, its audit row with it.
    GPUSCHED_FRONTDOOR_ASYNC_COMMIT=0 turns it off (docs/benchmarks.md has
    the figure)."""
    if settings.GPUSCHED_FRONTDOOR_ASYNC_COMMIT:
        with prepared_cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
