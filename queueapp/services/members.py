"""Members: create, save (a new tier re-clamps their queued jobs), credentials."""

from __future__ import annotations

import secrets

from django.db import transaction

from queueapp.dispatch import wakeup
from queueapp.live.events import queue_changed
from queueapp.locks import lock_gpu_claims, lock_member_lines
from queueapp.models import Member, Tier, hash_token, new_webhook_secret
from queueapp.selectors import policy_get
from queueapp.services.policy import queued_rank_keys_refresh
from queueapp.services.tiers import queued_priorities_reclamp


def new_api_token() -> str:
    return "gps_" + secrets.token_urlsafe(32)


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_create(*, name: str, tier: Tier, is_staff: bool = False) -> tuple[Member, str]:
    """Create a member; returns it with its API token (shown once, stored hashed)."""
    token = new_api_token()
    member = Member.objects.create(
        name=name, tier=tier, is_staff=is_staff, token_hash=hash_token(token)
    )
    return member, token


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_save(*, member: Member, by: str = "") -> Member:
    """Save a member's changes; under a new tier its queued jobs are clamped
    again to that tier's cap and floor and re-keyed with its bonus."""
    member.save()
    divisor = policy_get().aging_divisor
    lock_gpu_claims()  # before the member's lines lock, as tier_save takes them
    # A submission in progress finishes first (its job is then re-clamped); a
    # later one reads the new tier.
    lock_member_lines(member.pk)
    queued_priorities_reclamp(
        tier=Tier.objects.get(pk=member.tier_id), aging_divisor=divisor, by=by, member_id=member.pk
    )
    queued_rank_keys_refresh(aging_divisor=divisor, member_id=member.pk)
    queue_changed(kind="member")
    wakeup.work_available()
    return member


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_token_rotate(*, member: Member) -> str:
    token = new_api_token()
    member.token_hash = hash_token(token)
    member.save(update_fields=["token_hash"])
    return token


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_webhook_secret_rotate(*, member: Member) -> str:
    member.webhook_secret = new_webhook_secret()
    member.save(update_fields=["webhook_secret"])
    return member.webhook_secret
