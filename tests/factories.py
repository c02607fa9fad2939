"""Test data in one place: tiers as the fixtures define them, members, jobs."""

from __future__ import annotations

from typing import Any

from queueapp import services
from queueapp.models import Job, Member, Policy, Tier

TIER_DEFAULTS = {"free": 0, "pro": 1, "max": 2}


def tiers() -> dict[str, Tier]:
    """The default tiers (free 0 / pro +1 / max +2, cap +100, floor -1000)."""
    return {
        name: Tier.objects.get_or_create(
            name=name, defaults={"bonus": bonus, "priority_cap": 100, "priority_floor": -1000}
        )[0]
        for name, bonus in TIER_DEFAULTS.items()
    }


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
