"""Domain errors; the API's exception handler maps each to an HTTP answer."""

from django.db import InterfaceError, OperationalError


class GpuschedError(Exception):
    http_status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(GpuschedError):
    http_status = 400


class RequestTooLarge(GpuschedError):
    """A body over its limit (queueapp/job_body.py BodyLimit: the message
    names the limit and the setting that raises it)."""

    http_status = 413


class NotFound(GpuschedError):
    http_status = 404


class Conflict(GpuschedError):
    http_status = 409


class QueueClosed(GpuschedError):
    """The operator closed the queue for maintenance."""

    http_status = 503


class QueueLimitReached(GpuschedError):
    """The member has as many queued jobs as the tier allows."""

    http_status = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class WaitBoundUnmet(GpuschedError):
    """The job cannot start within the caller's wait bound (X-Gpusched-Max-Wait,
    or its band's default): refused, nothing queued; or, as a queued job's
    end, its bound passed. `retry_after`: seconds until it could start."""

    http_status = 503
    code = "gpu_busy"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# What a database call raises when PostgreSQL is away or every pooled
# connection is in use (pool_exhausted tells the two apart).
DATABASE_ERRORS = (OperationalError, InterfaceError)

# Why a database call failed, as the caller is told (a 503 either way).
DATABASE_UNAVAILABLE = (
    "the database is unavailable (restarting?); nothing was changed; try again shortly"
)
DATABASE_RETRY_AFTER_SECONDS = 5
SERVER_BUSY = (
    "the server is busy (every database connection of this process is in use); "
    "nothing was changed; try again in a second"
)
SERVER_BUSY_RETRY_AFTER_SECONDS = 1


def pool_exhausted(exc: BaseException) -> bool:
    """This process's pool had no free connection in time while PostgreSQL
    answers. The pool times out alike when it cannot connect at all, so a
    pool timeout is told apart by one quick connection of its own."""
    from psycopg_pool import PoolTimeout

    if not (isinstance(exc, PoolTimeout) or isinstance(exc.__cause__, PoolTimeout)):
        return False
    return _database_answers()


def _database_answers() -> bool:
    import psycopg

    from queueapp.live.events import listener_connection_params

    try:
        psycopg.connect(**{**listener_connection_params(), "connect_timeout": 2}).close()
    except psycopg.Error:
        return False
    return True
