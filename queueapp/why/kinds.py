"""What a part of the wait can be, and the words for the score term that put
another job ahead: the answer's fixed vocabulary, shared by the parts and the
summary sentence."""

from __future__ import annotations

from enum import StrEnum


class PartKind(StrEnum):
    """What held this job back during one stretch of its wait."""

    RUNNING_WHEN_SUBMITTED = "running_when_submitted"
    DISPATCHED_AHEAD = "dispatched_ahead"
    # The job itself ran here or on another GPU, then went back to the queue
    # (cut by an unload, refused by llama-swap, or its dispatcher stopped).
    OWN_EARLIER_ATTEMPT = "own_earlier_attempt"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    DISPATCHER_UNAVAILABLE = "dispatcher_unavailable"
    DRAIN = "drain"
    RUNNING_LIMIT = "running_limit"
    GPU_IDLE = "gpu_idle"


TERM_WORDS = {
    "band": "a higher band",
    "aging": "waited longer",
    "fairness": "its member's turn (your own jobs had just run)",
    # Another of the member's own lines (another model, same band) went first.
    "your other line": "your own job of another model took its turn",
    "tier_bonus": "a higher tier",
    "swap_affinity": "its model was already loaded",
    "shortness": "it was expected to be shorter (shortest_first_weight)",
    "submission order": "submitted earlier",
    "your earlier job": "your own earlier job",
}
