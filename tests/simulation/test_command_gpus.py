"""`manage.py simulate --gpus N` and `--reserve`."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queueapp.simulation.traces import TRACES_DIR

LIVE_CHECK = str(TRACES_DIR / "live-check.jsonl")


def simulate(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out)
    return out.getvalue()


def rows(output: str) -> list[str]:
    return [line.split("|")[1].strip() for line in output.splitlines() if line.startswith("| ")]


def without_timing(output: str) -> list[str]:
    return [line for line in output.splitlines() if not line.startswith("simulated in")]


def test_several_gpus_compare_the_balancers_and_gpusched_with_and_without_a_reservation():
    output = simulate(LIVE_CHECK, "--gpus", "2")
    assert output.startswith("trace live-check: 14 jobs over 1.0 s, 3 members, swap 0.1 s, on 2")
    assert "gpusched+reserve reserves gpu0 (min_band=0,max_expected_seconds=60)" in output
    table = rows(output)
    assert table[0] == "policy"
    assert table[1:6] == [
        "round-robin+collate",
        "least-busy+collate",
        "gpusched",
        "gpusched-strict",
        "gpusched+reserve",
    ]
    assert "Cobham" not in output  # one server's bound: not shown for several
    assert "gpu0 " in output and "gpu1 " in output  # busy share per GPU
    assert "gpusched: dispatches whose order a term changed" in output


def test_one_gpu_is_todays_output():
    assert without_timing(simulate(LIVE_CHECK, "--gpus", "1")) == without_timing(
        simulate(LIVE_CHECK)
    )


def test_reserve_sets_the_reserved_policys_gpus():
    output = simulate(
        LIVE_CHECK,
        "--gpus",
        "3",
        "--policy",
        "gpusched+reserve",
        "--reserve",
        "gpu1:min_band=interactive",
        "--reserve",
        "gpu2:max_expected_seconds=30",
    )
    assert "reserves gpu1 (min_band=100), gpu2 (max_expected_seconds=30)" in output
    assert "gpusched+reserve" in rows(output)


def test_a_one_gpu_policy_runs_on_one_shared_queue_of_several_gpus():
    output = simulate(LIVE_CHECK, "--gpus", "2", "--policy", "fifo")
    assert "| fifo " in output and "gpusched" not in rows(output)


def test_a_lone_reserved_gpu_says_which_jobs_never_started():
    output = simulate(LIVE_CHECK, "--policy", "gpusched+reserve", "--reserve", "gpu0:min_band=0")
    assert "gpusched+reserve: 5 jobs never started" in output  # the trace's batch jobs
    assert "on 1 GPU, serving every model" in output


def test_sweep_on_several_gpus():
    output = simulate(LIVE_CHECK, "--gpus", "2", "--sweep", "aging_divisor=30,60")
    assert "gpusched on 2 GPUs, each combination of the swept settings" in output
    assert len([line for line in output.splitlines() if line.startswith("| ")]) == 1 + 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0"], "--gpus must be at least 1, got 0"),
        (["--gpus", "2", "--reserve", "gpu0"], "bad reservation 'gpu0': expected GPU:SETTING"),
        (["--gpus", "2", "--reserve", "gpu2:min_band=0"], "no GPU named gpu2 among the 2"),
        (["--reserve", "gpu0:min_band=0"], "--reserve sets gpusched\\+reserve's reservations"),
        (
            ["--gpus", "2", "--policy", "gpusched", "--reserve", "gpu0:min_band=0"],
            "add --policy gpusched\\+reserve",
        ),
        (
            ["--gpus", "2", "--sweep", "aging_divisor=30", "--reserve", "gpu0:min_band=0"],
            "--sweep runs gpusched without a reservation",
        ),
    ],
)
def test_bad_gpu_options_are_refused_with_what_is_wrong(args, message):
    with pytest.raises(CommandError, match=message):
        simulate(LIVE_CHECK, *args)
