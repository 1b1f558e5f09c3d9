"""The measurements the claims share, computed once per study folder and cached there.

- the theory claims measure at init on ladders of their own (`normlab.study.ladder_runs`).
- `tuned(family)`: training runs on the Shakespeare corpus, one family (a placement plus model
  fields) over an lr grid that is extended until it brackets the best lr; paired seeds (seed s
  is the same data order and init draw for every family); warmup a fixed fraction of the run.
  Each run is an ordinary run folder under `runs/`, so a re-run trains nothing twice and an
  interrupted study resumes.
- `matched_pair`: the pre and post grid cells whose validation losses are closest, so probes of
  trained models compare checkpoints that reached a comparable loss.
- `trained_probes`: probes of those checkpoints; `init_probes`: the same runs' models at step 0.

What a claim may read is the `StudyContext` protocol (`normlab.study.context`); `StudyFolder`
is the context that computes it in a study's folder. A measurement one claim alone reads (C10's
checkpoints, C11's final-norm costs, C14's k-hop models) lives in that claim's module, built
from these primitives (`tune_together`, `run_config`, `placed`, `train`, `record`) and run on
the folder through `StudyFolder.own`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from normlab.config import RunConfig, load_run_config
from normlab.probe import on_device, probe_model, text_batches
from normlab.probe.suite import finite_or_none
from normlab.study.context import (
    Log,
    MatchedPair,
    ProbedPair,
    ProbedRun,
    RunRecord,
    StudyContext,
    TimeLimit,
    TunedGrid,
)
from normlab.study.profiles import Profile
from normlab.study.schema import PRE_POST, Pretrained
from normlab.train import load_trained_model
from normlab.train.logging import write_json_atomic
from normlab.train.machine import default_threads
from normlab.train.trainer import FINISHED, train_run_raising_interrupt

# The devices a study trains on (`normlab study --device`); `StudyFolder.placed` reuses a run
# finished on any of them.
STUDY_DEVICES = ("cpu", "cuda")
# A diverged run scores the loss of the uniform byte predictor: it learned nothing usable.
DIVERGED_LOSS = math.log(256)


@dataclass(frozen=True)
class Grid:
    """One lr grid to tune (`StudyFolder.tune_together`): its label and warmup, its first lrs,
    the run configs of every seed at some lrs, and every seed's record at some lrs (trained or
    read)."""
    label: str
    warmup: int
    start: Sequence[float]
    configs: Callable[[list[float]], list[RunConfig]]
    read: Callable[[list[float]], dict[float, list[RunRecord]]]


def _tuned_key(family: str, warmup: int, blocks: int | None) -> str:
    return f"tuned:{family}:{warmup}" + (f":{blocks}" if blocks else "")


def model_at_init(run_dir: Path) -> Any:
    """A run's own model at step 0: its config's model built with its seed, before any update
    (the init value of a paired claim is read on it)."""
    from normlab.nn import build_model
    from normlab.train import read_run_config

    cfg = read_run_config(run_dir)
    return build_model(cfg.model, seed=cfg.train.seed)


class StudyFolder(StudyContext):
    """The study context of one study folder: trains, probes and caches there (`runs/`,
    `cache/`, `figures/`); every claim reads from here."""

    def __init__(self, out: Path, profile: Profile, log: Log, *, executor: str = "local",
                 address: str | None = None, claims: Sequence[str] | None = None,
                 device: str = "cpu", limit: TimeLimit | None = None) -> None:
        self.out, self.profile, self.log = out, profile, log
        self.executor, self.address = executor, address
        self.device = device  # "cpu" or "cuda" (`normlab.study.devices.study_device`)
        self.limit = limit
        self._placed_runs: dict[str, RunConfig] = {}
        self.claims = list(claims) if claims is not None else None  # None: every claim
        self.cache_dir = out / "cache"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.fig_dir = out / "figures"
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        self.runs_root = out / "runs"
        self._memo: dict[str, Any] = {}

    # -- caching ------------------------------------------------------------------------------
    @property
    def memo(self) -> dict[str, Any]:
        """What this study computed once and keeps for the rest of it (by key)."""
        return self._memo

    def own(self, measurement: Callable[..., Any], *args: Any) -> Any:
        """A claim's own measurement, `measurement(self, *args)`: a function of the claim's
        module, run on this folder from the shared primitives."""
        return measurement(self, *args)

    def cached(self, name: str, compute: Callable[[], Any]) -> Any:
        if name in self._memo:
            return self._memo[name]
        path = self.cache_dir / f"{name}.json"
        if path.exists():
            try:
                value = json.loads(path.read_text())
                self._memo[name] = value
                return value
            except json.JSONDecodeError:
                pass  # a cache cut by a crash: compute again
        if self.limit is not None:
            self.limit.check(name)
        value = finite_or_none(compute())
        write_json_atomic(path, value)
        self._memo[name] = value
        return value

    # -- inputs -------------------------------------------------------------------------------
    def probe_batches(self, seq_len: int | None = None) -> list:
        p = self.profile
        return text_batches("shakespeare", n_batches=p.probe_batches,
                            batch_size=p.probe_batch_size, seq_len=seq_len or p.probe_seq_len)

    # -- models at init ------------------------------------------------------------------------
    def init_ladder(self, name: str, rungs: Sequence[Any], placements: Sequence[str],
                    depths: Sequence[int], perturb: bool = False, stats: bool = True
                    ) -> dict[str, Any]:
        from normlab.study.ladder_runs import init_ladder

        return init_ladder(self, name, rungs, placements, depths, perturb=perturb, stats=stats)

    def update_ladder(self, name: str, rungs: Sequence[tuple[Any, float]],
                      depths: Sequence[int], steps: int, warmup: int,
                      variants: Sequence[str] | None = None, distance: bool = True
                      ) -> dict[str, Any]:
        from normlab.study.ladder_runs import update_ladder

        return update_ladder(self, name, rungs, depths, steps=steps, warmup=warmup,
                             variants=variants, distance=distance)

    # -- training runs ------------------------------------------------------------------------
    def run_config(self, placement: str, lr: float, warmup: int, seed: int,
                   blocks: int | None = None, trajectory: bool = False,
                   train: dict[str, Any] | None = None, **model: Any) -> RunConfig:
        """One study run. A deep run (`blocks=profile.deep_blocks`), or one with `trajectory`,
        is evaluated and keeps its weights `profile.deep_evals` times along the way: the
        trajectory C12's pairs (and C10's, `c10_pairs="trajectories"`) are taken along."""
        p = self.profile
        deep = bool(blocks) and blocks == p.deep_blocks
        steps = p.deep_train_steps if deep else p.steps
        keep = deep or trajectory
        every = max(1, steps // (p.deep_evals if keep else 4))
        sets = [f"model.placement={placement}", f"model.n_blocks={blocks or p.train_blocks}",
                f"model.d_model={p.train_width}", f"model.n_heads={p.train_heads}",
                f"model.max_seq_len={p.seq_len}", f"data.seq_len={p.seq_len}",
                f"train.batch_size={p.batch_size}", f"train.steps={steps}", f"train.lr={lr}",
                f"train.warmup={warmup}", f"train.seed={seed}",
                f"train.eval_every={every}", f"train.eval_batches={p.eval_batches}",
                f"train.log_every={max(1, steps // 50)}",
                f"train.checkpoint_every={every if keep else max(50, steps // 5)}"]
        if keep:
            sets.append("train.keep_checkpoints=true")
        sets += [f"model.{k}={v}" for k, v in model.items() if v is not None]
        sets += [f"train.{k}={v}" for k, v in (train or {}).items()]
        return self.placed(sets)

    def placed(self, sets: list[str]) -> RunConfig:
        """The run of the `--set` items `sets` on the study's device, or the same run finished
        on another device. `train.device` is part of a run's id, so the runs of a study folder
        continued on another device would otherwise all train again: a finished run is a result
        wherever it trained (each run records its device: `train.device`, `meta.device`). A
        run not finished anywhere trains on the study's device."""
        cfg = load_run_config(None, [*sets, f"train.device={self.device}"])
        key = cfg.run_id()
        if key in self._placed_runs:
            return self._placed_runs[key]
        if not _finished(self.runs_root / key):
            for other in STUDY_DEVICES:
                twin = load_run_config(None, [*sets, f"train.device={other}"])
                if other != self.device and _finished(self.runs_root / twin.run_id()):
                    self._placed_runs[key] = twin  # finished: it stays so
                    return twin
        return cfg

    def train(self, configs: list[RunConfig]) -> list[dict[str, Any]]:
        """Train (or reuse) every run; returns their summaries in order. Runs still to do go
        through the sweep engine: grouped into stacked models where that pays
        (`normlab.sweep.grouping`), on local worker processes or a Ray cluster."""
        todo = list({c.run_id(): c for c in configs
                     if not _finished(self.runs_root / c.run_id())}.values())
        if todo:
            if self.limit is not None:
                self.limit.check(f"training {len(todo)} run(s)", self.limit.runs_seconds(todo))
            steps = "/".join(str(n) for n in sorted({c.train.steps for c in todo}))
            self.log(f"training {len(todo)} run(s) of {len(configs)} "
                     f"({steps} steps each, {self.profile.workers} workers, {self.executor}, "
                     f"{self.device})")
        if todo and (len(todo) > 1 or self.executor == "ray"):
            self._execute(todo)
        return [self._summary(cfg) for cfg in configs]

    def _summary(self, cfg: RunConfig) -> dict[str, Any]:
        """The summary of `cfg`'s run, trained here unless it finished on another device
        (`placed`): that one is read, as the trainer reads a finished run, without asking for
        a device this machine may not have."""
        if cfg.train.device == self.device:
            return train_run_raising_interrupt(cfg, self.runs_root, progress=False)
        from normlab.train import read_summary
        from normlab.train.trainer import DamagedRunError, finished_run_damage

        run_dir = self.runs_root / cfg.run_id()
        damage = finished_run_damage(run_dir)
        if damage:
            raise DamagedRunError(damage)
        return read_summary(run_dir) or {}

    def _execute(self, todo: list[RunConfig]) -> None:
        from normlab.sweep.executors import run_local
        from normlab.sweep.grouping import RunTask, plan_tasks
        from normlab.sweep.ray_executor import run_ray
        from normlab.sweep.spec import PlannedRun

        finished: list[str] = []

        def on_finish(run_id: str, summary: dict[str, Any], _wall: float) -> None:
            finished.append(run_id)
            self.log(f"  {len(finished)}/{len(todo)} {run_id}: {summary.get('outcome')}"
                     + (f" ({summary['reason']})" if summary.get("reason") else ""))

        workers = self.profile.workers
        if self.executor == "ray":
            run_ray([RunTask(c.run_id(), c.to_dict()) for c in todo], self.runs_root,
                    workers=None if self.address else workers, threads=1,
                    address=self.address, on_start=lambda _r: None, on_finish=on_finish)
            return
        threads = default_threads(workers)
        tasks, notes = plan_tasks([PlannedRun(i, {}, c) for i, c in enumerate(todo)], "auto",
                                  workers, threads, cuda_available=self.device == "cuda")
        for line in notes:
            self.log(f"  {line}")
        run_local(tasks, self.runs_root, workers=workers, threads=threads,
                  on_start=lambda _run_id: None, on_finish=on_finish)

    def family_config(self, family: str, lr: float, warmup: int, seed: int,
                      blocks: int | None = None, trajectory: bool = False) -> RunConfig:
        """`run_config` of a training family (`TRAINING_FAMILIES`): its placement and model
        fields."""
        placement, model = TRAINING_FAMILIES[family]
        return self.run_config(placement, lr, warmup, seed, blocks, trajectory,
                               train=FAMILY_TRAIN.get(family), **model)

    def runs(self, family: str, lrs: list[float], warmup: int, blocks: int | None = None
             ) -> dict[float, list[RunRecord]]:
        """Every seed of `family` at each lr (trained together), as records."""
        seeds = range(self.profile.seeds)
        configs = {(lr, s): self.family_config(family, lr, warmup, s, blocks)
                   for lr in lrs for s in seeds}
        summaries = self.train(list(configs.values()))
        out: dict[float, list[RunRecord]] = {lr: [] for lr in lrs}
        for ((lr, s), cfg), summary in zip(configs.items(), summaries, strict=True):
            out[lr].append(record(cfg, summary, lr=lr, warmup=warmup, seed=s))
        return out

    def prefetch(self, specs: list[tuple[str, list[float], int]]) -> None:
        """Train the runs of several `(family, lrs, warmup)` at once, so the workers stay busy
        across families; later `runs` calls read the finished folders."""
        configs = [self.family_config(f, lr, w, s)
                   for f, lrs, w in specs for lr in lrs for s in range(self.profile.seeds)]
        self.train(configs)

    def tuned_specs(self) -> list[tuple[str, int]]:
        """The `(family, warmup)` grids the selected claims tune in the profile
        (`normlab.study.claims.trained_by_claim`)."""
        from normlab.study.claims import trained_by_claim

        p = self.profile
        by_claim = trained_by_claim(p)
        claims = self.claims if self.claims is not None else list(by_claim)
        specs: list[tuple[str, int]] = []
        for cid in claims:
            for family, with_warmup in by_claim.get(cid, ()):
                spec = (family, p.warmup if with_warmup else 0)
                if spec not in specs:
                    specs.append(spec)
        return specs

    def tuned(self, family: str, warmup: int | None = None, blocks: int | None = None
              ) -> TunedGrid:
        """`family` over its lr grid (`_tuning`), with the profile's warmup unless `warmup` is
        given, at `blocks` blocks (the profile's depth unless given). A deep family
        (`blocks=deep_blocks`) starts from the profile's deep grid, with the deep runs' warmup
        and budget. Every run is kept. `family` is tuned together (`tune_together`) with the
        other grids the study tunes at its depth and not yet tuned (`tuned_specs`, or the deep
        families), so their first grids, and then each round of their extensions, train in one
        go."""
        p = self.profile
        deep = bool(blocks) and blocks == p.deep_blocks
        warmup = (p.deep_warmup if deep else p.warmup) if warmup is None else warmup
        key = _tuned_key(family, warmup, blocks)
        if key in self._memo:
            return self._memo[key]
        if blocks:
            specs = [(f, p.deep_warmup) for f in self.deep_families()] if deep else []
        else:
            specs = self.tuned_specs()
        specs = [s for s in specs if _tuned_key(*s, blocks) not in self._memo]
        if (family, warmup) not in specs:
            specs.append((family, warmup))
        seeds = range(p.seeds)
        start = p.deep_start_lrs if deep else p.lrs

        def grid(f: str, w: int) -> Grid:
            return Grid(f, w, start,
                         lambda lrs: [self.family_config(f, lr, w, s, blocks)
                                      for lr in lrs for s in seeds],
                         lambda lrs: self.runs(f, lrs, w, blocks))

        self._memo.update(self.tune_together(
            {_tuned_key(f, w, blocks): grid(f, w) for f, w in specs}))
        return self._memo[key]

    def tune_together(self, grids: dict[str, Grid]) -> dict[str, TunedGrid]:
        """Each grid tuned by `_tuning`, in lockstep: every round trains the lrs that all the
        grids still ask for in one go (so the workers stay busy across families, where one
        family's extension alone would leave a worker idle), then each grid reads its own
        cells and decides its next extension. A grid's decisions read its own cells only, so
        each ends as it would alone."""
        tuners = {k: self._tuning(g.label, g.warmup, g.start) for k, g in grids.items()}
        asks: dict[str, list[float]] = {}
        done: dict[str, TunedGrid] = {}

        def advance(k: str, cells: dict[float, list[RunRecord]] | None) -> None:
            try:
                asks[k] = tuners[k].send(cells)  # type: ignore[arg-type]
            except StopIteration as stop:
                done[k] = stop.value
                asks.pop(k, None)

        for k in tuners:
            advance(k, None)
        while asks:
            round_ = list(asks.items())
            if len(round_) > 1:
                self.train([c for k, lrs in round_ for c in grids[k].configs(lrs)])
            for k, lrs in round_:
                advance(k, grids[k].read(lrs))
        return done

    def _tuning(self, label: str, warmup: int, start: Sequence[float]
                ) -> Generator[list[float], dict[float, list[RunRecord]], TunedGrid]:
        """The grid `start`, extended by x2 at an edge that holds the best mean score among the
        cells where every seed trained, and halved below the grid when no cell trained (at most
        `max_lr_extensions` times per side). It yields the lrs it needs next and is sent every
        seed's record at each of them; it returns the grid. `bracketed`: the best trained cell
        lies inside the grid."""
        p = self.profile
        lrs = sorted(start)
        extensions: list[str] = []
        table: dict[float, list[RunRecord]] = {}
        low_ext = high_ext = 0
        while True:
            table.update((yield [lr for lr in lrs if lr not in table]))
            means = {lr: sum(r.score for r in table[lr]) / len(table[lr]) for lr in lrs}
            # a cell where a seed stalled or diverged is a result, not a candidate optimum
            trained = {lr: m for lr, m in means.items() if not any(r.failed for r in table[lr])}
            if not trained and low_ext < p.max_lr_extensions:
                # every cell failed: the least bad cell is stall noise, not an optimum; a smaller
                # lr is what a placement that fails to train needs
                low_ext += 1
                lrs.insert(0, _round_lr(lrs[0] / 2))
                extensions.append(f"every cell stalled or diverged: added {lrs[0]:g} below")
                self.log(f"{label}: {extensions[-1]}")
                continue
            best = min(trained or means, key=(trained or means).get)
            if trained and best == lrs[0] and low_ext < p.max_lr_extensions:
                low_ext += 1
                lrs.insert(0, _round_lr(lrs[0] / 2))
                extensions.append(f"best lr {best:g} at the low edge: added {lrs[0]:g}")
                self.log(f"{label}: {extensions[-1]}")
                continue
            if trained and best == lrs[-1] and high_ext < p.max_lr_extensions:
                high_ext += 1
                lrs.append(_round_lr(lrs[-1] * 2))
                extensions.append(f"best lr {best:g} at the high edge: added {lrs[-1]:g}")
                self.log(f"{label}: {extensions[-1]}")
                continue
            break
        # bracketed: the optimum among the cells that trained lies inside the grid
        at_edge = not trained or best in (lrs[0], lrs[-1])
        return TunedGrid(label, warmup, tuple(lrs), {lr: tuple(table[lr]) for lr in lrs},
                         best, not at_edge, tuple(extensions))

    def matched_pair(self) -> MatchedPair:
        """The tuned-grid lr of pre and of post whose mean validation losses are closest, among
        cells where no seed stalled or diverged: the checkpoints the trained probes compare
        (C1-C3, C13) and C10 fine-tunes, so that both placements reached a comparable loss."""
        pre, post = self.tuned("pre"), self.tuned("post")
        a, b = trained_means(pre), trained_means(post)
        if not a or not b:
            side = "pre" if not a else "post"
            return MatchedPair(False, reason=f"{side} stalled or diverged at every lr")
        lr_a, lr_b = min(((x, y) for x in a for y in b), key=lambda q: abs(a[q[0]] - b[q[1]]))
        gap = a[lr_a] - b[lr_b]
        tol = self.profile.match_tolerance
        return MatchedPair(abs(gap) <= tol, tolerance=tol, pre_lr=lr_a, post_lr=lr_b,
                           pre_val_loss=a[lr_a], post_val_loss=b[lr_b], gap=gap,
                           runs={"pre": tuple(r.run_id for r in pre.cell(lr_a)),
                                 "post": tuple(r.run_id for r in post.cell(lr_b))},
                           seed_gaps=tuple(p.val_loss - q.val_loss  # type: ignore[operator]
                                           for p, q in zip(pre.cell(lr_a), post.cell(lr_b),
                                                           strict=True)))

    def probe_pair(self) -> MatchedPair:
        """The checkpoints the trained probes read (C1-C3, C13): the 6-block matched cells
        (`matched_pair`), or with `profile.probe_deep` the deep models' trajectory pairs
        (`deep_matched_pair`), where C2's and C3's "large t" is reached."""
        return self.deep_matched_pair() if self.profile.probe_deep else self.matched_pair()

    def deep_matched_pair(self) -> MatchedPair:
        """C12's pairs (`c12_checkpoints`: per seed, the most trained kept checkpoints of the
        deep pre and post runs within the match tolerance) as one `MatchedPair`: a seed whose
        runs did not both complete, or whose pair lies inside the deep runs' warmup (not yet a
        trained model), is left out and named in `reason`; `matched` when every remaining seed
        lies within the tolerance; the losses and the gap are means over those seeds."""
        p = self.profile
        own = self.c12_checkpoints()
        by = {pl: {c.seed: c for c in own if c.placement == pl} for pl in PRE_POST}
        kept, left = [], []
        for seed in sorted(set(by["pre"]) & set(by["post"])):
            a, b = by["pre"][seed], by["post"][seed]
            if a.outcome != "completed" or b.outcome != "completed":
                left.append(f"seed {seed} left out: pre {a.outcome}, post {b.outcome}")
            elif any(c.step is not None and c.step <= p.deep_warmup for c in (a, b)):
                left.append(f"seed {seed} left out: matched only inside warmup (pre step "
                            f"{a.step}, post step {b.step}; warmup {p.deep_warmup})")
            else:
                kept.append(seed)
        if not kept:
            return MatchedPair(False, reason="no seed gave a pair of trained deep checkpoints"
                               + (": " + "; ".join(left) if left else ""), blocks=p.deep_blocks)
        gaps = [by["pre"][s].val_loss - by["post"][s].val_loss for s in kept]
        grids = {pl: self.deep_grid(pl) for pl in PRE_POST}

        def mean(pl: str) -> float:
            return sum(by[pl][s].val_loss for s in kept) / len(kept)

        tol = p.match_tolerance
        return MatchedPair(
            all(abs(g) <= tol for g in gaps), reason="; ".join(left), tolerance=tol,
            pre_lr=grids["pre"].best_lr, post_lr=grids["post"].best_lr,  # type: ignore
            pre_val_loss=mean("pre"), post_val_loss=mean("post"), gap=sum(gaps) / len(gaps),
            runs={pl: tuple(by[pl][s].run_dir.name for s in kept) for pl in PRE_POST},
            seed_gaps=tuple(gaps), blocks=p.deep_blocks,
            steps={pl: tuple(by[pl][s].step for s in kept) for pl in PRE_POST})

    def same_lr_pair(self) -> MatchedPair:
        """Pre and post trained at the same lr, compared at the same (last) step: among the
        lrs of the grids the probe pair comes from (the 6-block tuned grids, or the deep grids
        with `probe_deep`) where every seed of both placements trained, the one whose worse
        placement lies least above its own best mean loss (both as near their optimum as one
        lr allows). Not matched in loss by construction: `matched` says whether every seed
        lies within the tolerance anyway, and `seed_gaps` how far apart they are."""
        p = self.profile
        grids = ({pl: self.deep_grid(pl) for pl in PRE_POST} if p.probe_deep
                 else {pl: self.tuned(pl) for pl in PRE_POST})
        blocks = p.deep_blocks if p.probe_deep else None
        means = {pl: trained_means(g) for pl, g in grids.items()}  # type: ignore[arg-type]
        common = sorted(set(means["pre"]) & set(means["post"]))
        if not common:
            return MatchedPair(False, reason="no lr of both grids where every seed of pre and "
                                             "of post trained", blocks=blocks)
        best = {pl: min(m.values()) for pl, m in means.items()}
        lr = min(common, key=lambda x: max(means[pl][x] - best[pl] for pl in PRE_POST))
        cells = {pl: g.cell(lr) for pl, g in grids.items()}  # type: ignore[union-attr]
        gaps = tuple(a.val_loss - b.val_loss  # type: ignore[operator]
                     for a, b in zip(cells["pre"], cells["post"], strict=True))
        tol = p.match_tolerance
        return MatchedPair(all(abs(g) <= tol for g in gaps), tolerance=tol, pre_lr=lr,
                           post_lr=lr, pre_val_loss=means["pre"][lr],
                           post_val_loss=means["post"][lr],
                           gap=means["pre"][lr] - means["post"][lr],
                           runs={pl: tuple(r.run_id for r in c) for pl, c in cells.items()},
                           seed_gaps=gaps, blocks=blocks)

    def same_lr_probes(self) -> ProbedPair:
        """Stream, merge, drop and lens probes of `same_lr_pair`'s runs at their last step."""
        return self._probe_matched(
            "same_lr_probes", lambda run_dir, step: load_trained_model(run_dir, step=step)[1],
            ("stream", "merge", "drop", "lens"), self.same_lr_pair())

    def trained_probes(self) -> ProbedPair:
        """stream, merge, drop and lens probes of the matched-loss pre and post checkpoints
        (`probe_pair`); cached under a name of its own since the lens gained `lens_free`, so
        probes cached before are measured again."""
        return self._probe_matched(
            "trained_probes_lens_free",
            lambda run_dir, step: load_trained_model(run_dir, step=step)[1],
            ("stream", "merge", "drop", "lens"))

    def init_probes(self) -> ProbedPair:
        """Stream, merge and drop probes of the matched-loss runs' own models at step 0
        (`model_at_init`): what training changed is trained minus these, per seed, and a
        contrast already there is architectural (C3 reports its merge/drop ratio at init)."""
        return self._probe_matched("init_probes_merge_drop",
                                   lambda run_dir, _step: model_at_init(run_dir),
                                   ("stream", "merge", "drop"))

    def _probe_matched(self, name: str, model_of: Callable[[Path, int | None], Any],
                       probes: tuple[str, ...], pair: MatchedPair | None = None) -> ProbedPair:
        """`probes` of the model `model_of(run_dir, step)` gives for each run of `pair`
        (default `probe_pair`; `step`: the kept checkpoint, None for the last), measured on the
        study's device and cached as `ProbedPair.to_json`."""
        pair = self.probe_pair() if pair is None else pair
        if not pair.found:
            return ProbedPair(pair)

        def compute() -> dict[str, Any]:
            p = self.profile
            batches = self.probe_batches(seq_len=min(p.probe_seq_len, p.seq_len))
            seeds: dict[str, tuple[ProbedRun, ...]] = {}
            for placement in ("pre", "post"):
                steps = pair.steps.get(placement) or (None,) * len(pair.runs[placement])
                seeds[placement] = tuple(
                    ProbedRun(run_id, res["per_block"], res["summary"])
                    for seed, (run_id, step) in enumerate(zip(pair.runs[placement], steps,
                                                              strict=True))
                    for res in [probe_model(*on_device(model_of(self.runs_root / run_id,
                                                                step), batches, self.device),
                                            probes, seed=seed)])
            self.log(f"{name}: probed the pre and post runs (lr {pair.pre_lr:g} and "
                     f"{pair.post_lr:g})")
            return ProbedPair(pair, seeds).to_json()
        key = f"{name}_{pair.pre_lr:g}_{pair.post_lr:g}"
        if pair.blocks:  # a trajectory pair: which checkpoints were probed is part of the key
            key += f"_{pair.blocks}b_" + hashlib.sha1(json.dumps(
                [pair.runs, pair.steps], sort_keys=True).encode()).hexdigest()[:10]
        probed = ProbedPair.from_json(self.cached(key, compute))
        return replace(probed, pair=pair)  # the pair as this study's grids give it now

    def deep_grid(self, placement: str) -> TunedGrid | None:
        """`placement` at `deep_blocks` blocks, tuned on its own lr grid like the 6-block
        families (`tuned`), one run per seed and lr, each keeping its weights along the way;
        None when the profile trains no deep models. The deep models are tuned, not trained
        at the 6-block matched lr: a depth changes the lr a placement trains at
        (docs/study.md, C12)."""
        p = self.profile
        return self.tuned(placement, blocks=p.deep_blocks) if p.deep_blocks else None

    def c12_checkpoints(self) -> list[Pretrained]:
        """Deeper pre and post models (`deep_blocks`, each at its own tuned lr: `deep_runs`),
        one pair per seed, taken along their training trajectories (`trajectory_pairs`)."""
        grids = {pl: self.deep_grid(pl) for pl in PRE_POST}
        if any(g is None for g in grids.values()):
            return []
        return self.trajectory_pairs(
            {pl: {r.seed: r for r in g.best} for pl, g in grids.items()})  # type: ignore

    def trajectory_pairs(self, runs: dict[str, dict[int, RunRecord]],
                         warmup: int | None = None) -> list[Pretrained]:
        """One pre and one post checkpoint per seed of `runs` (placement -> seed -> run, each
        keeping its weights along the way), taken along their trajectories
        (`trajectory_pair`): the kept checkpoints of the two runs whose validation losses are
        closest, preferring the most trained pair within tolerance. A seed whose runs did not
        both complete hands over their last checkpoints with their outcomes; with `warmup`, a
        pair with a side at or before that step gets the outcome "inside warmup"."""
        out = []
        for seed in sorted(set(runs["pre"]) & set(runs["post"])):
            pre, post = runs["pre"][seed], runs["post"][seed]
            if pre.failed or post.failed or pre.outcome != "completed" \
                    or post.outcome != "completed":
                for pl, r in (("pre", pre), ("post", post)):
                    out.append(Pretrained(pl, seed, self.runs_root / r.run_id,
                                          r.val_loss if r.val_loss is not None
                                          else math.nan, r.outcome))
                continue
            pick = trajectory_pair(trajectory(self.runs_root / pre.run_id),
                                   trajectory(self.runs_root / post.run_id),
                                   self.profile.match_tolerance)
            early = warmup is not None and any(
                step is not None and step <= warmup for step, _ in pick)
            for pl, r, (step, loss) in (("pre", pre, pick[0]), ("post", post, pick[1])):
                out.append(Pretrained(pl, seed, self.runs_root / r.run_id, loss,
                                      f"inside warmup (step {step}, warmup {warmup})"
                                      if early else "completed", step=step))
        return out

    def prefetch_deep(self) -> None:
        """Both placements' deep grids trained together, so the workers stay busy."""
        p = self.profile
        if p.deep_blocks and "prefetched_deep" not in self._memo:
            self._memo["prefetched_deep"] = True
            self.train([self.family_config(f, lr, p.deep_warmup, s, p.deep_blocks)
                        for f in self.deep_families() for lr in p.deep_start_lrs
                        for s in range(p.seeds)])

    def deep_families(self) -> list[str]:
        """The families this study trains at `deep_blocks` blocks: pre and post, and those
        the selected claims add (`normlab.study.claims.deep_families`)."""
        from normlab.study.claims import deep_families

        return deep_families(self.profile, self.claims)


def trained_means(grid: TunedGrid) -> dict[float, float]:
    """lr -> the mean validation loss of a grid's cells where no seed stalled or diverged: the
    cells a pair of placements may be taken from (`matched_pair`, `same_lr_pair`)."""
    return {lr: sum(r.val_loss for r in rs) / len(rs)  # type: ignore[misc]
            for lr, rs in grid.records.items() if rs and not any(r.failed for r in rs)}


def late_improvement(folder: StudyFolder, records: Sequence[RunRecord], frac: float = 0.25,
                     end: int | None = None, steps: int | None = None) -> list[float]:
    """Per run (one per seed): how much its validation loss still fell over the last `frac`
    of the run (the loss at the last evaluation at or before `(1 - frac)` of the steps minus
    the final loss); nan for a run that failed or has no such evaluation. A run near
    convergence has stopped falling. With `end` (a step: a wsd run's end of the stable
    phase), the window of `frac` of the steps ends there instead: the loss at the last
    evaluation at or before `end - frac * steps` minus the one at or before `end`. `steps`:
    the runs' length (default: the profile's `steps`; a claim's own runs pass theirs)."""
    from normlab.train.rundir import read_metrics

    length = folder.profile.steps if steps is None else steps
    out = []
    stop = length if end is None else end
    cut = stop - frac * length
    for r in records:
        rows = [m for m in read_metrics(folder.runs_root / r.run_id / "metrics.jsonl")
                if isinstance(m.get("val_loss"), float)]
        before = [m["val_loss"] for m in rows if m["step"] <= cut]
        at_end = [m["val_loss"] for m in rows if m["step"] <= stop]
        final = r.val_loss if end is None else (at_end[-1] if at_end else None)
        ok = before and isinstance(final, float) and not r.failed
        out.append(before[-1] - final if ok else math.nan)
    return out


def trajectory(run_dir: Path) -> list[tuple[int | None, float]]:
    """`(step, validation loss)` at each kept checkpoint of a run, and `(None, final loss)` for
    its last checkpoint (`checkpoint/`)."""
    from normlab.train import read_summary
    from normlab.train.checkpoint import kept_steps
    from normlab.train.rundir import read_metrics

    val = {r["step"]: r["val_loss"] for r in read_metrics(run_dir / "metrics.jsonl")
           if isinstance(r.get("val_loss"), float)}
    points: list[tuple[int | None, float]] = [(s, val[s]) for s in kept_steps(run_dir)
                                              if s in val]
    final = (read_summary(run_dir) or {}).get("val_loss")
    if isinstance(final, float):
        points.append((None, final))
    return points


def trajectory_pair(pre: list[tuple[int | None, float]], post: list[tuple[int | None, float]],
                    tolerance: float) -> tuple[tuple[int | None, float], tuple[int | None, float]]:
    """The pre and post trajectory points to compare: among pairs whose losses lie within
    `tolerance`, the most trained (largest smaller step; the final checkpoint counts as the
    last step); with none within tolerance, the closest pair (reported, then left out)."""
    if not pre or not post:
        raise ValueError("trajectory_pair needs at least one point on each trajectory")

    def rank(step: int | None) -> float:
        return math.inf if step is None else float(step)

    pairs = [(a, b) for a in pre for b in post]
    close = [q for q in pairs if abs(q[0][1] - q[1][1]) <= tolerance]
    if close:
        return max(close, key=lambda q: (min(rank(q[0][0]), rank(q[1][0])),
                                         -abs(q[0][1] - q[1][1])))
    return min(pairs, key=lambda q: abs(q[0][1] - q[1][1]))


# Training families: a placement plus model fields; each is tuned over its own lr grid.
TRAINING_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "pre": ("pre", {}),  # paper default init: GPT-2 scaled
    "post": ("post", {}),  # paper default init: Xavier
    "pre_nofinal": ("pre", {"final_norm": "off"}),
    "pre_xavier": ("pre", {"init": "xavier"}),  # C9: pre under post's init...
    "post_gpt2": ("post", {"init": "gpt2_scaled"}),  # ...and post under pre's
    # C9's runs, each the family above under the wsd schedule (`FAMILY_TRAIN`)
    "pre_wsd": ("pre", {}),
    "post_wsd": ("post", {}),
    "pre_xavier_wsd": ("pre", {"init": "xavier"}),
    "post_gpt2_wsd": ("post", {"init": "gpt2_scaled"}),
}

# Train fields a family sets beyond the profile's (C9's families: the wsd schedule, whose end of
# the stable phase is where its convergence premise is read).
FAMILY_TRAIN: dict[str, dict[str, Any]] = {
    f: {"schedule": "wsd"} for f in ("pre_wsd", "post_wsd", "pre_xavier_wsd", "post_gpt2_wsd")}



def record(cfg: RunConfig, summary: dict[str, Any], *, seed: int, lr: float | None = None,
           warmup: int | None = None) -> RunRecord:
    """What the claims read of one run (`RunRecord`) from its summary."""
    outcome = summary.get("outcome")
    return RunRecord(cfg.run_id(), seed, outcome, score(summary),
                     outcome in ("stalled", "diverged"), val_loss=summary.get("val_loss"),
                     train_loss=summary.get("train_loss"), reason=summary.get("reason"),
                     step=summary.get("step"), token_share=summary.get("token_share"),
                     lr=lr, warmup=warmup)


def _round_lr(lr: float) -> float:
    return float(f"{lr:.4g}")


def score(summary: dict[str, Any]) -> float:
    """Final validation loss (a stalled run's too: it is what the run reached), or the uniform
    predictor's loss for a run that diverged or did not finish."""
    if summary.get("outcome") in ("completed", "stalled") and isinstance(summary.get("val_loss"),
                                                                         float):
        return summary["val_loss"]
    return DIVERGED_LOSS


def _finished(run_dir: Path) -> bool:
    from normlab.train import read_summary

    s = read_summary(run_dir)
    return bool(s and s.get("outcome") in FINISHED)
