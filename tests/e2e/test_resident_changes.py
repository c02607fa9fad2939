"""One log line and one row change per real load or unload, with real
processes: the simulator serving studio.yaml, a dispatcher following its
events, re-reading `/running` every 3 s, and running an image that loads
for a second and then runs.

Before, the dispatcher took the model of its jobs in flight for a ready
one while it still loaded: the log said "loaded image-xl", then the events
said `starting` ("unloaded image-xl"), then "loaded" again, within 50 ms.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from gpusched.stack import Stack, wait_for
from queueapp.models import Gpu
from tests import factories
from tests.database import database_url
from tests.e2e.helpers import ended

pytestmark = [pytest.mark.e2e]

SWAP_SECONDS = 1.0
RESIDENT_LINE = re.compile(r"gpu0: llama-swap (.*)$", re.MULTILINE)


@pytest.fixture
def studio(transactional_db, tmp_path) -> Iterator[Stack]:
    factories.policy()
    factories.tiers()
    with Stack(database_url=database_url(), log_dir=tmp_path) as stack:
        stack.start_simulator(models={}, swap_seconds=SWAP_SECONDS, config=factories.STUDIO_CONFIG)
        stack.start_cluster(LLAMA_SWAP_CONFIG=str(factories.STUDIO_CONFIG))
        wait_for(
            lambda: Gpu.objects.filter(routing__isnull=False).exists(),
            message="the dispatcher to read llama-swap's config",
        )
        yield stack


def test_a_load_then_a_run_is_one_loaded_line_and_an_unload_one_unloaded_line(studio):
    simulator, (cluster,) = studio.simulators[0], studio.clusters
    ann, _ = factories.member("ann", "pro")
    # The row, sampled through the load: image-xl never ready while it starts.
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    done = threading.Event()

    def sample() -> None:
        from django.db import connection

        try:
            while not done.wait(0.02):
                row = Gpu.objects.get(name="gpu0")
                state = (tuple(row.resident_models), tuple(row.loading_models))
                if not seen or seen[-1] != state:
                    seen.append(state)
        finally:
            connection.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # Its run outlasts a re-read of /running (every 3 s, REREAD_SECONDS).
        image = factories.job(ann, model="image-xl", seconds=4.0, label="image")
        finished = ended(image.pk)
    finally:
        done.set()
        sampler.join()
    assert finished.status == "succeeded", finished.error

    lines = RESIDENT_LINE.findall(cluster.log_text())
    assert lines == ["loaded image-xl"], cluster.log_text()[-3000:]
    # Starting, then ready, then nothing else: no flap in what others read.
    changes = [state for state in seen if state != ((), ())]
    assert changes[:2] == [((), ("image-xl",)), (("image-xl",), ())], seen
    assert all(state == (("image-xl",), ()) for state in changes[1:]), seen

    # An unload from llama-swap's own UI: one line, the row follows.
    assert httpx.post(f"{simulator.url}/api/models/unload/image-xl", timeout=10).status_code == 200
    wait_for(
        lambda: (
            RESIDENT_LINE.findall(cluster.log_text()) == ["loaded image-xl", "unloaded image-xl"]
        ),
        message="one unloaded line",
    )
    wait_for(
        lambda: Gpu.objects.get(name="gpu0").resident_models == [],
        message="the row to show nothing loaded",
    )
