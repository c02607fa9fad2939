"""What several dispatch test modules share: the queue lines' invariant,
and the property tests' drawn policy."""

from collections import defaultdict

from queueapp.models import Gpu, Job, JobStatus, Member, ModelSetting, Policy, RunStats, Tier
from tests import factories


def tiers_and_policy(
    *,
    limits: dict[str, int],
    strict: dict[str, bool],
    keep_idle: int,
    borrow_max_seconds: float | None,
) -> None:
    """The tiers' running limits and strictness, and the borrowing guard, as drawn."""
    tiers = factories.tiers()
    for name, limit in limits.items():
        Tier.objects.filter(pk=tiers[name].pk).update(
            max_running_jobs=limit, strict_running_limit=strict[name]
        )
    factories.policy()
    Policy.objects.filter(pk=1).update(
        borrow_keep_idle_gpus=keep_idle, borrow_max_seconds=borrow_max_seconds
    )


def assert_one_head_per_line():
    lines = defaultdict(list)
    for job in Job.objects.filter(status=JobStatus.QUEUED).order_by("submitted_at", "id"):
        lines[(job.member_id, job.priority, job.model)].append(job)
    for line, jobs in lines.items():
        assert [job.is_lane_head for job in jobs] == [True] + [False] * (len(jobs) - 1), line


def drawn_rows_removed(lock_session) -> None:
    """What a property test's example wrote, gone before the next one: the
    dispatcher locks it held, and its jobs, GPUs, members and settings (a
    test over several examples commits them, or shares one transaction)."""
    lock_session.execute("SELECT pg_advisory_unlock_all()")
    Job.objects.all().delete()
    RunStats.objects.all().delete()
    ModelSetting.objects.all().delete()
    Gpu.objects.all().delete()
    Member.objects.all().delete()
