"""A web server asked to stop (SIGTERM, as systemd and `make run` ask it)
closes its port at once and lets the requests in progress finish: a
front-door call it relays gets its answer, then the process ends
(gpusched/serve.py). Daphne, the real cluster and the simulator."""

import signal
import socket

import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from tests import factories
from tests.e2e.helpers import front_door_call_in_thread

pytestmark = [pytest.mark.e2e]

CALL_SECONDS = 3.0  # a chat still running at the stop


def refuses_connections(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_stopping_web_server_closes_its_port_and_finishes_the_call_it_relays(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    answers: list = []
    failures: list = []
    caller = front_door_call_in_thread(web, token, CALL_SECONDS, answers, failures)
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.RUNNING, front_door=True).exists(),
        message="the front-door call to run",
    )

    web.process.send_signal(signal.SIGTERM)
    # New connections are refused while the call goes on (another web server
    # behind the proxy takes them).
    wait_for(lambda: refuses_connections(web.port), message="the web server to close its port")
    assert web.is_running(), web.tail()
    caller.join(timeout=CALL_SECONDS + 30)

    assert not failures, f"{failures}\n{web.tail()}"
    assert answers and answers[0].model == "chat-a"
    returncode = wait_for(
        lambda: web.process.poll() is not None and (web.process.returncode,),
        message="the web server to end once its call has",
    )
    assert returncode == (0,), web.tail()
    assert "request(s) in progress may finish" in web.log_text()
