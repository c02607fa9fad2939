"""A web server asked to stop (SIGTERM, as systemd and `make run` ask it)
closes its port at once and lets the requests in progress finish: a
front-door call it relays gets its answer, then the process ends
(gpusched/serve.py). Daphne, the real cluster and the simulator."""

import http.client
import signal
import socket
import threading

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from tests import factories
from tests.e2e.helpers import front_door_call_in_thread

pytestmark = [pytest.mark.e2e]

CALL_SECONDS = 3.0  # a chat still running at the stop
# A chat that holds the stop open while a kept connection is used.
HOLDING_CALL_SECONDS = 6.0
# Web servers stopped under clients that never pause, how many clients, and
# the stop's bound there (reached only when the drain never ends).
STOPS_UNDER_TRAFFIC = 3
TRAFFIC_CLIENTS = 4
TRAFFIC_STOP_SECONDS = 10
EXIT_SECONDS = 60  # how long a stopped web server has to end once its call has


def refuses_connections(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def call_running_through(web, seconds: float) -> tuple[threading.Thread, list, list]:
    """A member's front-door call through `web`, once it runs on the GPU: its
    thread, and the lists its answer or its exception go to."""
    _, token = factories.member("ann-member", "pro")
    answers: list = []
    failures: list = []
    caller = front_door_call_in_thread(web, token, seconds, answers, failures)
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.RUNNING, front_door=True).exists(),
        message="the front-door call to run",
    )
    return caller, answers, failures


def test_a_stopping_web_server_closes_its_port_and_finishes_the_call_it_relays(world):
    world.start_cluster()
    web = world.start_web()
    caller, answers, failures = call_running_through(web, CALL_SECONDS)

    web.process.send_signal(signal.SIGTERM)
    # New connections are refused while the call goes on (another web server
    # behind the proxy takes them).
    wait_for(lambda: refuses_connections(web.port), message="the web server to close its port")
    assert web.is_running(), web.tail()
    caller.join(timeout=CALL_SECONDS + 30)

    assert not failures, f"{failures}\n{web.tail()}"
    assert answers and answers[0].model == "chat-a"
    assert web.process.wait(timeout=EXIT_SECONDS) == 0, web.tail()
    assert "request(s) in progress may finish" in web.log_text()


def kept_connection_get(connection: http.client.HTTPConnection, path: str) -> tuple[int, str]:
    """A GET on a connection kept open: its status and its Connection header."""
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    return response.status, response.getheader("Connection", "")


def test_a_kept_connection_is_answered_with_a_close_during_the_stop_and_not_cut(world):
    """A client that keeps its connection open (nginx's `keepalive`) may send
    a request on it just as the stop begins: it gets its answer, told to
    close, never a reset (which nginx would not retry for a POST)."""
    world.start_cluster()
    web = world.start_web()
    kept = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30)
    assert kept_connection_get(kept, "/api/version/") == (200, "")  # kept open
    caller, answers, failures = call_running_through(web, HOLDING_CALL_SECONDS)

    web.process.send_signal(signal.SIGTERM)
    wait_for(lambda: refuses_connections(web.port), message="the web server to close its port")
    assert not answers, "the call that holds the stop open ended too soon for this test"
    assert kept_connection_get(kept, "/api/version/") == (200, "close")
    caller.join(timeout=HOLDING_CALL_SECONDS + 30)

    assert not failures, f"{failures}\n{web.tail()}"
    assert web.process.wait(timeout=EXIT_SECONDS) == 0, web.tail()


class KeptConnectionClient(threading.Thread):
    """A client that sends GETs on a kept connection, one after another, until
    it is refused (its web server has closed its port) or told to stop; a
    request that breaks after its connection was made is recorded."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.sent = 0
        self.broken: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stopping.is_set():
                try:
                    client.get(f"{self.url}/api/version/")
                    self.sent += 1
                except httpx.ConnectError:
                    return  # a proxy would try the other web server
                except httpx.TransportError as exc:
                    self.broken.append(repr(exc))
                    return


def stop_under_traffic(world) -> None:
    """One web server started, put under clients that never pause, and
    stopped: it exits 0 before its bound and breaks no request."""
    web = world.start_web(GPUSCHED_STOP_SECONDS=str(TRAFFIC_STOP_SECONDS))
    clients = [KeptConnectionClient(web.url) for _ in range(TRAFFIC_CLIENTS)]
    for client in clients:
        client.start()
    wait_for(lambda: all(client.sent for client in clients), message="every client served")

    web.process.send_signal(signal.SIGTERM)
    returncode = web.process.wait(timeout=TRAFFIC_STOP_SECONDS * 3)
    for client in clients:
        client.stopping.set()
        client.join(timeout=30)
    assert returncode == 0, web.tail()
    assert [broken for client in clients for broken in client.broken] == []
    assert "still in progress" not in web.log_text(), web.tail()


def test_a_web_server_under_keep_alive_traffic_stops_and_breaks_no_request(world):
    """Clients that never pause keep a request in progress at almost every
    moment: the stop must still end (they are told to close, then refused),
    well before GPUSCHED_STOP_SECONDS, and none of their requests breaks."""
    for _ in range(STOPS_UNDER_TRAFFIC):
        stop_under_traffic(world)
