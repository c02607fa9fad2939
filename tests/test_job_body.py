"""The request limits both doors share (queueapp/job_body.py), and the
columns sized from them."""

from __future__ import annotations

import pytest

from queueapp.api.inputs import ChainInput, JobSubmitInput, PreloadInput
from queueapp.job_body import (
    MAX_JOB_PATH,
    MAX_MODEL_NAME,
    UPLOAD_PATHS,
    front_door_body_limit,
    model_name_problem,
    stored_summary,
)
from queueapp.models import Job, RunStats
from queueapp.upstream.client import FRONT_DOOR_PATHS, preload_path


def test_every_valid_model_name_fits_the_columns_as_a_model_and_as_a_preload_path():
    longest = "\U0001f916" * MAX_MODEL_NAME  # four bytes of UTF-8 each
    assert model_name_problem(longest) is None
    assert model_name_problem(longest + "x") == f"longer than {MAX_MODEL_NAME} characters"
    assert len(preload_path(longest)) == MAX_JOB_PATH
    for table in (Job, RunStats):
        assert table._meta.get_field("model").max_length == MAX_MODEL_NAME
        assert table._meta.get_field("path").max_length == MAX_JOB_PATH


def test_each_front_door_path_has_a_limit_and_the_setting_that_raises_it(settings):
    settings.GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES = 111
    settings.GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES = 222
    for path in FRONT_DOOR_PATHS:
        limit = front_door_body_limit(path)
        upload = path in UPLOAD_PATHS
        assert limit.bytes == (222 if upload else 111), path
        assert limit.setting in limit.refusal(limit.bytes + 1, path)
    assert "/v1/audio/transcriptions" in UPLOAD_PATHS


@pytest.mark.parametrize("max_chars", [1, 5, 1000])
def test_the_stored_summary_keeps_the_shape_and_notes_long_strings(max_chars):
    image = "data:image/png;base64," + "A" * 5000
    body = {
        "model": "vision",
        "stream": True,
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}
        ],
    }
    summary = stored_summary(body, max_chars=max_chars)
    assert summary["stream"] is True and summary["max_tokens"] == 64
    url = summary["messages"][0]["content"][0]["image_url"]["url"]
    assert url == f"[{len(image)} characters, not stored]"
    assert summary["model"] == ("vision" if max_chars >= 6 else "[6 characters, not stored]")
    assert body["messages"][0]["content"][0]["image_url"]["url"] == image  # not changed


def test_each_rest_input_is_no_longer_than_the_column_it_fills():
    # (the input's field, the column it is stored in)
    fields = [
        (JobSubmitInput().fields["callback_url"], Job._meta.get_field("callback_url")),
        (ChainInput().fields["id"], Job._meta.get_field("chain_id")),
        (PreloadInput().fields["gpu"], Job._meta.get_field("pinned_gpu")),
        (PreloadInput().fields["callback_url"], Job._meta.get_field("callback_url")),
    ]
    for field, column in fields:
        assert field.max_length == column.max_length, (field, column)
