"""What a claim reads from a study: the `StudyContext` protocol every claim module is written
against, and the typed data it returns. `normlab.study.experiments.StudyFolder` is the context
that trains, probes and caches in a study's folder; the claim tests use one planted fake
(`tests/fake_study.py`). JSON appears only at the cache boundary (`cached`, `from_json`).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from normlab.study.profiles import Profile
from normlab.study.schema import Pretrained

Log = Callable[[str], None]

# `normlab study`'s exit status when it stopped at its time limit (EX_TEMPFAIL of sysexits.h:
# "try again later"); Ctrl-C gives 130.
EX_TEMPFAIL = 75


class TimeLimitReached(KeyboardInterrupt):
    """The study stopped at its time limit before starting a unit of work (`TimeLimit.check`).
    A KeyboardInterrupt, so that it stops the study the way Ctrl-C does: past every claim's own
    error handling, with what finished kept."""


class TimeLimit:
    """A study's `--time-limit`: `seconds` of wall time from now (on `clock`).

    The units of a study's work are a round of training runs trained together
    (`StudyFolder.train`), a cached measurement (a ladder at init, a probe, `StudyFolder.cached`)
    and a claim. `check` refuses to start a unit whose estimated seconds (`runs_seconds` of its
    runs, measured on the study's device; 0 for the others) exceed what is left, by raising
    `TimeLimitReached`. `armed` interrupts a unit still in progress at the limit as Ctrl-C does
    (a SIGINT to this process: the runs in progress checkpoint, a re-run resumes them).
    `reached` says why the study stopped (None while it has not)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic,
                 runs_seconds: Callable[[list[Any]], float] | None = None) -> None:
        self.seconds, self.clock = seconds, clock
        self.end = clock() + seconds
        self.runs_seconds = runs_seconds or (lambda _configs: 0.0)
        self.reached: str | None = None
        self._lock = threading.Lock()
        self._armed = False

    def left(self) -> float:
        return self.end - self.clock()

    def check(self, unit: str, seconds: float = 0.0) -> None:
        """Go on with `unit` (estimated to take `seconds`) only if it ends within the limit."""
        left = self.left()
        if left <= 0 or seconds > left:
            self.reached = (f"{unit} would take about {seconds:.0f} s, {max(0.0, left):.0f} s "
                            "are left" if left > 0 else f"no time left to start {unit}")
            raise TimeLimitReached(self.reached)

    @contextmanager
    def armed(self) -> Iterator[TimeLimit]:
        """Within this block, the limit interrupts the main thread as Ctrl-C would."""
        def fire() -> None:
            with self._lock:
                if self._armed:
                    self.reached = "the time limit was reached in the middle of a unit of work"
                    _thread.interrupt_main(signal.SIGINT)

        timer = threading.Timer(max(0.0, self.left()), fire)
        timer.daemon = True
        self._armed = True
        timer.start()
        try:
            yield self
        finally:
            with self._lock:
                self._armed = False
            timer.cancel()


@dataclass(frozen=True)
class RunRecord:
    """What the claims read of one training run. `score` is its final validation loss, or the
    uniform predictor's for a run that diverged; `failed`: it stalled or diverged (a result to
    report, never a trained model to compare)."""

    run_id: str
    seed: int
    outcome: str | None
    score: float
    failed: bool
    val_loss: float | None = None
    train_loss: float | None = None
    reason: str | None = None
    step: int | None = None
    token_share: float | None = None
    lr: float | None = None
    warmup: int | None = None


@dataclass(frozen=True)
class TunedGrid:
    """One family over its lr grid (`StudyContext.tuned`): every seed at every lr, in grid order.
    `best_lr` is the best mean score among the cells where every seed trained (among all cells
    when none did); `bracketed`: that cell lies inside the grid."""

    family: str
    warmup: int
    lrs: tuple[float, ...]
    records: Mapping[float, tuple[RunRecord, ...]]
    best_lr: float
    bracketed: bool
    extensions: tuple[str, ...] = ()

    @property
    def best(self) -> tuple[RunRecord, ...]:
        return self.records[self.best_lr]

    @property
    def mean_score(self) -> dict[float, float]:
        return {lr: sum(r.score for r in rs) / len(rs) for lr, rs in self.records.items()}

    @property
    def all_stalled(self) -> bool:
        return all(r.failed for rs in self.records.values() for r in rs)

    def cell(self, lr: float) -> tuple[RunRecord, ...]:
        return self.records[float(lr)]

    def numbers(self) -> dict[str, Any]:
        """What study.json records of the grid."""
        return {"lrs": list(self.lrs), "best_lr": self.best_lr, "bracketed": self.bracketed,
                "extensions": list(self.extensions),
                "mean_val_loss": {str(k): v for k, v in self.mean_score.items()},
                "outcomes": {str(lr): [r.outcome for r in rs] for lr, rs in self.records.items()}}


@dataclass(frozen=True)
class MatchedPair:
    """The pre and post grid cells whose mean validation losses are closest (`matched`: within
    `tolerance`), and their runs by placement; `gap` is pre's mean validation loss minus post's,
    `seed_gaps` the same per seed (paired by index); `reason` when no pair exists."""

    matched: bool
    reason: str = ""
    tolerance: float | None = None
    pre_lr: float | None = None
    post_lr: float | None = None
    pre_val_loss: float | None = None
    post_val_loss: float | None = None
    gap: float | None = None
    runs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    seed_gaps: tuple[float, ...] = ()
    # a pair taken along the deep runs' trajectories (`StudyFolder.deep_matched_pair`): their
    # depth, and per run the kept checkpoint's step (None: its last)
    blocks: int | None = None
    steps: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.runs)

    def lr(self, placement: str) -> float | None:
        return self.pre_lr if placement == "pre" else self.post_lr

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = {k: list(v) for k, v in self.runs.items()}
        d["steps"] = {k: list(v) for k, v in self.steps.items()}
        d["seed_gaps"] = list(self.seed_gaps)
        return {k: v for k, v in d.items() if v not in (None, "", {}, [])} | {
            "matched": self.matched}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MatchedPair:
        return cls(**{**d, "runs": {k: tuple(v) for k, v in d.get("runs", {}).items()},
                      "steps": {k: tuple(v) for k, v in d.get("steps", {}).items()},
                      "seed_gaps": tuple(d.get("seed_gaps", ()))})

    def note(self) -> str:
        if self.gap is None:
            return self.reason
        state = "matched" if self.matched else "NOT matched"
        apart = [f"seed {i} {g:+.3f}" for i, g in enumerate(self.seed_gaps)
                 if self.tolerance is not None and abs(g) > self.tolerance]
        if self.matched and apart:  # the means within the tolerance, a seed outside it
            state = f"matched on the mean, NOT in every seed ({', '.join(apart)})"
        where = f" ({self.blocks}-block trajectories, mean over seeds)" if self.blocks else ""
        return (f"Checkpoints at matched loss{where}: pre at lr {self.pre_lr:g} (val "
                f"{self.pre_val_loss:.3f}), post at lr {self.post_lr:g} (val "
                f"{self.post_val_loss:.3f}): gap {self.gap:+.3f} nats, {state} (tolerance "
                f"{self.tolerance:g})." + (f" {self.reason}." if self.reason else ""))


@dataclass(frozen=True)
class ProbedRun:
    """One probed model: per-block curves and summary numbers (`normlab.probe.probe_model`)."""

    run_id: str
    per_block: Mapping[str, list[float]]
    summary: Mapping[str, Any]


@dataclass(frozen=True)
class ProbedPair:
    """Probes of the matched pair's models, per placement one per seed (`seeds`), at the lr of
    `pair`; no seeds when no pair was found."""

    pair: MatchedPair
    seeds: Mapping[str, tuple[ProbedRun, ...]] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.seeds)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pair": self.pair.to_json()}
        for pl, runs in self.seeds.items():
            out[pl] = {"lr": self.pair.lr(pl), "seeds": [asdict(r) for r in runs]}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProbedPair:
        seeds = {pl: tuple(ProbedRun(**s) for s in d[pl]["seeds"])
                 for pl in ("pre", "post") if pl in d}
        return cls(MatchedPair.from_json(d["pair"]), seeds)


class WorkPlan(Protocol):
    """What a claim's `work(plan)` hook adds to a study's time estimate
    (`normlab.study.runner.estimate`) for the runs and work it asks for beyond the grids every
    claim's `trains` names: nothing is trained, finished runs count 0 s.

    `folder` is the study's folder (quiet), for run configs; `tuned(family, warmup)` a grid of
    the profile's depth as its finished runs tune it (None while some are not finished);
    `grid(...)` replays one more grid's tuning (`StudyFolder`'s rule) on `configs(lr)`, every
    seed's run at an lr; `runs(configs)` counts runs; `later(configs)` counts runs that are
    not known yet (as to train); `ladder(name, steps)` a ladder at init cached as `name`
    (counted once, whichever claims read it); `work(kind, units, cached, steps)` other work;
    `steps` in training steps of the profile's shape (`parallel`: shared by the workers)."""

    folder: Any
    profile: Profile

    def tuned(self, family: str, warmup: int) -> TunedGrid | None: ...
    def grid(self, label: str, warmup: int, start: Sequence[float],
             configs: Callable[[float], list[Any]]) -> TunedGrid | None: ...
    def runs(self, configs: list[Any]) -> None: ...
    def later(self, configs: list[Any]) -> None: ...
    def ladder(self, name: str, steps: float) -> None: ...
    def work(self, kind: str, units: int, cached: int, steps: float,
             parallel: bool = False) -> None: ...


class StudyContext(Protocol):
    """Everything a claim's `measure(ctx)` may read: the primitives the claims share.
    Measurements are computed once per study and cached; a claim never trains or probes
    outside these methods, and a measurement of its own is a function of its module that it
    runs through `own` (on the study's folder, from these primitives)."""

    out: Path
    fig_dir: Path
    runs_root: Path
    profile: Profile
    log: Log
    claims: list[str] | None  # the claims this study runs (None: every claim)
    device: str  # where its runs, fine-tunings and k-hop models train: "cpu" or "cuda"

    def cached(self, name: str, compute: Callable[[], Any]) -> Any: ...
    def probe_batches(self, seq_len: int | None = None) -> list: ...

    # models at init (the theory claims' ladders: `normlab.study.ladder_runs`)
    def init_ladder(self, name: str, rungs: Sequence[Any], placements: Sequence[str],
                    depths: Sequence[int], perturb: bool = False, stats: bool = True
                    ) -> dict[str, Any]: ...
    def update_ladder(self, name: str, rungs: Sequence[tuple[Any, float]],
                      depths: Sequence[int], steps: int, warmup: int,
                      variants: Sequence[str] | None = None, distance: bool = True
                      ) -> dict[str, Any]: ...

    # training runs
    def tuned(self, family: str, warmup: int | None = None, blocks: int | None = None
              ) -> TunedGrid: ...
    def runs(self, family: str, lrs: list[float], warmup: int, blocks: int | None = None
             ) -> dict[float, list[RunRecord]]: ...
    def prefetch(self, specs: list[tuple[str, list[float], int]]) -> None: ...
    def prefetch_deep(self) -> None: ...
    def deep_grid(self, placement: str) -> TunedGrid | None: ...

    # a claim's own measurement: `measurement(folder, *args)`, a function of the claim's
    # module built from the shared primitives (`StudyFolder.own`); the claim tests' fake serves
    # a planted one by the function's name
    def own(self, measurement: Callable[..., Any], *args: Any) -> Any: ...

    # trained models
    def trained_probes(self) -> ProbedPair: ...
    def init_probes(self) -> ProbedPair:
        """Stream, merge and drop probes of `trained_probes`' runs' own models at step 0."""
    def same_lr_probes(self) -> ProbedPair:
        """The trained probes of pre and post trained at one lr and read at the same (last)
        step (`StudyFolder.same_lr_pair`): a pair that compares placements, not lrs or
        training stages."""
    def c12_checkpoints(self) -> list[Pretrained]: ...
