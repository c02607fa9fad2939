"""An upstream that answers garbage: each job fails with a readable error and
the dispatcher moves on to the next."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import Job, JobStatus
from tests import factories

pytestmark = [pytest.mark.e2e]


class BrokenLlamaSwap(BaseHTTPRequestHandler):
    """`/running` like llama-swap; POST answers as the body's `mode` asks."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def log_message(self, *args):
        pass

    def _answer(self, status, body, content_type="application/json", length=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(200, b'{"running": []}')

    def do_POST(self):
        mode = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["mode"]
        if mode == "invalid-json":
            self._answer(200, b'{"choices": [ this is not json')
        elif mode == "cut":
            self._answer(200, b'{"partial": ', length=4096)  # promises more, then closes
            self.connection.shutdown(socket.SHUT_RDWR)
        elif mode == "stall":
            self.release.wait(30)  # far beyond the job timeout
        else:
            self._answer(200, b'{"ok": true}')


@pytest.fixture
def broken_upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), BrokenLlamaSwap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    BrokenLlamaSwap.release.set()
    server.shutdown()
    server.server_close()


def test_garbage_answers_fail_their_jobs_readably_and_the_queue_moves_on(world, broken_upstream):
    world.start_cluster(upstream_url=broken_upstream, GPUSCHED_JOB_TIMEOUT="1.5")
    member, _ = factories.member("ann-member", "free")
    jobs = {}
    for mode in ["invalid-json", "cut", "stall", "fine"]:
        jobs[mode] = services.job_submit(
            member=member,
            path="/v1/chat/completions",
            body={"model": "m", "mode": mode},
            model="m",
            priority_header=None,
        )
    wait_for(
        lambda: not Job.objects.filter(status__in=["queued", "running"]).exists(),
        timeout=20,  # the queue moves on: the stalled job ends at its 1.5 s timeout
        message="every job to end",
    )
    ended = {mode: Job.objects.get(pk=job.pk) for mode, job in jobs.items()}
    assert ended["invalid-json"].status == JobStatus.FAILED
    assert "not valid JSON" in ended["invalid-json"].error
    assert ended["cut"].status == JobStatus.FAILED
    assert "broke" in ended["cut"].error
    assert ended["stall"].status == JobStatus.FAILED
    assert "did not answer within 1.5 s" in ended["stall"].error
    assert ended["fine"].status == JobStatus.SUCCEEDED
