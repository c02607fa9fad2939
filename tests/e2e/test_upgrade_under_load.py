"""An upgrade in the documented order (docs/operations/upgrades.md), under
load: with jobs queued, one running and a front-door call in flight, the
next release's migration is applied while the old processes run, then the
dispatcher is restarted, then each of two web servers in turn, every new
process running the next release's code. No job is lost or failed, the
running job reaches llama-swap once, the call gets its answer, and clients
behind a proxy that tries the other web server on a refused connection (as
nginx's `proxy_next_upstream error`) see no failed request.

The next release is a copy of this checkout with one migration more: a
nullable column on the jobs table, which the new release's model reads, so
a new process that ran without it would fail."""

from __future__ import annotations

import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.db import connection

from gpusched.stack import ROOT, wait_for
from gpusched.version import version
from queueapp.models import Job, JobStatus
from tests import factories
from tests.e2e.helpers import front_door_call_in_thread

pytestmark = [pytest.mark.e2e, pytest.mark.database_server, pytest.mark.slow]

# The running job: still running once the migration is applied, on a busy
# machine too (10 s was not, with six test workers on two cores).
LONG_SECONDS = 20.0
CALL_SECONDS = 4.0  # the front-door call: still running when its web server is restarted
QUEUED_JOBS = 4
POLL_SECONDS = 0.05  # the client's pace during the upgrade
POST_EVERY = 4  # one request in this many submits a job; the others read one
NEW_COLUMN = "upgrade_note"
# The anchor in the jobs model after which the next release declares its column.
MODEL_ANCHOR = "    attempts = models.PositiveIntegerField(default=0)\n"


@dataclass
class Release:
    root: Path
    version: str
    migration: str


def build_next_release(folder: Path) -> Release:
    """A copy of the packages and manage.py with a migration that adds a
    nullable column to the jobs table, the column in the Job model, and a
    version of its own."""
    for package in ("gpusched", "queueapp", "gpusched_client"):
        shutil.copytree(
            ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy2(ROOT / "manage.py", folder / "manage.py")
    migrations = folder / "queueapp" / "migrations"
    latest = max(path.stem for path in migrations.glob("[0-9][0-9][0-9][0-9]_*.py"))
    name = f"{int(latest[:4]) + 1:04d}_job_{NEW_COLUMN}"
    (migrations / f"{name}.py").write_text(
        "from django.db import migrations, models\n\n\n"
        "class Migration(migrations.Migration):\n"
        f"    dependencies = [('queueapp', '{latest}')]\n"
        "    operations = [\n"
        f"        migrations.AddField('job', '{NEW_COLUMN}', models.TextField(null=True)),\n"
        "    ]\n"
    )
    model = folder / "queueapp" / "models" / "jobs.py"
    source = model.read_text()
    assert source.count(MODEL_ANCHOR) == 1, f"the jobs model lost its anchor: {MODEL_ANCHOR!r}"
    model.write_text(
        source.replace(
            MODEL_ANCHOR, f"{MODEL_ANCHOR}    {NEW_COLUMN} = models.TextField(null=True)\n"
        )
    )
    next_version = f"{version()}+next"
    with (folder / "gpusched" / "version.py").open("a") as module:
        module.write(f"\n\ndef version() -> str:\n    return {next_version!r}\n")
    return Release(folder, next_version, name)


@pytest.fixture
def next_release(world, tmp_path):
    """The next release, and its migration undone once every process has
    stopped, so the tests after this one find the schema they know."""
    # One state folder for both releases, as an installation's GPUSCHED_VAR_DIR.
    world.env["GPUSCHED_VAR_DIR"] = str(tmp_path / "var")
    release = build_next_release(tmp_path / "next-release")
    yield release
    world.stop()
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE queueapp_job DROP COLUMN IF EXISTS {NEW_COLUMN}")
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'queueapp' AND name = %s",
            [release.migration],
        )


class ProxiedClient(threading.Thread):
    """A client during the upgrade, behind a proxy such as nginx with
    `proxy_next_upstream error`: each request goes to the web servers in
    turn and, when one refuses the connection, to the other; a read that
    breaks after the connection is retried only for a GET (nginx retries no
    POST it has sent). Every request made counts, and every answer other than
    the one expected, or no answer, is a failure. With `keep_alive` it keeps
    its connections open between requests (nginx's `keepalive` in an
    upstream block); else one connection a request (nginx's default)."""

    def __init__(self, servers: list[str], token: str, watched_job: int, keep_alive: bool) -> None:
        super().__init__(daemon=True)
        self.servers = servers
        self.label = "keep-alive" if keep_alive else "close"
        self.headers = {"Authorization": f"Bearer {token}"}
        if not keep_alive:
            self.headers["Connection"] = "close"
        self.watched_job = watched_job
        self.stopping = threading.Event()
        self.requests = 0
        self.went_to_other = 0  # refused by one web server, answered by the other
        self.slowest = 0.0
        self.failures: list[str] = []
        self.submitted: list[int] = []

    def run(self) -> None:
        try:
            with httpx.Client(headers=self.headers, timeout=30) as client:
                while not self.stopping.wait(POLL_SECONDS):  # the client's pace
                    self.requests += 1
                    if self.requests % POST_EVERY:
                        self.call(client, "GET", f"/api/jobs/{self.watched_job}/", 200)
                        continue
                    body = factories.chat_body("chat-a", user=f"{self.label}-{self.requests}")
                    payload = {"path": "/v1/chat/completions", "body": body}
                    answer = self.call(client, "POST", "/api/jobs/", 201, json=payload)
                    if answer is not None:
                        self.submitted.append(answer.json()["id"])
        except Exception as exc:  # noqa: BLE001  # the test reports it
            self.failures.append(f"the client stopped: {exc!r}")

    def call(
        self, client, method: str, path: str, expected: int, **kwargs
    ) -> httpx.Response | None:
        first = self.requests % len(self.servers)
        started = time.monotonic()
        for tried, server in enumerate(self.servers[first:] + self.servers[:first]):
            try:
                response = client.request(method, server + path, **kwargs)
            except httpx.ConnectError:
                continue
            except httpx.TransportError as exc:
                if method == "GET":
                    continue
                self.failures.append(f"{method} {server}{path}: {exc!r}")
                return None
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.went_to_other += tried
            if response.status_code != expected:
                self.failures.append(
                    f"{method} {server}{path}: {response.status_code} {response.text[:200]}"
                )
                return None
            return response
        self.failures.append(f"{method} {path}: every web server refused or broke the request")
        return None

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


@contextmanager
def timed(phases: dict[str, float], phase: str):
    started = time.monotonic()
    yield
    phases[phase] = time.monotonic() - started


def runs(process, release: Release) -> bool:
    """Whether `process` runs from the release's checkout."""
    return Path(f"/proc/{process.pid}/cwd").resolve() == release.root.resolve()


def status_of(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)


def upgrade_in_order(world, release: Release, long_job: int, call, answers: list) -> dict:
    """The documented order: migrate beside the old processes, restart the
    dispatcher, then web server A (which drains the call in flight), then B.
    Returns each phase's seconds."""
    phases: dict[str, float] = {}
    old_cluster, (web_a, web_b) = world.clusters[0], world.servers
    with timed(phases, "migrate"):
        world.manage("migrate", "--no-input", root=release.root)
    assert status_of(long_job) == JobStatus.RUNNING, "the migration outlasted the running job"

    with timed(phases, "dispatcher"):
        # SIGINT: its worker finishes the running job first, however long it
        # has left (a supervisor's stop timeout is sized to the longest job).
        old_cluster.stop(timeout=LONG_SECONDS + 15)
        assert status_of(long_job) == JobStatus.SUCCEEDED, old_cluster.tail()
        assert runs(world.start_cluster(root=release.root), release)

    front_door_job = Job.objects.get(front_door=True).pk
    state = wait_for(
        lambda: status_of(front_door_job) != JobStatus.QUEUED and status_of(front_door_job),
        message="the front-door call to run on the new dispatcher",
    )
    assert state == JobStatus.RUNNING and not answers, "the call ended before web A's restart"
    for name, web in (("web A", web_a), ("web B", web_b)):
        with timed(phases, name):
            web.stop()  # SIGTERM: it closes its port and lets the call finish
            assert web.process.returncode == 0, web.tail()
            assert runs(world.start_web(port=web.port, root=release.root), release)
        if web is web_a:
            call.join(timeout=30)
            assert answers, f"the call relayed by web A got no answer\n{web_a.tail()}"
    return phases


def queue_jobs(web, token: str, count: int) -> list[int]:
    """`count` chat jobs submitted over REST through `web`."""
    answers = [
        httpx.post(
            f"{web.url}/api/jobs/",
            json={
                "path": "/v1/chat/completions",
                "body": factories.chat_body("chat-a", user=f"q{n}"),
            },
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        for n in range(count)
    ]
    assert [answer.status_code for answer in answers] == [201] * count, answers[-1].text
    return [answer.json()["id"] for answer in answers]


def check_each_job_ran_once(world, submitted: list[int], figures: str) -> None:
    """Every job submitted is there and succeeded, the front-door call's too,
    and llama-swap got each one once: none lost, none run twice."""
    assert Job.objects.filter(pk__in=submitted).count() == len(submitted), f"lost: {figures}"
    not_succeeded = Job.objects.exclude(status=JobStatus.SUCCEEDED)
    assert not not_succeeded.exists(), list(not_succeeded.values("id", "status", "error"))
    assert Job.objects.count() == len(submitted) + 1, figures  # and the front-door call
    # Every request llama-swap got, answered or cut off by a dispatcher that died.
    sent = world.simulator.log()
    labels = [entry["body"].get("user") for entry in sent]
    assert len(labels) == len(set(labels)) == len(submitted) + 1, f"sent twice or never: {labels}"
    assert {entry["status"] for entry in sent} == {200}, sent


def test_an_upgrade_in_the_documented_order_loses_no_job_and_fails_no_request(world, next_release):
    world.start_cluster()
    web_a, web_b = world.start_web(), world.start_web()
    _, caller = factories.member("ann-member", "pro")
    client_member, client_token = factories.member("bob-member", "pro")
    long_job = factories.job(client_member, model="video-wan", seconds=LONG_SECONDS, label="long")
    wait_for(lambda: status_of(long_job.pk) == JobStatus.RUNNING, message="the long job to run")
    queued = queue_jobs(web_b, client_token, QUEUED_JOBS)
    answers: list = []
    call_failures: list = []
    call = front_door_call_in_thread(
        web_a, caller, CALL_SECONDS, answers, call_failures, user="front-door"
    )
    wait_for(
        lambda: Job.objects.filter(front_door=True, status=JobStatus.QUEUED).exists(),
        message="the front-door call to wait in the queue",
    )
    clients = [
        ProxiedClient([web_a.url, web_b.url], client_token, long_job.pk, keep_alive)
        for keep_alive in (False, True)
    ]
    for client in clients:
        client.start()
    started = time.monotonic()
    try:
        phases = upgrade_in_order(world, next_release, long_job.pk, call, answers)
    finally:
        for client in clients:
            client.stop()
    seconds = time.monotonic() - started

    wait_for(
        lambda: not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists(),
        message="every job to end",
    )
    failures = [failure for client in clients for failure in client.failures]
    submitted = [job for client in clients for job in client.submitted]
    went_to_other = sum(client.went_to_other for client in clients)
    figures = (
        f"{sum(client.requests for client in clients)} requests in {seconds:.1f} s of upgrade "
        f"({', '.join(f'{name} {took:.1f} s' for name, took in phases.items())}): "
        f"{len(failures)} failed, {went_to_other} sent to the other web server, "
        f"slowest {max(client.slowest for client in clients):.2f} s; "
        f"{Job.objects.count()} jobs, {len(submitted)} of them submitted during the upgrade"
    )
    print(figures)
    assert not failures, f"{figures}\n" + "\n".join(failures[:20])
    assert not call_failures, f"{call_failures}\n{web_a.tail()}"
    assert answers[0].model == "chat-a"
    check_each_job_ran_once(world, [long_job.pk, *queued, *submitted], figures)
    assert Job.objects.get(pk=long_job.pk).attempts == 1
    # The proxy's fallback was needed: each web server was away for a while.
    assert all(client.went_to_other for client in clients), figures
    for web in world.servers[-2:]:
        assert httpx.get(f"{web.url}/api/version/", timeout=10).json() == {
            "version": next_release.version,
            "migration": next_release.migration,
        }
