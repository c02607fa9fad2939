"""The scheduling policy: the operator's settings, and the rank keys they key.

The queued line heads store a rank key (queueapp/policy/score.py) so the
claim can read the best few from an index; a change of the aging divisor,
a tier's bonus or a member's tier rewrites those keys in the transaction of
the change, under the GPU claim lock.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from queueapp.dispatch import wakeup
from queueapp.live.events import queue_changed
from queueapp.locks import lock_gpu_claims
from queueapp.models import Policy
from queueapp.policy import AGING_EPOCH_SECONDS, check_invariant
from queueapp.selectors import policy_get, policy_settings, tier_bonuses

# The fields an operator may change (the admin's form, the API's serializer).
POLICY_FIELDS = Policy.EDITABLE_FIELDS


@transaction.atomic  # not durable: the admin's form view holds a transaction
def policy_update(*, changes: dict[str, Any]) -> Policy:
    """Change the policy; it applies from the next dispatch.

    Raises PolicyInvariantError (a ValueError) when the result would let a
    bounded term cross a band.
    """
    Policy.objects.get_or_create(pk=1)  # the defaults' row, the first time
    policy = policy_get(lock=True)
    old_divisor = policy.aging_divisor
    old_shortness = (policy.shortest_first_weight, policy.shortest_first_scale)
    for field, value in changes.items():
        if field not in POLICY_FIELDS:
            raise ValueError(f"{field} is not a policy field")
        setattr(policy, field, value)
    check_invariant(policy_settings(policy), tier_bonuses())
    policy.save()
    shortness = (policy.shortest_first_weight, policy.shortest_first_scale)
    if shortness != old_shortness:
        queued_shortness_refresh(weight=shortness[0], scale=shortness[1])
    if policy.aging_divisor != old_divisor or shortness != old_shortness:  # what keys rest on
        queued_rank_keys_refresh(aging_divisor=policy.aging_divisor)
    queue_changed(kind="policy")
    wakeup.work_available()
    return policy


def shortness_sql(p50: str) -> str:
    """policy/score.py `shortness` in SQL, of the expression `p50`, with
    the parameters %(weight)s and %(scale)s: the one copy the statements
    that store a job's term share."""
    return (
        f"CASE WHEN %(weight)s > 0 AND {p50} IS NOT NULL "
        f"THEN %(weight)s / (1 + greatest({p50}, 0) / %(scale)s) ELSE 0 END"
    )


def queued_shortness_refresh(*, weight: float, scale: float) -> int:
    """Every queued job's shortness term (policy/score.py `shortness`, in
    SQL) under a new shortest_first_weight or scale; its rank key is then
    refreshed with the rest."""
    lock_gpu_claims()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE queueapp_job SET shortness = {shortness_sql('expected_p50')} "
            "WHERE status = 'queued'",
            {"weight": weight, "scale": scale},
        )
        return cursor.rowcount


def queued_rank_keys_refresh(
    *, aging_divisor: float, tier_id: int | None = None, member_id: int | None = None
) -> int:
    """Recompute the stored rank key of lane heads after a policy, tier or member change.

    Same formula as queueapp.policy.rank_key; the ranking itself always
    recomputes from the inputs, so the stored key only has to order
    candidates well enough to be fetched first. Other queued jobs get their
    key when they become heads. Holds the claim lock, so a claim never waits
    on rows this rewrites (or the reverse).
    """
    lock_gpu_claims()
    sql = """
        UPDATE queueapp_job AS job
           SET rank_key = job.priority + tier.bonus + job.shortness
                          - (EXTRACT(EPOCH FROM job.eligible_at)::float8 - %s) / %s
          FROM queueapp_member AS member
          JOIN queueapp_tier AS tier ON tier.id = member.tier_id
         WHERE job.member_id = member.id AND job.status = 'queued' AND job.is_lane_head
    """
    params: list[Any] = [AGING_EPOCH_SECONDS, aging_divisor]
    if tier_id is not None:
        sql += " AND tier.id = %s"
        params.append(tier_id)
    if member_id is not None:
        sql += " AND member.id = %s"
        params.append(member_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
