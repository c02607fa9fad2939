"""The GPUs of a simulated run, as `manage.py simulate` gives them: their
names (those the live system gives bare upstream URLs), each one's
reservation (`--reserve`) and each model's parallel slots (`--parallel`),
read and checked with a message that says what is wrong."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from queueapp.policy import BAND_ALIASES, Reservation
from queueapp.policy.occupancy import MAX_PARALLEL

RESERVATION_EXAMPLE = "gpu0:min_band=0,max_expected_seconds=60"
PARALLEL_EXAMPLE = "chat-small=4"


class ReservationError(ValueError):
    """A --reserve argument that cannot be read or names no GPU of the run."""


class ParallelError(ValueError):
    """A --parallel argument that cannot be read, or slots out of range."""


def check_parallel(parallel: Mapping[str, int]) -> dict[str, int]:
    """The slots per model, each a whole number in [1, MAX_PARALLEL]."""
    for model, slots in parallel.items():
        if isinstance(slots, bool) or not isinstance(slots, int):
            raise ParallelError(f"parallel for {model}: {slots!r} is not a whole number")
        if not 1 <= slots <= MAX_PARALLEL:
            raise ParallelError(
                f"parallel for {model} must be between 1 and {MAX_PARALLEL}, got {slots}"
            )
    return dict(parallel)


def parse_parallel(texts: Sequence[str]) -> dict[str, int]:
    """`["chat-small=4", "chat-large=2"]` -> {"chat-small": 4, "chat-large": 2}."""
    parallel: dict[str, int] = {}
    for text in texts:
        model, sep, raw = text.partition("=")
        model, raw = model.strip(), raw.strip()
        if not sep or not model or not raw:
            raise ParallelError(f"bad parallel {text!r}: expected MODEL=N, e.g. {PARALLEL_EXAMPLE}")
        try:
            slots = int(raw)
        except ValueError:
            raise ParallelError(
                f"parallel for {model}: {raw!r} is not a whole number between 1 and {MAX_PARALLEL}"
            ) from None
        if model in parallel:
            raise ParallelError(f"parallel for {model} is given twice; give it once")
        parallel[model] = slots
    return check_parallel(parallel)


def describe_parallel(parallel: Mapping[str, int]) -> str:
    return ", ".join(f"{model}={slots}" for model, slots in parallel.items())


@dataclass(frozen=True)
class GpuSpec:
    name: str
    reservation: Reservation | None = None


def gpu_names(count: int) -> list[str]:
    """gpu0, gpu1, ...: the names the live system gives bare upstream URLs."""
    return [f"gpu{index}" for index in range(count)]


def gpu_specs(count: int, reservations: Mapping[str, Reservation] | None = None) -> list[GpuSpec]:
    if count < 1:
        raise ValueError(f"at least one GPU, got {count}")
    names = gpu_names(count)
    reservations = reservations or {}
    unknown = sorted(set(reservations) - set(names))
    if unknown:
        raise ReservationError(
            f"no GPU named {', '.join(unknown)} among the {count} simulated ({', '.join(names)})"
        )
    return [GpuSpec(name, reservations.get(name)) for name in names]


def parse_reservation(text: str) -> tuple[str, Reservation]:
    """`gpu0:min_band=0,max_expected_seconds=60` -> ("gpu0", Reservation(0, 60.0)).

    A band is a number or a priority alias (interactive, normal, batch)."""
    name, sep, settings = text.partition(":")
    name = name.strip()
    if not sep or not name or not settings.strip():
        raise ReservationError(
            f"bad reservation {text!r}: expected GPU:SETTING=VALUE,... e.g. {RESERVATION_EXAMPLE}"
        )
    values: dict[str, str] = {}
    for item in settings.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise ReservationError(
                f"bad reservation {text!r}: {item.strip()!r} is not SETTING=VALUE"
            )
        if key not in ("min_band", "max_expected_seconds"):
            raise ReservationError(
                f"unknown reservation setting {key!r}; choose from min_band, max_expected_seconds"
            )
        if key in values:
            raise ReservationError(f"{key} is given twice in {text!r}")
        values[key] = value
    min_band = None
    if "min_band" in values:
        raw = values["min_band"]
        if raw.lower() in BAND_ALIASES:
            min_band = BAND_ALIASES[raw.lower()]
        else:
            try:
                min_band = int(raw)
            except ValueError:
                raise ReservationError(
                    f"min_band: {raw!r} is not a whole number or a priority alias "
                    f"({', '.join(BAND_ALIASES)})"
                ) from None
    max_seconds = None
    if "max_expected_seconds" in values:
        raw = values["max_expected_seconds"]
        try:
            max_seconds = float(raw)
        except ValueError:
            raise ReservationError(f"max_expected_seconds: {raw!r} is not a number") from None
        if not max_seconds >= 0:
            raise ReservationError(f"max_expected_seconds must be >= 0, got {raw}")
    return name, Reservation(min_band=min_band, max_expected_seconds=max_seconds)


def parse_reservations(texts: Sequence[str]) -> dict[str, Reservation]:
    reservations: dict[str, Reservation] = {}
    for text in texts:
        name, reservation = parse_reservation(text)
        if name in reservations:
            raise ReservationError(f"{name} is reserved twice; give its settings in one --reserve")
        reservations[name] = reservation
    return reservations
