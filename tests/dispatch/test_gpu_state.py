"""The GPU's row kept current with what its llama-swap says
(queueapp/dispatch/gpu_state.py): each change of the ready set is one log
line naming what loaded and what unloaded."""

from __future__ import annotations

import logging

import pytest

from queueapp import services
from queueapp.dispatch.gpu_state import GpuStateRecorder
from queueapp.models import Gpu

pytestmark = pytest.mark.django_db


def test_each_change_of_the_resident_set_is_one_info_line_naming_loads_and_unloads(caplog):
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9/gpu0")
    recorder = GpuStateRecorder(gpu.pk, gpu_name="gpu0")
    caplog.set_level(logging.INFO, logger="queueapp.dispatch.gpu_state")

    # What ran before gpusched looked is no change; the same reading again neither.
    recorder.running_read({"chat-small": "ready", "tts-kokoro": "ready"})
    recorder.running_read({"chat-small": "ready", "tts-kokoro": "ready"})
    # A load still starting changes nothing resident.
    recorder.running_read({"chat-small": "ready", "tts-kokoro": "ready", "image-xl": "starting"})
    recorder.running_read({"chat-small": "ready", "image-xl": "ready"})
    # Unreachable is not unloaded: back with the same set, nothing to say.
    recorder.record(reachable=False, error="connection refused")
    recorder.running_read({"chat-small": "ready", "image-xl": "ready"})
    recorder.running_read({"image-xl": "ready"})

    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "gpu0: llama-swap loaded image-xl, unloaded tts-kokoro"),
        ("INFO", "gpu0: llama-swap unloaded chat-small"),
    ]
    assert Gpu.objects.get(pk=gpu.pk).resident_models == ["image-xl"]
