"""GET /api/models/ and PATCH /api/models/{name}/: each model's `parallel`
(jobs of it one GPU runs at once), set by staff; and its running jobs on
/metrics."""

import pytest

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.models import ModelSetting, OnCallerGone
from queueapp.policy.routing import routing_parts
from tests import factories
from tests.api.helpers import scrape, value

pytestmark = pytest.mark.django_db


def registered(name: str, serves: list[str]):
    gpu = services.gpu_register(name=name, url=f"http://{name}.lan:8080")
    services.gpu_state_record(
        gpu_id=gpu.pk, reachable=True, resident_model=serves[0], served_models=serves
    )
    return gpu


def test_the_models_are_listed_with_their_parallel_and_gpus(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["chat"])
    _, token = factories.member("ann", "pro")
    listed = api.as_member(token).get("/api/models/")
    assert listed.status_code == 200
    assert listed.json() == [
        {
            "name": "chat",
            "parallel": 1,
            "parallel_source": "default",
            "operator_parallel": None,
            "on_caller_gone": None,
            "typical_seconds": None,
            "gpus": ["gpu0", "gpu1"],
        },
        {
            "name": "image",
            "parallel": 1,
            "parallel_source": "default",
            "operator_parallel": None,
            "on_caller_gone": None,
            "typical_seconds": None,
            "gpus": ["gpu0"],
        },
    ]


def test_staff_set_parallel_and_everyone_else_is_refused(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["chat"])
    _, member = factories.member("ann", "pro")
    _, staff = factories.member("boss", "pro", staff=True)
    assert (
        api.as_member(member).patch("/api/models/chat/", {"parallel": 4}, format="json").status_code
        == 403
    )
    changed = api.as_member(staff).patch("/api/models/chat/", {"parallel": 4}, format="json")
    assert changed.status_code == 200
    assert changed.json() == {
        "name": "chat",
        "parallel": 4,
        "parallel_source": "operator",
        "operator_parallel": 4,
        "on_caller_gone": None,
        "typical_seconds": None,
        "gpus": ["gpu0", "gpu1"],
    }
    assert ModelSetting.objects.get(name="chat").parallel == 4
    assert api.as_member(member).get("/api/models/").json()[0]["parallel"] == 4
    api.credentials()
    assert api.get("/api/models/").status_code == 401


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"parallel": 0}, "parallel"),
        ({"parallel": 65}, "parallel"),
        ({"parallel": "four"}, "parallel"),
        ({}, "parallel"),
        ({"parallel": 2, "paralel": 2}, "paralel"),
    ],
)
def test_a_bad_parallel_is_a_400_naming_the_field(api, default_tiers, payload, field):
    registered("gpu0", ["chat"])
    registered("gpu1", ["chat"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch("/api/models/chat/", payload, format="json")
    assert answer.status_code == 400 and answer.json()["detail"].startswith(field)
    assert not ModelSetting.objects.exists()


def test_a_model_no_gpu_serves_is_a_404_naming_those_served(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["video"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch("/api/models/audio/", {"parallel": 2}, format="json")
    assert answer.status_code == 404
    assert "served: chat, image, video" in answer.json()["detail"]


def test_gpus_and_metrics_show_the_slots_in_use(api, client, default_tiers, dispatchers_alive):
    gpu0 = registered("gpu0", ["chat"])
    dispatchers_alive(gpu0)
    services.model_parallel_set(name="chat", parallel=4)
    ann, token = factories.member("ann", "pro")
    jobs = [factories.job(ann, model="chat") for _ in range(3)]
    for _ in jobs:
        job_claim_next(resident_model="chat", worker="test", gpu=gpu0.pk)
    (listed,) = api.as_member(token).get("/api/gpus/").json()
    assert listed["slots"] == 4 and listed["slots_in_use"] == 3
    assert listed["running_jobs"] == [job.pk for job in jobs]
    assert listed["running_job"] == jobs[0].pk
    samples = scrape(client)
    assert value(samples, "gpusched_model_in_flight", model="chat", gpu="gpu0") == 3
    assert value(samples, "gpusched_model_parallel", model="chat") == 4
    assert value(samples, "gpusched_running_jobs") == 3


def test_staff_set_on_caller_gone_read_it_back_and_reset_it_to_the_path_default(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["chat"])
    _, member = factories.member("ann", "pro")
    _, staff = factories.member("boss", "pro", staff=True)
    path = "/api/models/chat/"
    refused = api.as_member(member).patch(path, {"on_caller_gone": "drain"}, format="json")
    assert refused.status_code == 403
    changed = api.as_member(staff).patch(path, {"on_caller_gone": "drain"}, format="json")
    assert changed.status_code == 200
    assert changed.json() == {
        "name": "chat",
        "parallel": 1,
        "parallel_source": "default",
        "operator_parallel": None,
        "on_caller_gone": "drain",
        "typical_seconds": None,
        "gpus": ["gpu0", "gpu1"],
    }
    listed = {model["name"]: model for model in api.as_member(member).get("/api/models/").json()}
    assert listed["chat"]["on_caller_gone"] == "drain"
    assert listed["image"]["on_caller_gone"] is None  # nothing set: by path
    both = api.as_member(staff).patch(
        path, {"parallel": 2, "on_caller_gone": "close"}, format="json"
    )
    assert (both.json()["parallel"], both.json()["on_caller_gone"]) == (2, "close")
    reset = api.as_member(staff).patch(path, {"on_caller_gone": None}, format="json")
    assert reset.json()["on_caller_gone"] is None and reset.json()["parallel"] == 2
    assert ModelSetting.objects.get(name="chat").on_caller_gone == ""


@pytest.mark.parametrize("value", ["stop", "DRAIN", "", 1, True, ["drain"]], ids=repr)
def test_a_bad_on_caller_gone_is_a_400_naming_the_field_and_the_choices(api, default_tiers, value):
    registered("gpu0", ["chat"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch(
        "/api/models/chat/", {"on_caller_gone": value}, format="json"
    )
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert detail.startswith("on_caller_gone: must be one of close, drain"), detail
    assert not ModelSetting.objects.exists()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", OnCallerGone.CLOSE),
        ("/v1/completions", OnCallerGone.CLOSE),
        ("/v1/responses", OnCallerGone.CLOSE),
        ("/v1/embeddings", OnCallerGone.CLOSE),
        ("/v1/rerank", OnCallerGone.CLOSE),
        ("/v1/images/generations", OnCallerGone.DRAIN),
        ("/v1/images/edits", OnCallerGone.DRAIN),
        ("/v1/audio/speech", OnCallerGone.DRAIN),
        ("/v1/audio/transcriptions", OnCallerGone.DRAIN),
        ("/sdapi/v1/txt2img", OnCallerGone.DRAIN),
        ("/sdapi/v1/img2img", OnCallerGone.DRAIN),
    ],
)
def test_on_caller_gone_follows_the_path_when_nothing_is_set(path, expected):
    assert OnCallerGone.by_path(path) == expected


def test_the_schema_shows_on_caller_gone_and_the_gpus_change(api, default_tiers):
    schema = api.get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    assert set(components["ModelOutput"]["required"]) >= {"on_caller_gone"}
    assert "one_model_at_a_time" in components["GpuOutput"]["required"]
    gpu_patch = schema["paths"]["/api/gpus/{name}/"]["patch"]
    (gpu_body,) = gpu_patch["requestBody"]["content"].values()
    gpu_ref = gpu_body["schema"]["$ref"].rsplit("/", 1)[-1]
    assert set(components[gpu_ref]["properties"]) == {"enabled", "one_model_at_a_time"}
    assert components[gpu_ref]["additionalProperties"] is False
    assert {"200", "400", "403", "404"} <= set(gpu_patch["responses"])
    patch = schema["paths"]["/api/models/{name}/"]["patch"]["requestBody"]
    (body,) = patch["content"].values()
    ref = body["schema"]["$ref"].rsplit("/", 1)[-1]
    assert set(components[ref]["properties"]) == {"parallel", "on_caller_gone", "typical_seconds"}
    job = components["JobOutput"]["properties"]
    assert {"caller_left_at", "drained_seconds"} <= set(job)


def with_limits(gpu, limits: dict[str, int | None]) -> None:
    """`gpu`'s llama-swap config: the models named, `chat-small` aliased `chat`."""
    models = {
        name: {"aliases": ["chat"] if name == "chat-small" else []}
        | ({"concurrencyLimit": limit} if limit is not None else {})
        for name, limit in limits.items()
    }
    services.gpu_routing_record(gpu_id=gpu.pk, routing=routing_parts({"models": models}), error="")


def test_parallel_above_a_concurrency_limit_is_a_400_naming_gpu_model_limit_and_parallel(
    api, default_tiers
):
    with_limits(
        registered("gpu0", ["chat-small", "chat", "image"]), {"chat-small": 6, "image": None}
    )
    with_limits(registered("gpu1", ["chat-small", "chat"]), {"chat-small": 2})
    _, staff = factories.member("boss", "pro", staff=True)

    refused = api.as_member(staff).patch("/api/models/chat/", {"parallel": 4}, format="json")
    assert refused.status_code == 400
    assert refused.json()["detail"] == (
        "parallel: 4 is above the concurrencyLimit 2 of model 'chat' in gpu1's llama-swap "
        "config; llama-swap refuses the requests beyond it"
    )
    assert not ModelSetting.objects.exists()
    allowed = api.as_member(staff).patch("/api/models/chat/", {"parallel": 2}, format="json")
    assert allowed.status_code == 200 and allowed.json()["parallel"] == 2

    # No concurrencyLimit in its config: llama-swap's default, 10.
    image = "/api/models/image/"
    unset = api.as_member(staff).patch(image, {"parallel": 11}, format="json")
    assert unset.status_code == 400
    assert "concurrencyLimit 10 of model 'image' in gpu0" in unset.json()["detail"]
    at_default = api.as_member(staff).patch(image, {"parallel": 10}, format="json")
    assert at_default.json()["parallel"] == 10


def test_staff_set_a_models_typical_run_and_clear_it(api, default_tiers):
    """The estimate of its jobs until its runs are learned (basis `operator`)."""
    registered("gpu0", ["video"])
    _, staff = factories.member("boss", "pro", staff=True)
    path = "/api/models/video/"
    changed = api.as_member(staff).patch(path, {"typical_seconds": 480}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["typical_seconds"] == 480
    assert ModelSetting.objects.get(name="video").typical_seconds == 480
    cleared = api.as_member(staff).patch(path, {"typical_seconds": None}, format="json")
    assert cleared.json()["typical_seconds"] is None


@pytest.mark.parametrize("value", [0, -5, 1e9, "ten", True], ids=repr)
def test_a_bad_typical_run_is_a_400_naming_the_field(api, default_tiers, value):
    registered("gpu0", ["video"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch(
        "/api/models/video/", {"typical_seconds": value}, format="json"
    )
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("typical_seconds: "), answer.json()
    assert not ModelSetting.objects.exists()


def listed_parallel(api, token) -> dict[str, tuple[int, str]]:
    return {
        model["name"]: (model["parallel"], model["parallel_source"])
        for model in api.as_member(token).get("/api/models/").json()
    }


def test_parallel_comes_from_the_config_then_the_server_and_the_lowest_gpu_binds(
    api, default_tiers
):
    """A model's slots as its cmd sets them (-np), then as its server
    reports them; the lowest across the GPUs; a disabled GPU's not at all."""
    gpu0 = registered("gpu0", ["chat-small", "image"])
    gpu1 = registered("gpu1", ["chat-small"])
    config = routing_parts({"models": {"chat-small": {"concurrencyLimit": 4}, "image": {}}})
    _, token = factories.member("ann", "pro")
    services.gpu_routing_record(gpu_id=gpu0.pk, routing=config, error="", slots={"chat-small": 3})
    assert listed_parallel(api, token) == {"chat-small": (3, "config"), "image": (1, "default")}

    services.gpu_server_slots_record(gpu_id=gpu0.pk, model="chat-small", slots=4)
    assert listed_parallel(api, token)["chat-small"] == (4, "server")
    # Above its concurrencyLimit: bounded by it.
    services.gpu_server_slots_record(gpu_id=gpu0.pk, model="image", slots=16)
    assert listed_parallel(api, token)["image"] == (10, "server")

    # Another GPU's server with fewer slots binds, until that GPU is disabled.
    services.gpu_server_slots_record(gpu_id=gpu1.pk, model="chat-small", slots=2)
    assert listed_parallel(api, token)["chat-small"] == (2, "server")
    services.gpu_settings_update(name="gpu1", changes={"enabled": False})
    assert listed_parallel(api, token)["chat-small"] == (4, "server")

    # A config read again that changes the flag drops the server's count
    # (llama-swap restarts the model; its server is asked again once ready).
    services.gpu_routing_record(gpu_id=gpu0.pk, routing=config, error="", slots={"chat-small": 2})
    assert listed_parallel(api, token)["chat-small"] == (2, "config")


def test_the_operators_parallel_wins_and_null_gives_it_back_to_the_servers(api, default_tiers):
    gpu0 = registered("gpu0", ["chat"])
    registered("gpu1", ["chat"])
    services.gpu_server_slots_record(gpu_id=gpu0.pk, model="chat", slots=4)
    _, staff = factories.member("boss", "pro", staff=True)

    pinned = api.as_member(staff).patch("/api/models/chat/", {"parallel": 1}, format="json")
    assert pinned.status_code == 200
    assert (pinned.json()["parallel"], pinned.json()["parallel_source"]) == (1, "operator")
    assert pinned.json()["operator_parallel"] == 1
    # A server reporting again changes nothing while the operator's value stands.
    services.gpu_server_slots_record(gpu_id=gpu0.pk, model="chat", slots=6)
    assert listed_parallel(api, staff)["chat"] == (1, "operator")

    released = api.as_member(staff).patch("/api/models/chat/", {"parallel": None}, format="json")
    assert released.status_code == 200
    assert (released.json()["parallel"], released.json()["parallel_source"]) == (6, "server")
    assert released.json()["operator_parallel"] is None


def test_a_parallel_set_before_the_servers_were_asked_stays_the_operators():
    """The migration's rule (0034): a parallel above 1 was the operator's; 1
    was the default. Checked on the function the migration runs."""
    import importlib

    from django.apps import apps

    migration = importlib.import_module("queueapp.migrations.0034_parallel_from_the_servers")
    ModelSetting.objects.create(name="set", parallel=4)
    ModelSetting.objects.create(name="default", parallel=1)
    migration.keep_the_operators_values(apps, None)
    rows = {
        row.name: (row.operator_parallel, row.parallel_source) for row in ModelSetting.objects.all()
    }
    assert rows == {"set": (4, "operator"), "default": (None, "default")}
