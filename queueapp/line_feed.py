"""The queued jobs the forecast plays, loaded line by line in batches.

Plain SQL into `Candidate`s (policy/facts.py `queued_candidate`, read by
column name): an answer may read several hundred jobs, and building model
instances for them cost more than playing the queue (queueapp/eta.py).
"""

from __future__ import annotations

from django.db import connection

from queueapp.policy import Candidate
from queueapp.policy.facts import queued_candidate

# A line that runs out during the play is among those that go often (its
# band leads), so its next batch is larger than the first: fewer queries.
AFTER_BATCH_FACTOR = 4

Line = tuple[int, int, str]  # member, band, model
_LINE_START = 0  # no job loaded yet: from the line's first


class LineFeed:
    """Loads queue lines' jobs for the forecast in batches, in line order.

    Plain SQL into `Candidate`s: an answer may read several hundred jobs,
    and building model instances for them cost more than playing the queue.
    When a line runs out during the play, the next batch of every line of
    its band comes in the same query: lines of one band take turns, so they
    run out together.
    """

    def __init__(self, batch: int, *, unbounded: frozenset[int] = frozenset()) -> None:
        self.batch = batch
        # Jobs played as if their wait bound never passed: those whose start
        # the forecast is asked about (a bound is judged by it).
        self.unbounded = unbounded
        self.candidates: dict[int, Candidate] = {}
        self.paths: dict[int, str] = {}
        # Each job's size, read from its body: its run follows it (Durations.job_run_seconds).
        self.sizes: dict[int, float | None] = {}
        # Each job's p90 as set at its submission (None: no estimate).
        self.p90s: dict[int, float | None] = {}
        # Per line, the last job loaded: the next batch starts after it.
        self.loaded_to: dict[Line, int] = {}
        # Lines whose every queued job is loaded: a fetch returned less than
        # it asked for, so asking again would return nothing.
        self.complete: set[Line] = set()
        # Next batches fetched along with another line's, not yet asked for.
        self.fetched_ahead: dict[Line, list[Candidate]] = {}

    def load_lines(self, lines: set[Line]) -> list[Candidate]:
        found = self._fetch_lines(dict.fromkeys(lines, _LINE_START), self.batch)
        return [candidate for batch in found.values() for candidate in batch]

    def after(self, last: Candidate) -> list[Candidate]:
        """The next jobs of `last`'s queue line, in line order."""
        line = last.line
        if line in self.fetched_ahead:
            return self.fetched_ahead.pop(line)
        if line in self.complete:
            return []
        band_lines = {
            other: self.loaded_to[other]
            for other in self.loaded_to
            if other[1] == last.band
            and other not in self.complete
            and other not in self.fetched_ahead
        }
        found = self._fetch_lines(band_lines, self.batch * AFTER_BATCH_FACTOR)
        for other, batch in found.items():
            if other != line and batch:
                self.fetched_ahead[other] = batch
        return found.get(line, [])

    def _fetch_lines(self, lines: dict[Line, int], limit: int) -> dict[Line, list[Candidate]]:
        """Up to `limit` jobs of each line after the job given (0: from its start)."""
        if not lines:
            return {}
        members, bands, models = zip(*lines, strict=True)
        after_ids = lines.values()
        with connection.cursor() as cursor:
            # One index range scan per line (job_queued_lane), not a scan of
            # every queued job of these members.
            cursor.execute(
                """
                SELECT job.id AS job_id, job.priority AS band, tier.bonus AS tier_bonus,
                       job.model, EXTRACT(EPOCH FROM job.submitted_at)::float8 AS submitted_at,
                       job.member_id, job.is_lane_head,
                       EXTRACT(EPOCH FROM job.eligible_at)::float8 AS eligible_at,
                       EXTRACT(EPOCH FROM lane.last_dispatched_at)::float8 AS lane_clock,
                       job.pinned_gpu,
                       EXTRACT(EPOCH FROM job.wait_deadline)::float8 AS wait_deadline,
                       job.shortness, job.expected_p50 AS expected_seconds, job.path, job.size,
                       job.expected_p90
                  FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::bigint[])
                       AS line(member_id, band, model, after_id)
                  LEFT JOIN LATERAL (
                       SELECT submitted_at FROM queueapp_job WHERE id = line.after_id
                       ) AS last ON true
                 CROSS JOIN LATERAL (
                       SELECT * FROM queueapp_job
                        WHERE member_id = line.member_id AND priority = line.band
                          AND model = line.model AND status = 'queued'
                          AND (submitted_at, id)
                              > (COALESCE(last.submitted_at, '-infinity'), line.after_id)
                        ORDER BY submitted_at, id
                        LIMIT %s) AS job
                  JOIN queueapp_member AS member ON member.id = job.member_id
                  JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                  LEFT JOIN queueapp_lane AS lane
                         ON lane.member_id = job.member_id AND lane.band = job.priority
                 ORDER BY job.member_id, job.priority, job.model, job.submitted_at, job.id
                """,
                [list(members), list(bands), list(models), list(after_ids), limit],
            )
            names = [column.name for column in cursor.description or ()]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        found: dict[Line, list[Candidate]] = {line: [] for line in lines}
        for row in rows:
            # Epoch seconds as float8 are the same doubles as
            # datetime.timestamp() gives (both round the exact value).
            path, size, p90 = row.pop("path"), row.pop("size"), row.pop("expected_p90")
            if row["job_id"] in self.unbounded:
                row["wait_deadline"] = None
            candidate = queued_candidate(**row)
            job_id = candidate.job_id
            self.candidates[job_id] = candidate
            self.paths[job_id] = path
            self.sizes[job_id] = size
            self.p90s[job_id] = p90
            found[candidate.line].append(candidate)
            self.loaded_to[candidate.line] = job_id
        self.complete.update(line for line, batch in found.items() if len(batch) < limit)
        return found
