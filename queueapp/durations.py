"""What jobs take: run and swap seconds learned from finished jobs.

Durations are decayed averages per (model, path) and concurrency level (how
many jobs shared the GPU as the run started), kept in `RunStats` and updated
in the transaction that finishes a job (services/run_stats.py: this module
only reads). The forecast (queueapp/eta.py), the claim's reservations and
borrowing guard (queueapp/policy/facts.py) and `why` read them here.
"""

from __future__ import annotations

from queueapp.models import ModelSetting, RunStats
from queueapp.policy import batched_seconds
from queueapp.policy.expected import DEFAULT_RUN_SECONDS, Expected, expected_run
from queueapp.policy.facts import models_shorter_than
from queueapp.policy.size_fit import SizeFitSums
from queueapp.upstream.client import is_preload


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Durations:
    """Run and swap seconds per model and path, from RunStats.

    Alone (concurrency 1), with fallbacks: the same model on other paths,
    then all models, then DEFAULT_RUN_SECONDS. With `concurrency` jobs
    sharing the GPU, a level's own average once one is learned; before, the
    nearest learned level of the same model and path, else the alone figure,
    scaled as a batching server slows (`policy.batched_seconds`). Swaps are
    learned alone: a model is loaded only onto a GPU with nothing in flight.
    """

    def __init__(
        self, rows: list[RunStats], typical_seconds: dict[str, float] | None = None
    ) -> None:
        # The operator's figure per model, used before any run is learned.
        self.typical_seconds = typical_seconds or {}
        self.levels: dict[tuple[str, str], dict[int, RunStats]] = {}
        # A preload (upstream.client.is_preload) runs nothing: its cold run
        # is its model's swap, and it says nothing of the model's runs.
        self.preload_swaps = {
            row.model: row.cold_seconds
            for row in rows
            if is_preload(row.path) and row.concurrency == 1 and row.cold_seconds is not None
        }
        rows = [row for row in rows if not is_preload(row.path)]
        for row in rows:
            self.levels.setdefault((row.model, row.path), {})[row.concurrency] = row
        alone = [row for row in rows if row.concurrency == 1]
        self.rows = {(row.model, row.path): row for row in alone}
        # Per model and path, the line of run seconds by size, once runs enough are learned.
        self.lines = {key: _sums(row).line() for key, row in self.rows.items()}
        warm = [row.warm_seconds for row in alone if row.warm_seconds is not None]
        self.typical_run = _mean(warm) or DEFAULT_RUN_SECONDS
        swaps = [s for row in alone if (s := self._swap(row)) is not None]
        self.typical_swap = _mean([*swaps, *self.preload_swaps.values()]) or 0.0

    @classmethod
    def load(cls) -> Durations:
        typical = ModelSetting.objects.filter(typical_seconds__isnull=False)
        return cls(
            list(RunStats.objects.all()),
            {
                row.name: row.typical_seconds
                for row in typical.only("name", "typical_seconds")
                if row.typical_seconds is not None
            },
        )

    def expected(self, model: str, path: str, size: float | None, size_text: str = "") -> Expected:
        """A job's run alone, from its size where its model and path's line
        has runs enough, else their mean, else the operator's typical
        seconds (queueapp/policy/expected.py)."""
        if is_preload(path):
            return expected_run(size=None, line=None, model_mean=0.0, typical_seconds=None)
        learned = self._learned(model, path).get(1)
        return expected_run(
            size=size,
            size_text=size_text,
            line=self.lines.get((model, path)),
            model_mean=self._same_model_mean(model) if learned is None else learned,
            typical_seconds=self.typical_seconds.get(model),
        )

    def _same_model_mean(self, model: str) -> float | None:
        """The warm runs' mean over the model's other paths: its figure on a
        path it has not run yet."""
        return _mean(
            [r.warm_seconds for r in self.rows.values() if r.model == model and r.warm_seconds]
        )

    def job_run_seconds(
        self, model: str, path: str, size: float | None, concurrency: int = 1
    ) -> float:
        """A job's run: from its size on its model and path's line, once
        learned, at its concurrency as the model's runs scale with it; else
        what `run_seconds` gives any job of the model and path."""
        at_level = self.run_seconds(model, path, concurrency)
        line = self.lines.get((model, path))
        if size is None or line is None or is_preload(path):
            return at_level
        alone = self.run_seconds(model, path)
        return line.median(size) * (at_level / alone if alone > 0 else 1.0)

    def learned_runs(self, model: str, path: str) -> float:
        """The runs alone of `model` on `path` its figures were learned from."""
        row = self.rows.get((model, path))
        return 0.0 if row is None else float(row.warm_samples + row.cold_samples)

    def expected_per_model(self) -> dict[str, float]:
        """Per learned model, its longest learned path's run alone: what
        `policy.facts.models_shorter_than` compares with a bound. A model that
        has not finished a run yet is not among them."""
        longest: dict[str, float] = {}
        for model, path in self.levels:
            seconds = self.run_seconds(model, path)
            longest[model] = max(seconds, longest.get(model, seconds))
        return longest

    def models_shorter_than(self, seconds: float) -> list[str]:
        """The models known to run under `seconds` (`models_shorter_than`)."""
        return sorted(models_shorter_than(self.expected_per_model(), seconds) or ())

    @staticmethod
    def _swap(row: RunStats) -> float | None:
        if row.warm_seconds is None or row.cold_seconds is None:
            return None
        return max(0.0, row.cold_seconds - row.warm_seconds)

    def run_seconds(self, model: str, path: str, concurrency: int = 1) -> float:
        """A run without its swap; a preload's is none: all it takes is its swap."""
        if is_preload(path):
            return 0.0
        level = max(1, concurrency)
        learned = self._learned(model, path)
        if level in learned:
            return learned[level]
        if learned:
            # Ties go to the lower level: it has run more often.
            nearest = min(learned, key=lambda known: (abs(known - level), known))
            return learned[nearest] * batched_seconds(1.0, level) / batched_seconds(1.0, nearest)
        return batched_seconds(self._model_figure(model) or self.typical_run, level)

    def _model_figure(self, model: str) -> float | None:
        """A run of `model` on a path it has not run: its other paths' mean,
        else the operator's typical run; None: nothing is known of it."""
        return self._same_model_mean(model) or self.typical_seconds.get(model)

    def knows(self, model: str, path: str) -> bool:
        """Whether a run of `model` on `path` has an estimate; else
        `run_seconds` gives the typical run of every model, a guess."""
        return (
            is_preload(path)
            or bool(self._learned(model, path))
            or self._model_figure(model) is not None
        )

    def _learned(self, model: str, path: str) -> dict[int, float]:
        """Per concurrency level, what runs of this model and path took."""
        learned: dict[int, float] = {}
        for level, row in self.levels.get((model, path), {}).items():
            if row.warm_seconds is not None:
                learned[level] = row.warm_seconds
            elif row.cold_seconds is not None:
                learned[level] = max(0.0, row.cold_seconds - self.swap_seconds(model))
        return learned

    def swap_seconds(self, model: str) -> float:
        swaps = [
            s
            for row in self.rows.values()
            if row.model == model and (s := self._swap(row)) is not None
        ]
        if model in self.preload_swaps:
            swaps.append(self.preload_swaps[model])
        # A swap measured as free (0.0) is a measurement, not a missing one.
        own = _mean(swaps)
        return self.typical_swap if own is None else own


def _sums(row: RunStats) -> SizeFitSums:
    return SizeFitSums(
        weight=row.fit_weight,
        x=row.fit_x,
        y=row.fit_y,
        xx=row.fit_xx,
        xy=row.fit_xy,
        yy=row.fit_yy,
    )
