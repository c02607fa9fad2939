"""A model's slots as its llama-swap config sets them, as its server reports
them, and the `parallel` worked out from both and the operator's value."""

from __future__ import annotations

import pytest

from queueapp.policy.occupancy import MAX_PARALLEL
from queueapp.policy.server_slots import (
    DEFAULT_PARALLEL,
    Parallel,
    ParallelSource,
    Slots,
    command_words,
    config_slots,
    gpu_slots,
    model_parallel,
    slots_from_command,
    slots_from_env,
    slots_from_props,
    with_config_slots,
    with_server_slots,
)

SERVER, CONFIG = ParallelSource.SERVER, ParallelSource.CONFIG


@pytest.mark.parametrize(
    ("command", "slots"),
    [
        ("llama-server --port ${PORT} -m m.gguf -np 3", 3),
        ("llama-server --parallel 4 -m m.gguf", 4),
        ("llama-server --parallel=5", 5),
        ("vllm serve org/model --max-num-seqs 16", 16),
        ("vllm serve org/model --max-num-seqs=8", 8),
        ("vllm serve org/model --max_num_seqs 12", 12),
        # The last flag wins, as in an argument parser.
        ("llama-server -np 2 --parallel 6", 6),
        # "auto" and nonsense say nothing: the server's own count follows.
        ("llama-server -np -1", None),
        ("llama-server -np 0", None),
        ("llama-server -np many", None),
        ("llama-server -np", None),
        ("llama-server -m m.gguf", None),
        # A flag that only starts like one is another flag.
        ("llama-server --parallel-tool-calls 3", None),
    ],
)
def test_the_slot_flags_of_a_command_line(command, slots):
    assert slots_from_command(command_words(command)) == slots


def test_command_words_drop_comments_and_join_continued_lines_as_llama_swap_does():
    command = """
      llama-server \\
        # -np 8 is commented out
        --port ${PORT} \\
        -np 2
        --alias "my model"
    """
    assert command_words(command) == [
        "llama-server",
        "--port",
        "${PORT}",
        "-np",
        "2",
        "--alias",
        "my model",
    ]
    # An unclosed quote (llama-swap refuses it) still gives words.
    assert command_words('llama-server -np 3 --alias "x') == [
        "llama-server",
        "-np",
        "3",
        "--alias",
        '"x',
    ]


def test_the_environment_variable_llama_server_reads():
    assert slots_from_env(["CUDA_VISIBLE_DEVICES=0", "LLAMA_ARG_N_PARALLEL=4"]) == 4
    assert slots_from_env(["LLAMA_ARG_N_PARALLEL=-1"]) is None
    assert slots_from_env(["LLAMA_ARG_N_PARALLEL"]) is None
    assert slots_from_env([]) is None


def test_a_config_gives_the_slots_of_each_model_that_sets_them():
    config = {
        "macros": {"llama": "llama-server --port ${PORT}", "np": 3},
        "models": {
            "chat": {"cmd": "${llama} -np ${np} -m chat.gguf"},
            # A model's own macro wins over the config's.
            "code": {"cmd": "${llama} -np ${np}", "macros": {"np": 2}},
            "embed": {"cmd": "${llama}", "env": ["LLAMA_ARG_N_PARALLEL=8"]},
            # The command line wins over the environment, as in llama.cpp.
            "both": {"cmd": "${llama} -np 5", "env": ["LLAMA_ARG_N_PARALLEL=8"]},
            "image": {"cmd": "sd-server --port ${PORT}"},
            "peer-less": "not a mapping",
        },
    }
    assert config_slots(config) == {"chat": 3, "code": 2, "embed": 8, "both": 5}
    assert config_slots({}) == {}
    assert config_slots({"models": ["a list"]}) == {}


def test_llama_servers_props_answer():
    assert slots_from_props({"total_slots": 4, "model_path": "/m.gguf"}) == 4
    for answer in ({"total_slots": 0}, {"total_slots": True}, {}, ["total_slots"], None, "4"):
        assert slots_from_props(answer) is None


def test_the_operators_value_wins_then_the_lowest_the_gpus_report_then_one():
    reported = [Slots(4, SERVER), Slots(2, CONFIG)]
    assert model_parallel(operator=6, per_gpu=reported, limit=None) == Parallel(
        6, ParallelSource.OPERATOR
    )
    # Several GPUs: the lowest binds, since a job may run on any of them.
    assert model_parallel(operator=None, per_gpu=reported, limit=None) == Parallel(2, CONFIG)
    # A tie goes to the server's count, the stronger source.
    tie = [Slots(3, CONFIG), Slots(3, SERVER)]
    assert model_parallel(operator=None, per_gpu=tie, limit=None) == Parallel(3, SERVER)
    assert model_parallel(operator=None, per_gpu=[], limit=None) == Parallel(
        DEFAULT_PARALLEL, ParallelSource.DEFAULT
    )


def test_every_value_is_bounded_by_the_concurrency_limit_and_gpuscheds_own_bound():
    assert model_parallel(operator=8, per_gpu=[], limit=4) == Parallel(4, ParallelSource.OPERATOR)
    assert model_parallel(operator=None, per_gpu=[Slots(10, SERVER)], limit=4) == Parallel(
        4, SERVER
    )
    assert model_parallel(operator=None, per_gpu=[Slots(512, SERVER)], limit=None) == Parallel(
        MAX_PARALLEL, SERVER
    )


def test_a_gpus_stored_slots_a_server_count_before_a_config_one():
    stored = {"chat": {"config": 3, "server": 4}, "code": {"config": 2}, "odd": {"config": 0}}
    assert gpu_slots(stored) == {"chat": Slots(4, SERVER), "code": Slots(2, CONFIG)}
    assert gpu_slots(None) == {} and gpu_slots({"bad": 3}) == {}


def test_a_config_read_keeps_a_servers_count_only_where_the_configs_held():
    stored = {
        "chat": {"config": 3, "server": 3},
        "code": {"config": 2, "server": 2},
        "gone": {"config": 1},
        "told": {"server": 4},  # its config never set it
    }
    after = with_config_slots(stored, {"chat": 3, "code": 4, "new": 2})
    assert after == {
        "chat": {"config": 3, "server": 3},
        # Changed: llama-swap restarts it, and its server is asked again.
        "code": {"config": 4},
        "told": {"server": 4},
        "new": {"config": 2},
    }
    assert stored["code"] == {"config": 2, "server": 2}  # the input is left as it was
    assert with_server_slots(after, "code", 4)["code"] == {"config": 4, "server": 4}
    assert with_server_slots({}, "x", 2) == {"x": {"server": 2}}
