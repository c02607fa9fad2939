"""The simulator's command line: ``python -m queueapp.upstream.simulator`` and
``manage.py simulate_llama_swap`` share these options and this loop."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from queueapp.policy.occupancy import MAX_PARALLEL
from queueapp.upstream.simulator.config import load_config
from queueapp.upstream.simulator.server import LlamaSwapSimulator


def _model_spec(text: str) -> tuple[str, float]:
    name, sep, seconds = text.rpartition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if not sep or not name or value < 0:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS with SECONDS >= 0, got {text!r}")
    return name, value


def _slots(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(
            f"expected an integer in [1, {MAX_PARALLEL}], got {text!r}"
        )
    return value


def _model_slots(text: str) -> tuple[str, int]:
    name, sep, slots = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=N, got {text!r}")
    try:
        return name, _slots(slots)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected NAME=N with N an integer in [1, {MAX_PARALLEL}], got {text!r}"
        ) from None


def _model_ttl(text: str) -> tuple[str, int]:
    name, sep, seconds = text.rpartition("=")
    try:
        value = int(seconds)
    except ValueError:
        value = -1
    if not sep or not name or value < 0:
        raise argparse.ArgumentTypeError(
            f"expected NAME=SECONDS with SECONDS a whole number >= 0, got {text!r}"
        )
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``python -m ...simulator`` and the ``simulate_llama_swap`` command."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9292, help="0 picks a free port")
    parser.add_argument(
        "--config",
        default=None,
        metavar="PATH",
        help="a llama-swap YAML config: serve its models with its routing (config.py)",
    )
    parser.add_argument("--model", action="append", type=_model_spec, metavar="NAME=SECONDS")
    parser.add_argument("--swap-seconds", type=float, default=1.0, help="cold-load cost")
    parser.add_argument("--accept-any-model", action="store_true", help="serve unknown models too")
    parser.add_argument("--default-seconds", type=float, default=1.0, help="for unknown models")
    parser.add_argument("--initial-model", default=None, help="model resident at start")
    parser.add_argument(
        "--parallel",
        type=_slots,
        default=1,
        metavar="N",
        help="requests of the resident model in flight at once, for every model",
    )
    parser.add_argument(
        "--model-parallel",
        action="append",
        type=_model_slots,
        metavar="NAME=N",
        help="--parallel for one model (repeatable)",
    )
    parser.add_argument(
        "--ttl",
        action="append",
        type=_model_ttl,
        metavar="NAME=SECONDS",
        help="llama-swap's ttl for one model: unload it after that long idle (repeatable)",
    )
    parser.add_argument(
        "--stop-seconds", type=float, default=0.0, help="how long an unload's stop takes"
    )
    parser.add_argument(
        "--no-events",
        dest="events",
        action="store_false",
        help="start with /api/events silent (POST /sim/events turns it on)",
    )
    parser.add_argument(
        "--size-scaled",
        action="store_true",
        help="a model's seconds are for a reference request; a request's size scales them "
        "(frames, steps, pixels, max tokens, input length: sizing.py)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="one of llama-swap's apiKeys: every route but /health then needs one (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m queueapp.upstream.simulator",
        description=(
            "Simulated llama-swap: one GPU, one resident model, --parallel slots; "
            "with --config, a llama-swap config's models and routing."
        ),
    )
    add_arguments(parser)
    return parser


def simulator_from_args(
    args: argparse.Namespace, *, on_request: Callable[[dict[str, Any]], None] | None = None
) -> LlamaSwapSimulator:
    """The simulator the options describe, not started; ValueError when they disagree (an
    option naming a model it does not serve) or the ``--config`` is refused (`ConfigError`,
    naming the key)."""
    names = ("default_seconds", "accept_any_model", "swap_seconds", "initial_model", "parallel")
    options = {name: getattr(args, name) for name in (*names, "stop_seconds", "events")}
    options["size_scaled"] = getattr(args, "size_scaled", False)
    config = None if getattr(args, "config", None) is None else load_config(args.config)
    return LlamaSwapSimulator(
        args.host,
        args.port,
        dict(args.model or []),
        parallel_models=dict(args.model_parallel or []),
        ttl=dict(args.ttl or []),
        on_request=on_request,
        api_keys=args.api_key or (),
        config=config,
        **options,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; prints the listening line, then one JSON line per request."""
    print_lock = threading.Lock()

    def report(entry: dict[str, Any]) -> None:
        line = json.dumps({k: v for k, v in entry.items() if k != "body"})
        with print_lock:
            print(line, flush=True)

    try:
        sim = simulator_from_args(args, on_request=report).start()
    except (OSError, ValueError) as exc:
        print(f"llama-swap simulator: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
        except ValueError:  # not the main thread: the caller has to stop us another way
            pass
    try:
        print(f"llama-swap simulator listening on {sim.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        sim.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
