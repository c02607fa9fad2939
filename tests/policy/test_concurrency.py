"""A model's concurrencyLimit across llama-swap configs, and the `parallel`
settings above it (queueapp/policy/concurrency.py)."""

from queueapp.policy.concurrency import (
    DEFAULT_CONCURRENCY_LIMIT,
    ConcurrencyCap,
    ParallelOverLimit,
    concurrency_limit,
    lowest_concurrency_limit,
    parallels_over_limit,
)
from queueapp.policy.routing import routing_from_config


def config(**limits):
    return routing_from_config(
        {
            "models": {
                name: {"aliases": [f"{name}-alias"]}
                | ({"concurrencyLimit": limit} if limit is not None else {})
                for name, limit in limits.items()
            }
        }
    )


def test_a_model_is_found_by_id_or_alias_and_an_unset_limit_is_llama_swaps_default():
    routing = config(chat=3, image=None)
    assert concurrency_limit(routing, "chat") == 3
    assert concurrency_limit(routing, "chat-alias") == 3
    assert concurrency_limit(routing, "image") == DEFAULT_CONCURRENCY_LIMIT == 10
    assert concurrency_limit(routing, "video") is None


def test_the_lowest_limit_of_the_configs_that_list_the_model_binds():
    configs = {"gpu0": config(chat=6), "gpu1": config(chat=2), "gpu2": config(image=1)}
    assert lowest_concurrency_limit(configs, "chat") == ConcurrencyCap("gpu1", "chat", 2)
    assert lowest_concurrency_limit(configs, "chat-alias") == ConcurrencyCap(
        "gpu1", "chat-alias", 2
    )
    assert lowest_concurrency_limit(configs, "video") is None
    assert lowest_concurrency_limit({}, "chat") is None
    tied = {"gpu1": config(chat=2), "gpu0": config(chat=2)}
    assert lowest_concurrency_limit(tied, "chat") == ConcurrencyCap("gpu0", "chat", 2)


def test_every_parallel_above_a_gpus_limit_is_named_with_the_line_health_shows():
    configs = {"gpu0": config(chat=2, image=None), "gpu1": config(chat=8)}
    over = parallels_over_limit(configs, {"chat": 4, "image": 10, "video": 64})
    assert over == [ParallelOverLimit(gpu="gpu0", model="chat", parallel=4, limit=2)]
    assert str(over[0]) == (
        "gpu0: parallel 4 of chat is above its concurrencyLimit 2 in llama-swap's config; "
        "gpusched runs at most 2"
    )
    assert parallels_over_limit(configs, {"chat": 2}) == []
