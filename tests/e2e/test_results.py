"""A job's result and its error come back from the simulator through the real
cluster: kept in the jobs table, or, when large, in file storage and
downloaded by its owner alone."""

import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from tests import factories

pytestmark = [pytest.mark.e2e]


def test_results_and_errors_come_back_from_the_simulator(world, api):
    world.start_cluster()
    member, token = factories.member("ann", "free")
    ok = factories.job(member, model="chat-a", label="ok")
    broken = factories.job(member, model="chat-a", label="broken", status=500)
    wait_for(
        lambda: Job.objects.filter(status__in=[JobStatus.SUCCEEDED, JobStatus.FAILED]).count() == 2,
        message="both jobs to finish",
    )
    # llama-swap got the body exactly as submitted.
    assert world.served()[0]["body"] == ok.body
    answer = api.as_member(token).get(f"/api/jobs/{ok.pk}/").json()
    assert answer["status"] == "succeeded"
    assert answer["result"]["status_code"] == 200
    assert answer["result"]["body"]["object"] == "chat.completion"
    assert answer["started_at"] and answer["finished_at"]
    assert answer["score"]["as_of"] == "dispatch"
    failed = api.as_member(token).get(f"/api/jobs/{broken.pk}/").json()
    assert failed["status"] == "failed"
    assert failed["result"]["status_code"] == 500
    assert failed["result"]["body"]["src"] == "llama-swap"
    assert failed["error"].startswith("llama-swap answered 500")


def test_large_results_go_to_file_storage_and_download(world, api, settings):
    settings.MEDIA_ROOT = world.media_root  # where the cluster stores results
    world.start_cluster()
    member, token = factories.member("ann", "free")
    # Over the 256 KiB the jobs table keeps inline.
    big = factories.job(member, model="chat-a", label="big", size_bytes=400_000)
    wait_for(
        lambda: Job.objects.get(pk=big.pk).status == JobStatus.SUCCEEDED,
        message="the big job to finish",
    )
    stored = Job.objects.get(pk=big.pk)
    assert stored.result_body is None and stored.result_file
    answer = api.as_member(token).get(f"/api/jobs/{big.pk}/").json()
    assert answer["result"]["url"].endswith(f"/api/jobs/{big.pk}/result/")
    download = api.as_member(token).get(f"/api/jobs/{big.pk}/result/")
    assert download.status_code == 200
    content = b"".join(download.streaming_content)
    assert len(content) >= 400_000
    assert download["Content-Type"].startswith("application/json")
    _, other = factories.member("bob", "free")
    assert api.as_member(other).get(f"/api/jobs/{big.pk}/result/").status_code == 404
