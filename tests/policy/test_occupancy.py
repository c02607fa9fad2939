"""How long a job holds the GPU: the swap rule both simulators charge."""

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import occupancy_seconds

ROOT = Path(__file__).resolve().parents[2]


def test_a_job_of_the_resident_model_holds_the_gpu_for_its_run_only():
    assert occupancy_seconds(resident="a", model="a", seconds=2.0, swap_seconds=5.0) == 2.0


def test_a_job_of_another_model_pays_one_cold_load_first():
    assert occupancy_seconds(resident="a", model="b", seconds=2.0, swap_seconds=5.0) == 7.0


def test_the_first_job_on_an_empty_gpu_pays_a_cold_load():
    assert occupancy_seconds(resident=None, model="a", seconds=2.0, swap_seconds=5.0) == 7.0


@given(
    resident=st.sampled_from(["a", "b", None]),
    model=st.sampled_from(["a", "b"]),
    seconds=st.floats(min_value=0, max_value=1e6),
    swap_seconds=st.floats(min_value=0, max_value=1e6),
)
def test_a_swap_costs_swap_seconds_exactly_when_the_model_changes(
    resident, model, seconds, swap_seconds
):
    held = occupancy_seconds(
        resident=resident, model=model, seconds=seconds, swap_seconds=swap_seconds
    )
    assert held == (seconds if resident == model else seconds + swap_seconds)
