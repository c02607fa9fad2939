"""Which GPU a job may start on, and which job a GPU starts: plain Python,
shared by the claim (queueapp/dispatch/claim.py), the GPU's row
(queueapp/models.py) and the policy simulator (queueapp/simulation/).

- A reservation keeps a GPU for some work: when set, it admits only jobs of
  at least `min_band`, or jobs expected to run under `max_expected_seconds`
  ("gpu0 takes only band >= 0, or jobs under 60 s"), so interactive work
  always finds a GPU not stuck in a long render. It decides where a job may
  run, never its score.
- Placement: among simultaneous choices, the GPU with a job's model loaded
  takes it. A GPU whose leader is loaded on another idle GPU starts the best
  job of the leader's band that needs no swap there instead; never a job of
  a lower band, and never instead of a job pinned to it (no other GPU may
  take that one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from queueapp.policy.score import Loaded, RankedCandidate, is_loaded


@dataclass(frozen=True)
class Reservation:
    min_band: int | None = None
    max_expected_seconds: float | None = None

    @property
    def reserved(self) -> bool:
        return self.min_band is not None or self.max_expected_seconds is not None

    def short_models(self, expected_seconds: Mapping[str, float]) -> frozenset[str] | None:
        """The models whose expected run (`expected_seconds`, per model) is
        under its bound, which it admits whatever their band; None without
        a bound. Whether a job may start here is `decide`'s rule
        (decide.GpuSnapshot.keeps_out)."""
        if self.max_expected_seconds is None:
            return None
        bound = self.max_expected_seconds
        return frozenset(model for model, seconds in expected_seconds.items() if seconds < bound)

    def describe(self) -> str:
        parts = []
        if self.min_band is not None:
            parts.append(f"min_band={self.min_band}")
        if self.max_expected_seconds is not None:
            parts.append(f"max_expected_seconds={self.max_expected_seconds:g}")
        return ",".join(parts)


# How far down the ranking a GPU looks for a job to start instead of a
# leader better placed elsewhere: the claim ranks this many in full.
PLACEMENT_LOOKAHEAD = 5


def placed_here(
    ranked: Sequence[RankedCandidate],
    *,
    resident_model: Loaded,
    loaded_elsewhere: frozenset[str],
) -> RankedCandidate:
    """The job this GPU starts, from `ranked` (best first): the leader, unless
    its model is loaded on another idle GPU and a job of the leader's band that
    needs no swap there can go here instead; never a job of a lower band."""
    leader = ranked[0].candidate
    for entry in ranked[:PLACEMENT_LOOKAHEAD]:
        candidate = entry.candidate
        if candidate.band != leader.band:
            break
        if (
            candidate.pinned_gpu is not None  # eligible here, so pinned here
            or is_loaded(candidate.model, resident_model)
            or candidate.model not in loaded_elsewhere
        ):
            return entry
    return ranked[0]
