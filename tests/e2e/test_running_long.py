"""The holder watchdog in the running system: a job held past its limit is
reported once, by the process that watches it (the dispatcher for a REST
job, the web process that relays a front-door call), and the metric shows
the seconds held."""

import re
import threading

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobEvent, JobStatus, RunStats
from tests import factories
from tests.e2e.browser import chromium, log_in  # noqa: F401 (fixture)
from tests.e2e.helpers import PHONE, cards_that_scroll

pytestmark = [pytest.mark.e2e]
PATH = "/v1/chat/completions"


def watched(limit_seconds: float) -> None:
    """chat-a learned at 0.1 s a run, so the policy's minimum is the limit."""
    RunStats.objects.create(model="chat-a", path=PATH, warm_seconds=0.1, warm_samples=5)
    factories.policy(running_long_min_seconds=limit_seconds)


def gauge(web, name: str, gpu: str = "gpu0") -> float:
    text = httpx.get(f"{web.url}/metrics", timeout=10).text
    found = re.search(rf'^{name}{{gpu="{gpu}"}} (\S+)$', text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


def warnings_about(log: str, job_id: int) -> list[str]:
    return [line for line in log.splitlines() if f"held by job {job_id} " in line]


def reported(job_id: int) -> bool:
    return Job.objects.filter(pk=job_id, running_long_at__isnull=False).exists()


def test_a_job_held_past_its_limit_logs_one_warning_and_the_metric_shows_the_seconds(world):
    watched(limit_seconds=1)
    cluster = world.start_cluster()
    web = world.start_web()
    ann, _ = factories.member("ann-member", "pro")
    job = factories.job(ann, model="chat-a", seconds=6, label="held")

    wait_for(lambda: reported(job.pk), timeout=20, message="the watchdog's report")
    assert gauge(web, "gpusched_gpu_held_seconds") >= 1.0
    assert gauge(web, "gpusched_gpu_running_long") == 1
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED, timeout=30)

    (line,) = warnings_about(cluster.log_text(), job.pk)  # once, though swept again and again
    assert " WARNING " in line
    assert re.search(
        rf"running long: gpu0 held by job {job.pk} \(member ann-member, model chat-a\) "
        r"for \d+\.\d s, past its limit of 1\.0 s \(3 x its estimate of 0\.1 s",
        line,
    ), line
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RUNNING_LONG).count() == 1
    assert gauge(web, "gpusched_gpu_held_seconds") == 0
    assert gauge(web, "gpusched_gpu_running_long") == 0


def test_a_front_door_job_is_watched_by_the_web_process_that_relays_it(world):
    watched(limit_seconds=3)
    cluster = world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    answers: list[httpx.Response] = []

    def call() -> None:
        answers.append(
            httpx.post(
                f"{web.url}{PATH}",
                json=factories.chat_body("chat-a", 8),
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            )
        )

    caller = threading.Thread(target=call)
    caller.start()
    try:
        job = wait_for(
            lambda: Job.objects.filter(front_door=True, status=JobStatus.RUNNING).first(),
            message="the front-door job to run",
        )
        # No dispatcher from here on: only the web process can see the job.
        cluster.kill()
        wait_for(lambda: reported(job.pk), timeout=20, message="the web process's report")
    finally:
        caller.join(timeout=60)
    assert answers and answers[0].status_code == 200, answers
    (line,) = warnings_about(web.log_text(), job.pk)
    assert " WARNING " in line and "gpu0" in line and "ann-member" in line and "chat-a" in line
    assert warnings_about(cluster.log_text(), job.pk) == []


def test_the_gpu_card_says_running_long_and_still_fits_a_phone(world, chromium):  # noqa: F811
    watched(limit_seconds=1)
    world.start_cluster()
    web = world.start_web()
    ann, token = factories.member("ann-member", "pro")
    job = factories.job(ann, model="chat-a", seconds=6, label="held")
    page = chromium.new_page(viewport=PHONE)
    try:
        log_in(page, web.url, token, "/")
        page.wait_for_selector(".gpu-card .running-long", timeout=20_000)
        assert reported(job.pk)
        line = page.inner_text(".gpu-card[data-gpu='gpu0'] .running-long")
        assert line == f"running long: #{job.pk}", line
        assert cards_that_scroll(page) == []
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a phone"
        # The job's end takes the line away with it.
        page.wait_for_selector(".gpu-card .running-long", state="detached", timeout=20_000)
    finally:
        page.close()
