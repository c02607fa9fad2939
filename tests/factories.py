"""Test data in one place: tiers as the fixtures define them, members, jobs
(through the service or the REST API), dispatch decisions, and the policy's
candidates."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from django.apps import apps

import queueapp.migrations
from queueapp import services
from queueapp.models import DispatchDecision, Job, Member, Policy, Tier
from queueapp.policy import Candidate
from queueapp.policy.routing import RoutingConfig, routing_from_config

# The policy tests' clock: candidates' times are seconds before it.
NOW = 1_800_000_000.0

TIER_DEFAULTS = {"free": 0, "pro": 1, "max": 2}


def tiers() -> dict[str, Tier]:
    """The default tiers (free 0 / pro +1 / max +2, cap +100, floor -1000)."""
    return {
        name: Tier.objects.get_or_create(
            name=name, defaults={"bonus": bonus, "priority_cap": 100, "priority_floor": -1000}
        )[0]
        for name, bonus in TIER_DEFAULTS.items()
    }


def schedules() -> None:
    """The django-q schedules that migrations create (the dispatch safety net,
    webhooks, the prune, ...), made again by the migrations' own functions: a
    transactional test that ran before this one flushed them."""
    for module in pkgutil.iter_modules(queueapp.migrations.__path__):
        migration = importlib.import_module(f"queueapp.migrations.{module.name}")
        if hasattr(migration, "create_schedule"):
            migration.create_schedule(apps, None)


def policy(**fields: Any) -> Policy:
    current, _ = Policy.objects.get_or_create(pk=1)
    if fields:
        current = services.policy_update(changes=fields)
    return current


def member(name: str, tier: str = "free", *, staff: bool = False) -> tuple[Member, str]:
    return services.member_create(name=name, tier=tiers()[tier], is_staff=staff)


def chat_body(model: str = "chat-small", seconds: float | None = None, **extra: Any) -> dict:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if seconds is not None:
        body["sim"] = {"seconds": seconds}
    return {**body, **extra}


def job(
    owner: Member,
    *,
    priority: str | None = None,
    model: str = "chat-small",
    seconds: float | None = None,
    label: str | None = None,
    callback_url: str = "",
    **sim: Any,
) -> Job:
    """Submit a chat job; `label` travels as the body's `user` so tests can
    tell requests apart at the simulator; `sim` adds simulator directives."""
    body = chat_body(model, seconds)
    if label is not None:
        body["user"] = label
    if sim:
        body.setdefault("sim", {}).update(sim)
    return services.job_submit(
        member=owner,
        path="/v1/chat/completions",
        body=body,
        model=model,
        priority_header=priority,
        callback_url=callback_url,
    )


def job_with_webhook(owner: Member, url: str, **sim: Any) -> Job:
    """A chat job whose end is announced to `url`."""
    return job(owner, model="chat-a", callback_url=url, **sim)


def submit(
    api: Any,
    token: str,
    *,
    body: dict | None = None,
    path: str = "/v1/chat/completions",
    priority: str | None = None,
    **fields: Any,
) -> Any:
    """POST /api/jobs/ as `token`'s member (the `api` fixture's client); `fields`
    are the submission's other fields (chain, callback_url, ...)."""
    headers = {"HTTP_X_LLAMASWAP_PRIORITY": priority} if priority is not None else {}
    payload = {"path": path, "body": body if body is not None else chat_body(), **fields}
    return api.as_member(token).post("/api/jobs/", payload, format="json", **headers)


def decision(job: Job, *, band: int | None = None, **fields: Any) -> DispatchDecision:
    """A dispatch decision for `job` (in its own band unless told), at the
    database's now unless `at` is given; `fields` set the others."""
    defaults = {"terms": {}, "candidates": [], "policy": {}, "swap_needed": False}
    return DispatchDecision.objects.create(
        job=job, band=job.priority if band is None else band, **{**defaults, **fields}
    )


def candidate(
    job_id: int,
    band: int = 0,
    tier_bonus: float = 0.0,
    model: str = "a",
    waited: float = 0.0,
    *,
    aged: float | None = None,
    member: int | None = None,
    pinned: str | None = None,
    expected_seconds: float | None = None,
) -> Candidate:
    """A queued job as the policy sees it, submitted `waited` seconds before
    NOW and aging for `aged` seconds (as long as it waited unless told), of
    member `member` (a member of its own unless told), that only GPU
    `pinned` may run (any, unless told), expected to run `expected_seconds`
    (no estimate unless told)."""
    return Candidate(
        job_id=job_id,
        band=band,
        tier_bonus=tier_bonus,
        model=model,
        submitted_at=NOW - waited,
        eligible_at=NOW - (waited if aged is None else aged),
        member_id=job_id if member is None else member,
        pinned_gpu=pinned,
        expected_seconds=expected_seconds,
    )


# llama-swap's studio config, as the simulator and `make run` serve it.
STUDIO_CONFIG = Path(__file__).parents[1] / "fixtures/llama-swap/studio.yaml"


@cache
def studio_config() -> dict[str, Any]:
    """fixtures/llama-swap/studio.yaml, loaded (read only: shared)."""
    config: dict[str, Any] = yaml.safe_load(STUDIO_CONFIG.read_text(encoding="utf-8"))
    return config


STUDIO_ROUTING: RoutingConfig = routing_from_config(studio_config())
