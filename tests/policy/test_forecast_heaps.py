"""`play_forward` keeps line heads in heaps; it must play exactly as a full pass does."""

from collections import deque
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from queueapp.policy import Candidate, Forecast, PolicySettings, best, play_forward

NOW = 1_800_000_000.0


def reference_play(candidates, *, now, resident_model, settings, run, swap, stop_after=None):
    """The step rule with `best` over every line head (the original loop)."""
    lines = {}
    for c in sorted(candidates, key=lambda c: (c.submitted_at, c.job_id)):
        lines.setdefault(c.line, deque()).append(c)
    heads = {line: queue.popleft() for line, queue in lines.items()}
    clock, resident, order = now, resident_model, []
    while heads and (stop_after is None or len(order) < stop_after):
        chosen = best(
            heads.values(), now=clock, resident_model=resident, settings=settings
        ).candidate
        seconds = run[chosen.model] + (swap if chosen.model != resident else 0.0)
        order.append(Forecast(chosen.job_id, len(order) + 1, clock, seconds))
        for line, head in heads.items():
            if head.lane == chosen.lane and head.eligible_at < clock:
                heads[line] = replace(head, eligible_at=clock)
        if lines[chosen.line]:
            following = lines[chosen.line].popleft()
            heads[chosen.line] = replace(following, eligible_at=max(following.submitted_at, clock))
        else:
            del heads[chosen.line]
        resident = chosen.model
        clock += seconds
    return order


job = st.builds(
    lambda member, band, model, offset, lag, bonus: (member, band, model, offset, lag, bonus),
    st.integers(1, 4),
    st.sampled_from([-100, -20, 0, 100]),
    st.sampled_from(["a", "b", "c"]),
    # Whole seconds, some equal, so that keys tie and the job id decides.
    st.integers(0, 3600),
    st.sampled_from([0, 0, 30, 600]),
    st.sampled_from([0.0, 1.0, 2.0]),
)


@settings(max_examples=300, deadline=None)
@given(
    jobs=st.lists(job, min_size=1, max_size=60),
    resident=st.sampled_from([None, "a", "b"]),
    divisor=st.sampled_from([60.0, 0.5, 3600.0]),
    stop_after=st.sampled_from([None, 1, 7]),
)
def test_heaps_play_exactly_like_a_pass_over_every_head(jobs, resident, divisor, stop_after):
    bonus_of = {}
    candidates = []
    for job_id, (member, band, model, offset, lag, bonus) in enumerate(jobs, start=1):
        bonus = bonus_of.setdefault(member, bonus)  # a member has one tier
        submitted = NOW - offset
        candidates.append(
            Candidate(
                job_id=job_id,
                band=band,
                tier_bonus=bonus,
                model=model,
                submitted_at=submitted,
                eligible_at=submitted + lag,
                member_id=member,
            )
        )
    policy = PolicySettings(aging_divisor=divisor)
    run = {"a": 10.0, "b": 25.0, "c": 5.0}
    expected = reference_play(
        candidates,
        now=NOW,
        resident_model=resident,
        settings=policy,
        run=run,
        swap=7.0,
        stop_after=stop_after,
    )
    played = play_forward(
        candidates,
        now=NOW,
        gpu_free_at=NOW,
        resident_model=resident,
        settings=policy,
        run_seconds=lambda c: run[c.model],
        swap_seconds=lambda model: 7.0,
        stop_after=stop_after,
    )
    assert played == expected


def test_until_job_id_stops_where_the_full_play_places_it():
    candidates = [
        Candidate(i, band=(i % 3) * 100 - 100, tier_bonus=0.0, model="ab"[i % 2],
                  submitted_at=NOW - i, eligible_at=NOW - i, member_id=i % 4)
        for i in range(1, 40)
    ]  # fmt: skip
    kwargs = dict(
        now=NOW,
        gpu_free_at=NOW,
        resident_model="a",
        settings=PolicySettings(),
        run_seconds=lambda c: 10.0,
        swap_seconds=lambda model: 3.0,
    )
    full = play_forward(candidates, **kwargs)
    placed = play_forward(candidates, until_job_id=full[17].job_id, **kwargs)
    assert placed == full[:18]
