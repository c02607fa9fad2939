"""The chain runner against an in-memory gpusched behind httpx.MockTransport."""

import io
import json
import re
import time

import httpx
import pytest
from rich.console import Console

from gpusched_client import Client, chain
from gpusched_client.chain import STATE_FILE, run_chain

CHAIN = "film"


class FakeGpusched:
    """The job and chain answers the runner uses; each job's next states are scripted."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict] = {}
        self.upcoming: dict[int, list[str]] = {}
        self.requests: list[str] = []
        self.crowd = 0  # the member's newer jobs of other work, as for a busy member
        self.on_poll = lambda job: None
        self.submitted_then: tuple[str, ...] = ("succeeded",)  # states of a submitted job
        self.next_id = 1

    def add(self, *, index: int, status: str, then: tuple[str, ...] = ()) -> dict:
        job = {
            "id": self.next_id,
            "status": status,
            "chain": {"id": CHAIN, "index": index, "total": 2},
            "result": {"body": {"unit": index}},
            "error": None,
        }
        self.jobs[job["id"]] = job
        self.upcoming[job["id"]] = list(then)
        self.next_id += 1
        return job

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        path = request.url.path
        if request.method == "POST" and path == "/api/jobs/":
            payload = json.loads(request.content)
            index = payload["chain"]["index"]
            job = self.add(index=index, status="queued", then=self.submitted_then)
            return httpx.Response(201, json=job)
        if match := re.fullmatch(r"/api/jobs/(\d+)/", path):
            job = self.jobs[int(match[1])]
            if self.upcoming[job["id"]]:
                job["status"] = self.upcoming[job["id"]].pop(0)
            self.on_poll(job)
            return httpx.Response(200, json=job)
        if path == "/api/jobs/":
            wanted = request.url.params["status"]
            crowd = [{"id": 10_000 + n, "status": wanted, "chain": None} for n in range(self.crowd)]
            mine = [job for job in self.jobs.values() if job["status"] == wanted]
            listed = crowd + sorted(mine, key=lambda job: -job["id"])
            return httpx.Response(200, json={"results": listed[:100]})
        if path == f"/api/chains/{CHAIN}/":
            units = list(self.jobs.values())
            if not units:
                return httpx.Response(404, json={"detail": "chain not found"})
            if request.method == "DELETE":
                queued = [job for job in units if job["status"] == "queued"]
                for job in queued:
                    job["status"] = "cancelled"
                return httpx.Response(200, json={"id": CHAIN, "cancelled": len(queued)})
            count = {s: sum(job["status"] == s for job in units) for s in ("queued", "running")}
            done = sum(job["status"] == "succeeded" for job in units)
            return httpx.Response(200, json={"id": CHAIN, **count, "done": done})
        return httpx.Response(404, json={"detail": f"no route {path}"})


@pytest.fixture
def server():
    return FakeGpusched()


@pytest.fixture
def now(monkeypatch):
    """The runner's wall clock, moved by the test."""
    clock = [1_000_000.0]
    monkeypatch.setattr(chain, "_clock", lambda: clock[0])
    return clock


def run(server, tmp_path, console=None, units=2):
    units_file = tmp_path / f"{CHAIN}.jsonl"
    units_file.write_text("\n".join(json.dumps({"model": "m", "n": i}) for i in range(units)))
    with Client("http://gpusched", "t", transport=httpx.MockTransport(server.handler)) as client:
        return run_chain(
            client,
            console=console or Console(file=io.StringIO()),
            units_file=str(units_file),
            job_path="/v1/completions",
            priority="batch",
            out_dir=str(tmp_path / "out"),
            chain_id=None,
            retries=0,
        )


def write_state(tmp_path, **state):
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / STATE_FILE).write_text(json.dumps({"chain": CHAIN, **state}))


def test_elapsed_moves_on_a_terminal_while_a_unit_runs(server, tmp_path, now, monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    minutes = iter(range(1, 10))

    def poll(job):
        if job["status"] != "running":
            return
        # Four minutes into the unit, the redrawn line says so before the unit ends.
        now[0] += 60
        shown = f"0/1 · {next(minutes)} m 00 s elapsed"
        deadline = time.monotonic() + 10
        while shown not in screen.getvalue():
            assert time.monotonic() < deadline, f"the line never showed {shown!r}"
            time.sleep(0.01)  # for the next redraw, up to the deadline

    server.on_poll = poll
    server.submitted_then = ("running",) * 4 + ("succeeded",)
    assert run(server, tmp_path, console=console, units=1) == 0
    assert "1/1 · 4 m 00 s elapsed" in screen.getvalue()


def test_a_resumed_run_counts_elapsed_from_the_first_units_submission(
    server, tmp_path, now, capsys
):
    write_state(tmp_path, started_at=now[0] - 3600, jobs={}, submitting=None)
    (tmp_path / "out" / "unit-0000.json").write_text("{}")
    assert run(server, tmp_path) == 0
    assert "done: 2/2 · 1 h 00 m elapsed" in capsys.readouterr().out


def test_a_fresh_run_records_the_first_submission_for_later_runs(server, tmp_path, now):
    assert run(server, tmp_path) == 0
    state = json.loads((tmp_path / "out" / STATE_FILE).read_text())
    assert state["started_at"] == now[0]
    assert state["jobs"] == {"0": 1, "1": 2}


def test_resume_reuses_the_recorded_unit_of_a_busy_member(server, tmp_path, now):
    server.crowd = 100  # the unit is not among the member's newest 100 jobs
    unit = server.add(index=0, status="running", then=("succeeded",))
    write_state(tmp_path, started_at=now[0], jobs={"0": unit["id"]}, submitting=None)
    assert run(server, tmp_path) == 0
    posted = [r for r in server.requests if r.startswith("POST")]
    assert len(posted) == 1  # unit 1 only: unit 0 was not submitted again
    assert json.loads((tmp_path / "out" / "unit-0000.json").read_text()) == {"unit": 0}


def test_an_unrecorded_submission_is_found_through_the_chain(server, tmp_path, now):
    unit = server.add(index=0, status="succeeded")  # the run stopped before recording it
    write_state(tmp_path, started_at=now[0], jobs={}, submitting=0)
    assert run(server, tmp_path) == 0
    assert f"GET /api/jobs/{unit['id']}/" in server.requests
    assert len([r for r in server.requests if r.startswith("POST")]) == 1


def test_an_unrecorded_queued_unit_past_the_newest_100_is_cancelled_not_doubled(
    server, tmp_path, now
):
    server.crowd = 100
    unit = server.add(index=0, status="queued")
    write_state(tmp_path, started_at=now[0], jobs={}, submitting=0)
    assert run(server, tmp_path) == 0
    assert unit["status"] == "cancelled"
    assert f"DELETE /api/chains/{CHAIN}/" in server.requests
    in_flight = [job for job in server.jobs.values() if job["status"] in ("queued", "running")]
    assert not in_flight
