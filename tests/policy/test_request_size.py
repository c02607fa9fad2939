import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueapp.policy.request_size import (
    CHARACTERS_PER_TOKEN,
    IMAGE_PROMPT_TOKENS,
    MAX_PARTS,
    MAX_SIZE,
    MIN_SIZE,
    PREFILL_RATIO,
    RequestSize,
    request_size,
)

PROMPT_3200 = "a" * 3200
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 90000}}

# path, body, expected value, kind, text
SIZED = [
    # Images: count × megapixels × steps.
    (
        "/v1/images/generations",
        {"model": "image-xl", "prompt": "a fox", "n": 2, "size": "1024x1024", "steps": 30},
        2 * 1.048576 * 30,
        "image",
        "2 images, 1024×1024, 30 steps",
    ),
    (
        "/v1/images/generations",
        {"model": "image-xl", "prompt": "a fox", "size": "512x768"},
        0.393216 * 20,
        "image",
        "1 image, 512×768, 20 steps (default)",
    ),
    (
        "/v1/images/edits",
        {"model": "image-xl", "prompt": "a fox", "num_inference_steps": 8},
        1.048576 * 8,
        "image",
        "1 image, 1024×1024 (default), 8 steps",
    ),
    (
        "/sdapi/v1/txt2img",
        {"prompt": "a fox", "width": 768, "height": 512, "steps": 25, "batch_size": 2, "n_iter": 3},
        6 * 0.393216 * 25,
        "image",
        "6 images, 768×512, 25 steps",
    ),
    (
        "/sdapi/v1/img2img",
        {"prompt": "a fox", "init_images": ["AAAA"], "steps": 4},
        0.262144 * 4,
        "image",
        "1 image, 512×512 (default), 4 steps",
    ),
    # Video on an image path: frames × steps × megapixels.
    (
        "/v1/images/generations",
        {
            "model": "video-wan",
            "prompt": "a fox",
            "num_frames": 362,
            "steps": 30,
            "size": "1280x720",
        },
        362 * 30 * 0.9216,
        "video",
        "362 frames, 30 steps, 1280×720",
    ),
    (
        "/sdapi/v1/txt2img",
        {"prompt": "a fox", "video_frames": 33, "sample_steps": 20, "width": 832, "height": 480},
        33 * 20 * 0.39936,
        "video",
        "33 frames, 20 steps, 832×480",
    ),
    (
        "/v1/images/generations",
        {
            "model": "wan",
            "prompt": "a fox",
            "video_length": 129,
            "infer_steps": 50,
            "size": "1280*720",
        },
        129 * 50 * 0.9216,
        "video",
        "129 frames, 50 steps, 1280×720",
    ),
    (
        "/v1/images/generations",
        {"model": "wan", "prompt": "a fox", "frames": 60},
        60 * 50 * 0.39936,
        "video",
        "60 frames, 50 steps (default), 832×480 (default)",
    ),
    (
        "/v1/images/generations",
        {"model": "ltx", "prompt": "a fox", "seconds": 5, "fps": 24, "resolution": "720p"},
        120 * 50 * 0.9216,
        "video",
        "120 frames (5 s at 24 fps), 50 steps (default), 1280×720",
    ),
    (
        "/v1/videos",
        {"model": "sora-2", "prompt": "a fox", "seconds": "8", "size": "720x1280"},
        128 * 50 * 0.9216,
        "video",
        "128 frames (8 s at 16 fps), 50 steps (default), 720×1280",
    ),
    (
        "/v1/videos",
        {"model": "sora-2", "prompt": "a fox"},
        81 * 50 * 0.39936,
        "video",
        "81 frames (default), 50 steps (default), 832×480 (default)",
    ),
    # Chat: output tokens plus prompt tokens over the prefill ratio.
    (
        "/v1/chat/completions",
        {
            "model": "chat",
            "messages": [{"role": "user", "content": PROMPT_3200}],
            "max_tokens": 1024,
        },
        1024 + 3200 / CHARACTERS_PER_TOKEN / PREFILL_RATIO,
        "tokens",
        "1,024 max tokens, a 3,200-character prompt",
    ),
    (
        "/v1/chat/completions",
        {
            "model": "chat",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "What is this?"}, IMAGE_PART],
                },
            ],
            "max_completion_tokens": 300,
            "max_tokens": 9999,
        },
        300 + (22 / CHARACTERS_PER_TOKEN + IMAGE_PROMPT_TOKENS) / PREFILL_RATIO,
        "tokens",
        "300 max tokens, a 22-character prompt and 1 image",
    ),
    (
        "/v1/completions",
        {"model": "chat", "prompt": ["abcd", "efgh"], "max_tokens": 16},
        16 + 8 / CHARACTERS_PER_TOKEN / PREFILL_RATIO,
        "tokens",
        "16 max tokens, a 8-character prompt",
    ),
    (
        "/v1/responses",
        {"model": "chat", "input": "abcd", "instructions": "efgh", "max_output_tokens": 50},
        50 + 8 / CHARACTERS_PER_TOKEN / PREFILL_RATIO,
        "tokens",
        "50 max tokens, a 8-character prompt",
    ),
    # Speech, embeddings, reranking: characters.
    (
        "/v1/audio/speech",
        {"model": "tts", "input": "Hello there."},
        12,
        "characters",
        "12 characters",
    ),
    (
        "/v1/embeddings",
        {"model": "embed", "input": ["one", "three"]},
        8,
        "characters",
        "8 characters in 2 inputs",
    ),
    (
        "/v1/embeddings",
        {"model": "embed", "input": [101, 2023, 102]},
        3 * CHARACTERS_PER_TOKEN,
        "characters",
        "12 characters in 1 input",
    ),
    (
        "/v1/rerank",
        {"model": "rerank", "query": "fox", "documents": ["a fox", {"text": "a dog"}]},
        13,
        "characters",
        "13 characters in 3 inputs",
    ),
]


@pytest.mark.parametrize(("path", "body", "value", "kind", "text"), SIZED)
def test_a_real_looking_body_has_the_size_its_fields_say(path, body, value, kind, text):
    size = request_size(path, body)
    assert size == RequestSize(value=pytest.approx(value), kind=kind, text=text)


def test_a_transcription_is_as_big_as_its_upload():
    size = request_size("/v1/audio/transcriptions", None, body_bytes=3_200_000)
    assert size == RequestSize(value=3_200_000.0, kind="bytes", text="a 3.2 MB upload")
    assert request_size("/v1/audio/translations", {"x": 1}, body_bytes=10) is not None
    assert request_size("/v1/audio/transcriptions", None) is None


def test_a_360_frame_video_is_six_times_a_60_frame_one():
    def shot(frames: int) -> RequestSize | None:
        body = {"model": "video-wan", "prompt": "p", "num_frames": frames, "steps": 20}
        return request_size("/v1/images/generations", body)

    long, short = shot(360), shot(60)
    assert long and short and long.value == pytest.approx(6 * short.value)


NO_SIZE = [
    ("/v1/images/generations", {"model": "image-xl", "prompt": "a fox"}),
    ("/sdapi/v1/txt2img", {"prompt": "a fox"}),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "chat", "prompt": "hi"}),
    ("/v1/audio/speech", {"model": "tts", "input": ""}),
    ("/v1/embeddings", {"model": "embed"}),
    ("/upstream/chat/", None),
    ("/v1/models", {"model": "chat"}),
    ("/v1/chat/completions", "not a dict"),
    ("/v1/chat/completions", ["max_tokens", 5]),
]


@pytest.mark.parametrize(("path", "body"), NO_SIZE)
def test_a_body_that_says_nothing_of_its_size_has_none(path, body):
    assert request_size(path, body) is None


GARBAGE = [
    # Each wrong field is ignored: the default stands in, or there is no size.
    ("/v1/images/generations", {"n": "2", "size": "huge", "steps": True}, None),
    ("/v1/images/generations", {"n": -3, "steps": float("nan")}, None),
    ("/v1/images/generations", {"n": 10**400, "steps": 1e308, "size": "99999999x1"}, None),
    (
        "/v1/images/generations",
        {"n": 2, "steps": "thirty"},
        "2 images, 1024×1024 (default), 20 steps (default)",
    ),
    (
        "/sdapi/v1/txt2img",
        {"width": float("inf"), "height": 512, "steps": 0, "batch_size": 1},
        "1 image, 512×512 (default), 20 steps (default)",
    ),
    ("/v1/images/generations", {"num_frames": [60], "size": {"w": 1}}, None),
    (
        "/v1/images/generations",
        {"num_frames": 0.5, "steps": 10},
        "81 frames (default), 10 steps, 832×480 (default)",
    ),
    (
        "/v1/videos",
        {"seconds": "1e9", "fps": -1, "resolution": ["a", "b"]},
        "81 frames (default), 50 steps (default), 832×480 (default)",
    ),
    ("/v1/chat/completions", {"max_tokens": "1024", "messages": "hi"}, None),
    (
        "/v1/chat/completions",
        {"max_tokens": 64, "messages": [{"content": {"text": 5}}, 7, None]},
        "64 max tokens, a 0-character prompt",
    ),
    (
        "/v1/chat/completions",
        {"max_tokens": 64, "messages": {"role": "user"}},
        "64 max tokens, a 0-character prompt",
    ),
    ("/v1/chat/completions", {"max_tokens": -1, "messages": []}, None),
    (
        "/v1/embeddings",
        {"input": [[1, 2], "ab", None, {"text": 3}, [True]]},
        "10 characters in 2 inputs",
    ),
    ("/v1/audio/speech", {"input": ["hello"]}, None),
    ("/v1/audio/transcriptions", {}, None),
]


@pytest.mark.parametrize(("path", "body", "text"), GARBAGE)
def test_garbage_fields_are_ignored_one_by_one(path, body, text):
    size = request_size(path, body)
    assert (size and size.text) == text
    if size is not None:
        assert math.isfinite(size.value) and MIN_SIZE <= size.value <= MAX_SIZE


def test_an_upload_size_that_is_not_a_positive_number_is_no_size():
    for body_bytes in (0, -5, True, 2**200, "12"):
        assert request_size("/v1/audio/transcriptions", None, body_bytes=body_bytes) is None


def test_the_largest_request_is_clamped_to_the_range():
    body = {"n": 1000, "width": 65536, "height": 65536, "steps": 10000, "num_frames": 100000}
    size = request_size("/v1/images/generations", body)
    assert size is not None and size.value == MAX_SIZE


def test_a_body_with_a_million_messages_reads_only_a_bounded_number_of_parts():
    messages = [{"role": "user", "content": "abcd"}] * 1_000_000
    size = request_size("/v1/chat/completions", {"max_tokens": 1, "messages": messages})
    assert size is not None
    assert size.value == pytest.approx(1 + MAX_PARTS * 4 / CHARACTERS_PER_TOKEN / PREFILL_RATIO)


def test_deep_nesting_is_never_walked():
    deep: object = "x"
    for _ in range(100_000):
        deep = [deep]
    body = {"max_tokens": 5, "messages": [{"content": deep}], "input": deep, "prompt": deep}
    for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/completions"):
        request_size(path, body)


PATHS = [path for path, *_ in SIZED] + ["/v1/audio/transcriptions", "/v1/rerank", "/x"]
SIZE_FIELDS = [
    "n",
    "size",
    "steps",
    "num_inference_steps",
    "width",
    "height",
    "batch_size",
    "n_iter",
    "num_frames",
    "frames",
    "video_length",
    "seconds",
    "fps",
    "resolution",
    "max_tokens",
    "max_completion_tokens",
    "messages",
    "prompt",
    "input",
    "query",
    "documents",
    "content",
    "text",
    "type",
]
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["1024x1024", "1280*720", "720p", "8", "image_url", "0x0"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(SIZE_FIELDS) | st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(PATHS),
    st.dictionaries(st.sampled_from(SIZE_FIELDS), _JSON, max_size=8) | _JSON,
    st.none() | st.integers() | st.floats(),
)
def test_any_json_body_gives_no_size_or_a_finite_one_in_range(path, body, body_bytes):
    size = request_size(path, body, body_bytes=body_bytes)
    if size is not None:
        assert math.isfinite(size.value) and MIN_SIZE <= size.value <= MAX_SIZE
        assert size.kind in ("image", "video", "tokens", "characters", "bytes")
        assert size.text
