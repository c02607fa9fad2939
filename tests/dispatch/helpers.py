"""What several dispatch test modules share: the queue lines' invariant."""

from collections import defaultdict

from queueapp.models import Job, JobStatus


def assert_one_head_per_line():
    lines = defaultdict(list)
    for job in Job.objects.filter(status=JobStatus.QUEUED).order_by("submitted_at", "id"):
        lines[(job.member_id, job.priority, job.model)].append(job)
    for line, jobs in lines.items():
        assert [job.is_lane_head for job in jobs] == [True] + [False] * (len(jobs) - 1), line
