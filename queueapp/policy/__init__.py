"""The scheduling policy as plain Python: no Django, no database.

The dispatcher turns rows into `Candidate`s and asks `rank` which goes next;
the simulator and the benchmarks call the same functions, so what they
measure is the code that runs.
"""

from queueapp.policy.explain import TERMS, counterfactual_winners, deciding_term
from queueapp.policy.forecast import Forecast, play_forward
from queueapp.policy.forecast_timeline import ForecastGpu, InFlight
from queueapp.policy.occupancy import (
    BATCH_SLOWDOWN_PER_EXTRA_REQUEST,
    MAX_PARALLEL,
    batched_seconds,
    occupancy_seconds,
)
from queueapp.policy.placement import PLACEMENT_LOOKAHEAD, Reservation, placed_here
from queueapp.policy.priority import (
    BAND_ALIASES,
    band_for_path,
    body_without_priority,
    clamp_priority,
    parse_priority_header,
    requested_priority,
)
from queueapp.policy.score import (
    AGING_EPOCH_SECONDS,
    Candidate,
    PolicyInvariantError,
    PolicySettings,
    RankedCandidate,
    ScoreTerms,
    best,
    check_invariant,
    rank,
    rank_key,
    score,
    swap_affinity,
)

__all__ = [
    "BATCH_SLOWDOWN_PER_EXTRA_REQUEST",
    "MAX_PARALLEL",
    "batched_seconds",
    "AGING_EPOCH_SECONDS",
    "BAND_ALIASES",
    "band_for_path",
    "body_without_priority",
    "Candidate",
    "Forecast",
    "ForecastGpu",
    "InFlight",
    "PLACEMENT_LOOKAHEAD",
    "Reservation",
    "TERMS",
    "PolicyInvariantError",
    "PolicySettings",
    "RankedCandidate",
    "ScoreTerms",
    "best",
    "check_invariant",
    "clamp_priority",
    "counterfactual_winners",
    "deciding_term",
    "occupancy_seconds",
    "parse_priority_header",
    "requested_priority",
    "placed_here",
    "play_forward",
    "rank",
    "rank_key",
    "score",
    "swap_affinity",
]
