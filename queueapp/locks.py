"""Every lock gpusched takes, and the one order they are taken in.

Locks, from the first taken to the last:

1. **A settings row**: a tier's (`services.submission.submission_open`, or the UPDATE of
   `tier_save`) or the policy's (`policy_get(lock=True)` in
   `policy_update`). A submission reads its tier FOR SHARE, so a tier change
   in progress is waited for and one that starts later waits for the
   submission's commit.
2. **The claim locks**: the queue-wide one, then one GPU's.
   - The queue-wide lock (`lock_gpu_claims`) is taken *shared* by every
     claim (`lock_gpu_claim`), so claims for different GPUs run at once,
     and *exclusive* by the lease recovery and every change that rewrites
     queued jobs' rank keys (a tier, a member, the policy's aging), which
     must not overlap any claim.
   - A GPU's lock (two keys, `GPU_CLAIM_CLASS` and the GPU's id) serialises
     "is this GPU free, and who goes next on it?".
3. **A member's lines lock** (`lock_member_lines`), one per member, in
   member id order when a transaction takes several: every change to a
   member's queue lines reads a line and then writes its head
   (queueapp/lanes.py), so two such changes at once must not overlap.
4. **Job rows** (`SELECT ... FOR UPDATE`; the claim and the retention's
   pruning skip rows another transaction holds).

Whoever takes two of these takes them in this order, so waiting for one
never deadlocks. The claim is the one exception: it learns the member only
after locking its candidate rows (with SKIP LOCKED), so it only *tries* that
member's lines lock, inside the UPDATE that marks the job running
(`MEMBER_LINES_LOCK` in that SQL), and claims again when the lines are busy;
only its last try, after many, waits for them. The front door's claim
(`dispatch.claim.gateway_claim`), taken inside the transaction of a
submission (after its lines lock) or of a job's end (after the job's row),
only tries every lock it takes, so it never waits either.

Apart from the order, because they are never held with any lock above: a
webhook delivery's row (queueapp/webhooks/delivery.py), **a gateway's
liveness lock** (`GATEWAY_LOCK_CLASS`), which each front-door web process
holds, session-level, on a connection of its own for as long as it lives
(queueapp/liveness.py), and **a dispatcher's liveness lock**
(`DISPATCHER_LOCK_CLASS`, the GPU's id), held the same way by each GPU's
dispatch pass on the connection it listens for work on (queueapp/liveness.py),
and **the model parallels lock** (`lock_model_parallels`), which every write
of a model's slots or operator's `parallel` takes first and alone, so the
`parallel` worked out from them (services/models.py) is never computed from
a view another writer is changing.

The advisory keys below are fixed: the running system holds them and raw SQL
(the claim's UPDATE, the live-gateway sub-select) names them. One-key and
two-key advisory locks are separate key spaces in PostgreSQL.
"""

from __future__ import annotations

from django.db import connection

# The one-key advisory lock that serialises claims ("gpusched" in ASCII).
GPU_CLAIM_LOCK = 0x67707573636865
# The first key of a GPU's two-key claim lock ("gpuc"); the second is the GPU's id.
GPU_CLAIM_CLASS = 0x67707563
# The first key of a dispatcher's two-key liveness lock ("dp"); the second is
# its GPU's id.
DISPATCHER_LOCK_CLASS = 0x6470
# The first key of the two-key advisory locks on a member's lines ("line");
# the second is the member's id.
MEMBER_LINES_LOCK = 0x6C696E65
# The first key of a front-door gateway's two-key liveness lock ("gw"); the
# second is the gateway's number.
GATEWAY_LOCK_CLASS = 0x6777
# The one-key advisory lock on the models' `parallel` and its sources ("parallel").
MODEL_PARALLELS_LOCK = 0x706172616C6C656C


def lock_gpu_claims() -> None:
    """Serialise with every claim on every GPU until the current transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GPU_CLAIM_LOCK])


def lock_gpu_claim(gpu_id: int) -> None:
    """A claim on one GPU: the queue-wide lock shared, then the GPU's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock_shared(%s), pg_advisory_xact_lock(%s, %s)",
            [GPU_CLAIM_LOCK, GPU_CLAIM_CLASS, gpu_id],
        )


def try_lock_gpu_claim(gpu_id: int) -> bool:
    """`lock_gpu_claim` if nobody holds either lock against it now; False
    rather than wait (a shared lock taken here is kept until the transaction
    ends, which is harmless: it only ever waits for nothing)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CASE WHEN pg_try_advisory_xact_lock_shared(%s) "
            "THEN pg_try_advisory_xact_lock(%s, %s) ELSE false END",
            [GPU_CLAIM_LOCK, GPU_CLAIM_CLASS, gpu_id],
        )
        return bool(cursor.fetchone()[0])


def try_lock_member_lines(member_id: int) -> bool:
    """The member's lines lock if nobody holds it now; False rather than wait."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [MEMBER_LINES_LOCK, member_id])
        return bool(cursor.fetchone()[0])


def lock_member_lines(member_id: int) -> None:
    """Hold the member's lines until the transaction ends. Taken before any
    row lock on the member's jobs, so that waiting for it never deadlocks."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [MEMBER_LINES_LOCK, member_id])


def lock_model_parallels() -> None:
    """Hold the models' `parallel` and its sources until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MODEL_PARALLELS_LOCK])
