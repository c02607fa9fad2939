import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from gpusched.stack import PORT_RANGE_VARIABLE
from queueapp.live.events import listener_connection_params
from queueapp.locks import DISPATCHER_LOCK_CLASS
from tests import factories
from tests.webhooks.receiver import Receiver

# The helpers that test modules share keep pytest's detailed assertion
# messages, as they had inside the test modules they came from.
pytest.register_assert_rewrite(
    "tests.api.helpers", "tests.dispatch.helpers", "tests.e2e.helpers", "tests.why.timeline"
)


def pytest_configure(config):
    """Ctrl-C as a terminal sends it, to the processes tests start: a run
    started in the background (a CI runner's shell, `make test &`) has
    SIGINT and SIGQUIT ignored, which every process it starts inherits, and
    the tests that press Ctrl-C would find it ignored."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    _ports_of_this_worker()


def _ports_of_this_worker() -> None:
    """The ports this process hands out (gpusched/stack.py's free_port): a
    range of its own for each pytest-xdist worker, below the kernel's
    ephemeral ports (32768 and up) that bind(0) and outgoing connections take."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    size = 22_000 // workers
    first = 10_000 + index * size
    os.environ[PORT_RANGE_VARIABLE] = f"{first}-{first + size - 1}"


# A deadlock victim's transaction did nothing, and PostgreSQL's advice is to
# run it again. The flush that empties the tables after a transactional
# test can be chosen while a shared running system's dispatcher writes (its
# GPU's idle record): it is run again, up to this many times in all.
FLUSH_TRIES = 5


@pytest.fixture(scope="session", autouse=True)
def _flush_runs_again_after_a_deadlock():
    from django.core.management.base import CommandError
    from django.core.management.commands.flush import Command
    from psycopg.errors import DeadlockDetected

    handle = Command.handle

    def handle_again_after_a_deadlock(self, **options):
        for attempt in range(1, FLUSH_TRIES + 1):
            try:
                return handle(self, **options)
            except CommandError as error:  # flush's, raised from the database's error
                deadlock = isinstance(getattr(error.__cause__, "__cause__", None), DeadlockDetected)
                if not deadlock or attempt == FLUSH_TRIES:
                    raise

    Command.handle = handle_again_after_a_deadlock
    yield
    Command.handle = handle


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The tests marked slow first, in the random order among them (the sort
    keeps it): a parallel run whose last test is a long one ends with every
    other worker idle for that test's length."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _processes_only_in_e2e(request, monkeypatch):
    """A test that starts a process (manage.py, a server, a shell command) is
    an end-to-end test and says so with the e2e mark: `make test-fast`
    leaves those out and must stay quick. Any other test that starts one
    fails here, whatever catches the error inside it."""
    if request.node.get_closest_marker("e2e"):
        yield
        return
    started: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            # Popen._execute_child(self, args, ...): the command is args[1].
            started.append(repr(args[1]) if what == "subprocess" else what)
            raise RuntimeError(f"{request.node.nodeid} started a process without the e2e mark")

        return start

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess"))
    monkeypatch.setattr(os, "fork", refuse("os.fork()"))
    monkeypatch.setattr(os, "posix_spawn", refuse("os.posix_spawn()"))
    yield
    if started:
        pytest.fail(f"started a process without the e2e mark: {started[0]}", pytrace=False)


@pytest.fixture
def api():
    """An API client; `api.as_member(token)` sets the Bearer token."""

    class Client(APIClient):
        def as_member(self, token: str) -> "Client":
            self.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            return self

    return Client()


@pytest.fixture
def default_tiers(db):
    factories.policy()
    return factories.tiers()


@pytest.fixture
def schedules(db):
    """The django-q schedules that migrations create (tests/factories.py)."""
    factories.schedules()


@pytest.fixture
def gateways_judged():
    """The database server has run long enough for a web process without its
    liveness lock to be judged gone (queueapp/liveness.py): right after the
    server starts (a fresh embedded one, say), none is."""
    from django.db import connection

    from gpusched.stack import wait_for
    from queueapp.liveness import JUDGING_SQL, RECONNECT_GRACE_SECONDS

    def judged() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {JUDGING_SQL}")
            return bool(cursor.fetchone()[0])

    wait_for(judged, timeout=RECONNECT_GRACE_SECONDS + 10, message="the server's first seconds")


@pytest.fixture(autouse=True)
def _no_failed_logins_carried_over():
    """Failed-login counters live in the cache (queueapp/logins.py); one test's
    wrong tokens must not lock the next test out."""
    cache.clear()


@pytest.fixture(autouse=True)
def _short_lived_connections(settings):
    """Threads that serve async code (Channels) keep their own connections;
    closing them after each use lets the test database be dropped at the end."""
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    """Webhook receivers on 127.0.0.1 (`receivers(answers, **options)`),
    stopped after the test."""
    made: list[Receiver] = []

    def make(*args: Any, **kwargs: Any) -> Receiver:
        made.append(Receiver(*args, **kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.stop()


@pytest.fixture
def dispatchers_alive() -> Iterator[Callable[..., None]]:
    """Hold the dispatcher locks of the GPUs given, as their dispatch passes do
    (queueapp/liveness.py): a GPU no dispatcher holds shows `no dispatcher`
    and claims nothing."""
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:

        def alive(*gpus: Any) -> None:
            for each in gpus:
                session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, each.pk])

        yield alive
