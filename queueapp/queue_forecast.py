"""The forecast's answer: when each queued job should start and on which
GPU, whether that start is a guess, and what a wait bound weighs (the runs
ahead of a job on its GPU, with their spread). queueapp/eta.py plays the
queue and builds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from queueapp.models import Job
from queueapp.policy import Candidate, Forecast, ForecastGpu, PolicySettings, score
from queueapp.policy.score import Loaded
from queueapp.policy.wait_bound import (
    GpuHeld,
    Holder,
    RunAhead,
    busy_message,
    refuses_for_bound,
    retry_after,
    run_ahead,
)


@dataclass(frozen=True)
class QueueForecast:
    now: datetime
    paused: bool
    # The GPUs as the play started: when each frees, what it has loaded.
    gpus: list[ForecastGpu]
    settings: PolicySettings
    order: list[Forecast]
    candidates: dict[int, Candidate]
    complete: bool  # False when the play stopped before the queue was empty
    # When each running job should end (several may share a GPU).
    running_ends: dict[int, datetime] = field(default_factory=dict)
    # The running jobs the play started with (member, tier and GPU loaded).
    running: list[Job] = field(default_factory=list)
    # The jobs (running or queued) whose run has no estimate: nothing of
    # their model learned and no typical run set. A start after one of them
    # is a guess (`is_guess`).
    unknown_runs: frozenset[int] = frozenset()
    # Each queued job's p90 as set at its submission (its p50 is its
    # candidate's): the spread of the runs ahead a wait bound weighs.
    p90s: dict[int, float | None] = field(default_factory=dict)

    @property
    def resident_model(self) -> str | None:
        """The first GPU's loaded model (the one GPU's, on one GPU)."""
        return self.gpus[0].resident_model if self.gpus else None

    @property
    def gpu_free_at(self) -> datetime:
        """When the first GPU frees (now, when one stands idle)."""
        first = min((gpu.free_at for gpu in self.gpus), default=self.now.timestamp())
        return self.now + timedelta(seconds=max(0.0, first - self.now.timestamp()))

    def expected_end_of(self, job_id: int) -> datetime | None:
        """When running job `job_id` should end (None: it was not running)."""
        return self.running_ends.get(job_id)

    def gpu_free_at_for(self, name: str) -> datetime | None:
        """When GPU `name` frees: its last job in flight ends."""
        for gpu in self.gpus:
            if gpu.name == name:
                return self.now + timedelta(seconds=max(0.0, gpu.free_at - self.now.timestamp()))
        return None

    @cached_property
    def jobs(self) -> dict[int, Job]:
        """The jobs in `order`, with member and tier, loaded on first use.

        The play itself works on plain rows; only the queue view needs the
        model instances, and only those it lists.
        """
        ids = [place.job_id for place in self.order]
        return Job.objects.select_related("member__tier").defer("body").in_bulk(ids)

    @cached_property
    def _places(self) -> dict[int, Forecast]:
        return {place.job_id: place for place in self.order}

    def for_job(self, job_id: int) -> Forecast | None:
        return self._places.get(job_id)

    @cached_property
    def _first_unknown_position(self) -> float:
        """The place of the first job played whose run is unknown; before
        the queue (0) when a running one's is; after it when none is."""
        if any(job.pk in self.unknown_runs for job in self.running):
            return 0
        return min(
            (place.position for place in self.order if place.job_id in self.unknown_runs),
            default=math.inf,
        )

    def is_guess(self, place: Forecast) -> bool:
        """Whether `place`'s start rests on a run of which nothing is known:
        one running now, or one played before it (on any GPU: the play
        gives each GPU the jobs in turn, so a guess anywhere may move it)."""
        return self._first_unknown_position < place.position

    def seconds_until_start(self, job_ids: Sequence[int]) -> float | None:
        """Seconds until the first of `job_ids` is forecast to start; None
        when the play placed none of them."""
        starts = [place.estimated_start for i in job_ids if (place := self.for_job(i))]
        return max(0.0, min(starts) - self.now.timestamp()) if starts else None

    def start_estimate(self, job: Job) -> StartEstimate:
        """When queued job `job` should start, how many start before it, and
        what runs on each GPU it could use."""
        place = self.for_job(job.pk)
        if place is not None:
            start_in: float | None = max(0.0, place.estimated_start - self.now.timestamp())
            ahead = place.position - 1
        else:  # past the horizon, or no GPU runs its model
            start_in, ahead = None, len(self.order)
        # Not placed within the horizon: it starts after the last job placed.
        at_least = (
            max(0.0, self.order[-1].estimated_start - self.now.timestamp())
            if place is None and self.order and not self.complete
            else None
        )
        usable = [g for g in self.gpus if g.runs_models is None or job.model in g.runs_models]
        return StartEstimate(
            start_in=start_in,
            ahead=ahead,
            runs_ahead=self._runs_ahead(place) if place is not None else (),
            gpus=[
                GpuHeld(
                    name=gpu.name,
                    holders=tuple(
                        Holder(
                            job_id=running.pk,
                            model=running.model,
                            band=running.priority,
                            held_seconds=max(
                                0.0, (self.now - (running.started_at or self.now)).total_seconds()
                            ),
                        )
                        for running in self.running
                        if (running.gpu.name if running.gpu else "") == gpu.name
                    ),
                )
                for gpu in usable
            ],
            first_gpu_free_in=(self.gpu_free_at - self.now).total_seconds(),
            at_least=at_least,
        )

    def _runs_ahead(self, place: Forecast) -> tuple[RunAhead, ...]:
        """What `place`'s start waits for on its GPU, as the wait bound's
        rule weighs it: the rest of each job running there (its expected
        end, at p50 and p90), and each job played there before it."""
        runs = [
            run_ahead(
                ends_in=(self.running_ends.get(running.pk, self.now) - self.now).total_seconds(),
                p50=running.expected_p50,
                p90=running.expected_p90,
            )
            for running in self.running
            if place.gpu is None or (running.gpu.name if running.gpu else "") == place.gpu
        ]
        for ahead in self.order[: place.position - 1]:
            if place.gpu is None or ahead.gpu == place.gpu:
                runs.append(
                    run_ahead(
                        ends_in=ahead.estimated_seconds,
                        p50=self.candidates[ahead.job_id].expected_seconds,
                        p90=self.p90s.get(ahead.job_id),
                    )
                )
        return tuple(runs)

    def start_of(self, forecast: Forecast) -> datetime:
        return self.now + timedelta(seconds=forecast.estimated_start - self.now.timestamp())

    def terms_now(self, job_id: int) -> dict[str, float]:
        """The job's score terms at this instant (not at its forecast start),
        its swap affinity as the GPU it is forecast to run on has it."""
        place = self._places.get(job_id)
        first = self.gpus[0] if self.gpus else None
        for gpu in self.gpus:
            if place is not None and gpu.name == place.gpu:
                first = gpu
        resident: Loaded = None
        if first is not None:
            named = {first.resident_model} if first.resident_model else set()
            resident = first.resident_models | named
        return score(
            self.candidates[job_id],
            now=self.now.timestamp(),
            resident_model=resident,
            settings=self.settings,
        ).as_dict()


@dataclass(frozen=True)
class StartEstimate:
    """A queued job's forecast start, as a wait bound judges it."""

    start_in: float | None  # seconds from now; None: the play did not place it
    ahead: int  # jobs forecast to start before it
    gpus: list[GpuHeld]  # the GPUs it could use, with what runs there
    first_gpu_free_in: float  # seconds until the first GPU frees
    # Unplaced because the play stopped at its horizon: the seconds until the
    # last job it placed starts, before which this one cannot; else None.
    at_least: float | None = None
    # What its start waits for on its GPU, with each run's spread.
    runs_ahead: tuple[RunAhead, ...] = ()

    def misses(self, bound: float) -> bool:
        """Whether it cannot start within `bound` seconds by the forecast,
        even if the runs ahead of it go well (`refuses_for_bound`: a refusal
        is a promise kept nine times in ten). A job past the horizon misses
        only when the horizon's last start already lies past the bound; one
        no play places (no GPU runs it) misses."""
        if self.start_in is not None:
            return refuses_for_bound(start_in=self.start_in, ahead=self.runs_ahead, bound=bound)
        return self.at_least is None or self.at_least > bound

    def message(self, tail: str) -> str:
        return busy_message(gpus=self.gpus, ahead=self.ahead, tail=tail)

    @property
    def retry_after(self) -> int:
        """Seconds until it could start (when the first GPU frees, unplaced)."""
        known = self.start_in if self.start_in is not None else self.at_least
        return retry_after(
            known if known is not None else self.first_gpu_free_in,
            fallback=RETRY_FALLBACK_SECONDS,
        )


# Retry-After when no forecast figure applies (nothing runs, nothing placed).
RETRY_FALLBACK_SECONDS = 5
