"""Playing the queue forward on a GPU whose model runs several jobs at once
(its `parallel`): free slots go at once, another model drains the GPU first,
and with every model at 1 nothing changes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueapp.policy import (
    Candidate,
    ForecastGpu,
    InFlight,
    PolicySettings,
    batched_seconds,
    play_forward,
)
from tests.factories import NOW, candidate

RUN = 10.0


def forward(candidates, gpus, **kwargs):
    return play_forward(
        candidates,
        now=NOW,
        gpu_free_at=NOW,
        resident_model=None,
        gpus=gpus,
        settings=PolicySettings(),
        run_seconds=lambda c: RUN,
        swap_seconds=lambda model: 5.0,
        **kwargs,
    )


def busy_gpu(*ends: float, parallel: dict[str, int], model: str = "m") -> ForecastGpu:
    """One GPU running jobs of `model` that end `ends` seconds from now."""
    return ForecastGpu(
        "gpu0",
        free_at=NOW + max(ends),
        resident_model=model,
        in_flight=tuple(InFlight(model, NOW + end) for end in ends),
        parallel=parallel,
    )


def starts(plan):
    return {f.job_id: (f.estimated_start - NOW, f.in_flight) for f in plan}


def test_two_running_of_four_slots_leave_two_for_queued_jobs_now_the_third_waits():
    gpu = busy_gpu(4.0, 7.0, parallel={"m": 4})
    queued = [candidate(i, 0, model="m", waited=10 - i) for i in range(1, 4)]
    plan = forward(queued, [gpu])
    assert [f.job_id for f in plan] == [1, 2, 3]
    assert starts(plan)[1] == (0.0, 3)
    assert starts(plan)[2] == (0.0, 4)
    # The first running job's end frees the next slot; four in flight again.
    assert starts(plan)[3] == (4.0, 4)
    # Each is slowed by what shares the GPU with it, and no swap is paid.
    assert [f.estimated_seconds for f in plan] == [
        batched_seconds(RUN, 3),
        batched_seconds(RUN, 4),
        batched_seconds(RUN, 4),
    ]


def test_the_duration_at_a_level_comes_from_the_function_given():
    gpu = busy_gpu(4.0, parallel={"m": 4})
    plan = forward(
        [candidate(1, 0, model="m")],
        [gpu],
        run_seconds_in_flight=lambda c, in_flight: 100.0 * in_flight,
    )
    assert [(f.estimated_start - NOW, f.estimated_seconds) for f in plan] == [(0.0, 200.0)]


def test_a_higher_band_job_of_another_model_drains_the_gpu_before_anyone_else_starts():
    gpu = busy_gpu(4.0, 7.0, parallel={"m": 4})
    other = candidate(1, 100, model="v", waited=1)
    behind = [candidate(10 + i, 0, model="m", waited=50 - i) for i in range(3)]
    plan = forward([other, *behind], [gpu])
    by_id = starts(plan)
    # No slot goes to m while v waits: v starts when the last m job ends.
    assert by_id[1] == (7.0, 1)
    assert plan[0].estimated_seconds == RUN + 5.0  # v is loaded first
    # Then m is loaded again and shares the GPU from its first job on.
    assert [by_id[10 + i] for i in range(3)] == [(22.0, 1), (22.0, 2), (22.0, 3)]


def test_a_drain_is_decided_again_when_another_gpu_takes_the_job():
    """Another GPU takes the job of another model meanwhile: the draining
    GPU decides again then, as the claim does at each claim, and gives its
    free slots to the model in flight at once."""
    gpu0 = busy_gpu(6.0, 8.0, parallel={"m": 4})
    gpu1 = ForecastGpu("gpu1", free_at=NOW + 2.0, resident_model="v", runs_models=frozenset("v"))
    other = candidate(1, 100, model="v", waited=1)
    behind = [candidate(10 + i, 0, model="m", waited=50 - i) for i in range(2)]
    plan = forward([other, *behind], [gpu0, gpu1])
    assert starts(plan)[1] == (2.0, 1)
    assert {f.job_id: f.gpu for f in plan}[1] == "gpu1"
    # gpu0 drained only until gpu1 took v (2 s), then filled its slots with m.
    assert starts(plan)[10] == (2.0, 3)
    assert starts(plan)[11] == (2.0, 4)


def test_a_full_gpu_gives_its_next_slot_when_its_first_job_ends():
    gpu = busy_gpu(3.0, 9.0, parallel={"m": 2})
    plan = forward([candidate(1, 0, model="m")], [gpu])
    assert starts(plan)[1] == (3.0, 2)


def test_a_member_at_their_running_limit_shares_the_gpu_it_holds():
    """The limit counts GPUs held: a member's jobs may fill the slots of
    the GPU their running job holds, not take another GPU."""
    gpu0 = busy_gpu(4.0, parallel={"m": 4})
    gpu1 = ForecastGpu("gpu1", free_at=NOW, resident_model="m", parallel={"m": 4})
    anns = [candidate(1, 0, model="m", member=1, waited=9), candidate(2, 0, model="m", member=1)]
    plan = forward(
        anns, [gpu0, gpu1], running_limit=lambda member: 1, running_until={1: [(NOW + 4.0, "gpu0")]}
    )
    assert {f.job_id: f.gpu for f in plan} == {1: "gpu0", 2: "gpu0"}
    assert starts(plan) == {1: (0.0, 2), 2: (0.0, 3)}


def test_a_gpu_idle_with_its_model_loaded_fills_its_slots_at_once():
    gpu = ForecastGpu("gpu0", free_at=NOW, resident_model="m", parallel={"m": 3})
    plan = forward([candidate(i, 0, model="m") for i in range(1, 5)], [gpu])
    assert [starts(plan)[i] for i in range(1, 5)] == [(0.0, 1), (0.0, 2), (0.0, 3), (RUN, 3)]


job = st.tuples(
    st.integers(1, 4),  # member
    st.sampled_from([-100, 0, 100]),  # band
    st.sampled_from(["m", "v"]),  # model
    st.integers(0, 600),  # waited
)


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(job, min_size=1, max_size=30),
    ends=st.lists(st.sampled_from([0.0, 3.0, 12.0]), max_size=1),
    two_gpus=st.booleans(),
    limited=st.booleans(),
)
def test_with_every_model_at_one_the_in_flight_jobs_play_as_free_at_does(
    jobs, ends, two_gpus, limited
):
    """A GPU told its running job (in flight) plays as one told when it frees."""
    candidates = [
        Candidate(
            job_id=i,
            band=band,
            tier_bonus=0.0,
            model=model,
            submitted_at=NOW - waited,
            eligible_at=NOW - waited,
            member_id=member,
        )
        for i, (member, band, model, waited) in enumerate(jobs, start=1)
    ]
    free_at = NOW + (ends[0] if ends else 0.0)
    told_free_at = [ForecastGpu("gpu0", free_at, "m")]
    told_in_flight = [
        ForecastGpu(
            "gpu0",
            free_at,
            "m",
            in_flight=tuple(InFlight("m", NOW + end) for end in ends),
            parallel={"v": 1},
        )
    ]
    if two_gpus:
        told_free_at.append(ForecastGpu("gpu1", NOW + 5.0, "v"))
        told_in_flight.append(ForecastGpu("gpu1", NOW + 5.0, "v"))
    limits = {"running_limit": lambda member: 1} if limited else {}
    assert forward(candidates, told_in_flight, **limits) == forward(
        candidates, told_free_at, **limits
    )


@pytest.mark.parametrize("parallel", [{}, {"m": 1}])
def test_parallel_one_runs_one_job_at_a_time(parallel):
    gpu = ForecastGpu("gpu0", free_at=NOW, resident_model="m", parallel=parallel)
    plan = forward([candidate(i, 0, model="m") for i in range(1, 4)], [gpu])
    assert [starts(plan)[i] for i in range(1, 4)] == [(0.0, 1), (RUN, 1), (2 * RUN, 1)]
