"""Run the study: each selected claim's experiment, its verdict, and `study.json`.

The study folder holds everything: `runs/` (ordinary run folders), `cache/` (shared probe
results), `figures/`, `study.json`. Re-running reuses all of it; an interrupted study resumes.
`study.json` is rewritten after every claim, so what finished is never lost. What it records
names no folder of the machine that ran it, so a study folder can be moved to another machine
(and another device: `normlab.study.devices`) and continued there.
"""

from __future__ import annotations

import math
import platform
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import normlab
from normlab.config import ConfigError, RunConfig
from normlab.study.claims import (
    ALL_CLAIMS,
    CLAIM_GROUPS,
    REGISTRY,
    deep_families,
    measures,
    profile_settings,
)
from normlab.study.context import StudyContext, TimeLimit
from normlab.study.devices import device_record, runs_by_device, study_device
from normlab.study.experiments import StudyFolder, _finished, _tuned_key, record
from normlab.study.parts import PartFolder, export_dir, study_part, write_export
from normlab.study.profiles import GPU_COST, PROFILES, Profile
from normlab.study.schema import ClaimResult
from normlab.sweep.executors import keep_local_workers
from normlab.train.logging import write_json_atomic
from normlab.train.machine import cpu_model, default_threads, git_commit


def parse_claims(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return list(ALL_CLAIMS)
    items = text.split(",") if isinstance(text, str) else list(text)
    by_name = {c.upper(): (c,) for c in ALL_CLAIMS} | CLAIM_GROUPS
    wanted = [s.strip().upper() for s in items if s.strip()]
    unknown = [s for s in wanted if s not in by_name]
    if unknown or not wanted:
        raise ConfigError(f"--claims: unknown claim(s) {unknown or wanted}; choose from "
                          f"{', '.join(ALL_CLAIMS)} (C6 means C6a and C6b)")
    chosen = [c for s in wanted for c in by_name[s]]
    return sorted(dict.fromkeys(chosen), key=ALL_CLAIMS.index)


def claim_functions() -> dict[str, Callable[[StudyContext], ClaimResult]]:
    """Every claim's experiment (`normlab.study.claims.REGISTRY`)."""
    return measures()


def run_study(out: Path, profile: str = "quick", claims: Sequence[str] | None = None,
              log: Callable[[str], None] = print, *, executor: str = "local",
              address: str | None = None, device: str = "cpu",
              time_limit: TimeLimit | float | None = None, part: str | None = None
              ) -> dict[str, Any]:
    """Run the selected claims; the training runs go to local workers or, with
    `executor="ray"`, to the Ray cluster at `address` (a local instance when None), on `device`
    (`study_device`; `normlab study` asks for auto). With `time_limit` (seconds, or a
    `TimeLimit`) the study stops at a unit of work with `TimeLimitReached` or, interrupted in
    one, KeyboardInterrupt (`limit.reached` set), what finished kept: a re-run continues.

    With `part` (`normlab.study.parts`, instead of `claims`) the part's claims run; the claims
    of the same profile that study.json already holds are kept beside them (the parts run into
    one folder accumulate), and the part's export is written once its claims are decided."""
    if profile not in PROFILES:
        raise ConfigError(f"--profile: {profile!r} is not one of {', '.join(PROFILES)}")
    if executor not in ("local", "ray"):
        raise ConfigError(f"--executor: {executor!r} is not one of local, ray")
    if executor == "local" and address:
        raise ConfigError(f"--address {address}: only with --executor ray (the address of a "
                          "Ray cluster); add --executor ray or drop --address")
    if part is not None and claims is not None:
        raise ConfigError(f"--part {part} with --claims: a part names its claims "
                          "(`normlab study --list-parts`); give one of them")
    chosen = study_part(part) if part is not None else None
    selected = list(chosen.claims) if chosen is not None else parse_claims(claims)
    _refuse_a_merge(out / "study.json")
    asked, device = device, study_device(device)
    if PROFILES[profile].sized_for == "gpu" and device == "cpu" and asked != "cpu":
        raise ConfigError(
            f"--profile {profile} is sized for a GPU ({GPU_COST[profile]}) and this machine has "
            f"no CUDA GPU (--device {asked}); give --device cpu to run it on the CPU anyway (it "
            "prints its estimate on this machine first; --time-limit stops it cleanly)")
    limit = TimeLimit(time_limit) if isinstance(time_limit, (int, float)) else time_limit
    out.mkdir(parents=True, exist_ok=True)
    ctx = PartFolder(out, PROFILES[profile], log, executor=executor, address=address,
                     claims=selected, device=device, limit=limit)
    timer = _StepTimer(ctx.profile.workers, device)
    if limit is not None:
        limit.runs_seconds = timer.round_seconds
    if profile != "tiny":
        log(estimate(ctx, timer).line(ctx.profile.workers))
    funcs = claim_functions()
    on = device_record(device)
    study: dict[str, Any] = {
        "normlab": normlab.__version__, "git_commit": git_commit(),
        "torch": str(torch.__version__), **{k: v for k, v in on.items() if k != "numerics"},
        "created": time.strftime("%Y-%m-%d %H:%M"), "profile": profile,
        "profile_settings": profile_settings(ctx.profile), "machine": _machine(),
        "numerics": on["numerics"],
        "claims": _earlier_claims(out / "study.json", profile) if chosen else []}
    parts = _earlier_parts(out / "study.json", profile)
    invocation = {"started": study["created"], "git_commit": study["git_commit"],
                  "elapsed_s": 0.0, "claims": selected, "device": device,
                  "device_name": on["device_name"]}
    if chosen is not None:
        invocation["study_part"] = chosen.name
    study["parts"] = [*parts, invocation]
    t0 = time.perf_counter()
    with keep_local_workers():  # one pool of worker processes for every claim's runs
        if limit is None:
            _run_claims(ctx, selected, funcs, study, invocation, out, log, t0)
        else:
            with limit.armed():
                _run_claims(ctx, selected, funcs, study, invocation, out, log, t0)
    if chosen is not None:
        for warning in write_export(out, chosen, study, ctx.runs_read):
            log(f"warning: {warning}")
        log(f"{chosen.name}: exported to {export_dir(out, chosen.name)} (merge it with "
            "`normlab study --merge`)")
    return study


def _run_claims(ctx: StudyFolder, selected: Sequence[str], funcs: dict[str, Any],
                study: dict[str, Any], part: dict[str, Any], out: Path,
                log: Callable[[str], None], t0: float) -> None:
    """Each selected claim in turn, study.json written after each (a failing one recorded as
    not run)."""
    profile = study["profile"]
    for i, cid in enumerate(selected, 1):
        if ctx.limit is not None:
            ctx.limit.check(cid)
        t = time.perf_counter()
        log(f"{cid}: running (claim {i} of {len(selected)}, "
            f"{format_duration(time.perf_counter() - t0)} so far)")
        try:
            result = (funcs[cid](ctx) if ctx.profile.theory or REGISTRY[cid].ladder is None
                      else theory_left_out(cid, profile))
        except Exception as e:  # one failing experiment must not sink the others
            result = ClaimResult(
                id=cid, title=cid, statement="", source="", method="", verdict="not run",
                rule="", note=f"the experiment failed: {type(e).__name__}: {e}",
                numbers={"traceback": traceback.format_exc()})
        result.elapsed_s = time.perf_counter() - t
        log(f"{cid}: {result.verdict} ({result.elapsed_s:.0f} s)")
        study["claims"] = sorted([*(c for c in study["claims"] if c["id"] != cid),
                                  result.to_dict()], key=lambda c: ALL_CLAIMS.index(c["id"]))
        study["elapsed_s"] = part["elapsed_s"] = time.perf_counter() - t0
        study["elapsed_total_s"] = sum(p["elapsed_s"] for p in study["parts"])
        study["runs_by_device"] = runs_by_device(ctx.runs_root)
        write_json_atomic(out / "study.json", study)


def theory_left_out(cid: str, profile: str) -> ClaimResult:
    """A claim at initialization in a profile that leaves them out (`Profile.theory`)."""
    claim = REGISTRY[cid]
    return ClaimResult(
        id=cid, title=claim.title, statement=claim.statement, source=claim.source, method="",
        verdict="not run", rule="",
        note=f"The {profile} profile measures the trained claims; this claim is measured at "
             "initialization and is decided by the standard profile, whose ladders are the same "
             "size (docs/results/study_standard).")


def _read_study(path: Path) -> dict[str, Any] | None:
    import json

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return old if isinstance(old, dict) else None


def _refuse_a_merge(path: Path) -> None:
    """ConfigError when `path` is a merged study's: its runs carry no weights to go on from."""
    old = _read_study(path)
    if old is not None and "merged_from" in old:
        raise ConfigError(f"--out {path.parent}: a merge of the study's parts (its runs carry "
                          "no weights); run the study into another folder")


def _earlier_claims(path: Path, profile: str) -> list[dict[str, Any]]:
    """The claims an earlier run of the same profile in this folder decided: the parts of a
    study run into one folder accumulate, each claim replaced only once decided again."""
    old = _read_study(path)
    if old is None or old.get("profile") != profile or not isinstance(old.get("claims"), list):
        return []
    return [c for c in old["claims"] if isinstance(c, dict) and c.get("id") in ALL_CLAIMS]


def _earlier_parts(path: Path, profile: str) -> list[dict[str, Any]]:
    """The parts an earlier run of the same profile in this folder recorded (a resumed study
    is recorded part by part, with its total); none for a new folder or another profile."""
    old = _read_study(path)
    if old is None or old.get("profile") != profile:
        return []
    parts = old.get("parts")
    if isinstance(parts, list):
        return [p for p in parts if isinstance(p, dict) and "elapsed_s" in p]
    if isinstance(old.get("elapsed_s"), (int, float)):  # written before parts were recorded
        return [{"started": old.get("created"), "git_commit": old.get("git_commit"),
                 "elapsed_s": float(old["elapsed_s"]), "claims": None}]
    return []


@dataclass(frozen=True)
class Work:
    """One kind of a study's work: its units (a training run, a ladder of models at init, a
    fine-tuning), how many of them the study folder already holds, and the wall seconds the
    rest takes here with the profile's workers."""
    kind: str
    units: int
    cached: int
    seconds: float


@dataclass(frozen=True)
class Estimate:
    """What a study has left to do in its folder, timed on this machine (`estimate`)."""
    work: tuple[Work, ...]
    step_s: dict[str, float] = field(default_factory=dict)  # measured, per training shape

    @property
    def seconds(self) -> float:
        return sum(w.seconds for w in self.work)

    @property
    def units(self) -> int:
        return sum(w.units for w in self.work)

    @property
    def cached(self) -> int:
        return sum(w.cached for w in self.work)

    def line(self, workers: int) -> str:
        """The line `normlab study` starts with."""
        counts = ", ".join(f"{w.cached} of {w.units} {w.kind}" for w in self.work if w.units)
        if self.cached == self.units:
            return (f"nothing left to train: every unit of work is cached in the study folder "
                    f"({counts}); the verdicts are recomputed from it")
        measured = "; ".join(f"{k} {v:.3f} s a step" for k, v in self.step_s.items())
        return (f"estimated {format_duration(self.seconds)} on this machine ({counts} cached; "
                f"{workers} workers; measured here: {measured or 'no training left'})")


def estimate(ctx: StudyFolder, timer: _StepTimer | None = None) -> Estimate:
    """What the selected claims of `ctx`'s profile have left to do in `ctx`'s folder, and its
    wall time here: per unit of work, the seconds per step measured on this machine for the
    unit's model shape (`time_steps`, with one worker's share of the cores) times the unit's
    steps, plus its evaluations (forward passes timed the same way); a unit whose result the
    folder already holds counts 0 s. A tuned grid's extensions are replayed from its finished
    runs (`StudyFolder._tuning`); where they are not yet known, one more cell per grid is
    counted (the recorded studies extend most grids once). The grids are those every selected
    claim tunes (`StudyFolder.tuned_specs`) and the deep models'; each claim's own runs and
    work beyond them it tells through its `work` hook (`normlab.study.context.WorkPlan`: C6a's
    runs without warmup, C10's fine-tunings, C14's k-hop models). Training runs share the
    workers in rounds, as the grids tuned together train them (a round of n runs takes
    ceil(n / workers) runs' time); ladders at init and other work (C10's fine-tunings) are
    counted in training steps of the profile's shape (each claim's `work`). The steps are timed on
    the study's device (`timer`: one that has timed shapes already, or a new one)."""
    p = ctx.profile
    quiet = StudyFolder(ctx.out, p, lambda _m: None, claims=ctx.claims, device=ctx.device)
    selected = set(ctx.claims if ctx.claims is not None else ALL_CLAIMS)
    timer = timer or _StepTimer(p.workers, ctx.device)
    rounds: list[list[RunConfig]] = []  # runs trained together
    # grids tuned together train their first cells together, and extend together
    firsts: list[RunConfig] = []
    extensions: list[RunConfig] = []
    finished = 0
    seen: set[str] = set()  # a run two grids share (C6a's cells in C6b's grid) counts once

    def count(configs: list[RunConfig]) -> list[RunConfig]:
        """Of `configs` not counted yet, those still to train (the finished ones counted)."""
        nonlocal finished
        new = [c for c in configs if c.run_id() not in seen]
        seen.update(c.run_id() for c in new)
        todo = [c for c in new if not _done(quiet, c)]
        finished += len(new) - len(todo)
        return todo

    def grid(label: str, warmup: int, start: Sequence[float],
             configs: Callable[[float], list[RunConfig]]) -> Any:
        """Replay one grid's tuning on its finished runs: its `TunedGrid` when every cell it
        asks for is finished, else None (what is left goes into `rounds`)."""
        tuner = quiet._tuning(label, warmup, start)
        asked, first = next(tuner), True
        while True:
            cells = {lr: configs(lr) for lr in asked}
            if any(not _done(quiet, c) for cs in cells.values() for c in cs):
                todo = count([c for cs in cells.values() for c in cs])
                if first:  # and the extension it will ask for once these have trained
                    firsts.extend(todo)
                    extensions.extend(configs(start[-1]))
                else:
                    rounds.append(todo)
                return None
            count([c for cs in cells.values() for c in cs])
            try:
                asked = tuner.send({lr: [_record(quiet, c) for c in cs]
                                    for lr, cs in cells.items()})
            except StopIteration as stop:
                return stop.value
            first = False

    def runs(configs: list[RunConfig]) -> None:
        rounds.append(count(configs))

    seeds = range(p.seeds)
    tuned = {}
    for family, warmup in quiet.tuned_specs():
        tuned[(family, warmup)] = grid(
            family, warmup, p.lrs,
            lambda lr, f=family, w=warmup: [quiet.family_config(f, lr, w, s) for s in seeds])
    for family in deep_families(p, selected):  # the deep models the selected claims read
        grid(family, p.deep_warmup, p.deep_start_lrs,
             lambda lr, f=family: [quiet.family_config(f, lr, p.deep_warmup, s, p.deep_blocks)
                                   for s in seeds])
    # the grids whose runs are finished, as the folder's tuning (a claim's hook reads them
    # through the folder without training anything)
    quiet.memo.update({_tuned_key(f, w, None): g for (f, w), g in tuned.items()
                        if g is not None})
    plan = _Plan(quiet, p, tuned, grid, runs, rounds, timer)
    for cid in ALL_CLAIMS:  # each selected claim's own runs and work (a profile that leaves
        # the claims at init out: theirs neither)
        claim = REGISTRY[cid]
        if cid in selected and claim.work is not None and (p.theory or claim.ladder is None):
            claim.work(plan)
    rounds = [r for r in [firsts, *rounds, extensions] if r]
    todo_runs = sum(len(r) for r in rounds)
    work = [Work("training runs", finished + todo_runs, finished,
                 sum(timer.round_seconds(r) for r in rounds))]
    work += plan.ladders() + plan.other
    return Estimate(tuple(work), timer.measured())


class _Plan:
    """The `WorkPlan` (`normlab.study.context`) a claim's `work` hook tells `estimate` its own
    runs and work through."""

    def __init__(self, folder: StudyFolder, profile: Profile,
                 tuned: dict[tuple[str, int], Any], grid: Callable[..., Any],
                 runs: Callable[[list[RunConfig]], None], rounds: list[list[RunConfig]],
                 timer: _StepTimer) -> None:
        self.folder, self.profile = folder, profile
        self._tuned, self._grid, self._runs, self._rounds = tuned, grid, runs, rounds
        self._timer = timer
        self._ladders: dict[str, float] = {}
        self.other: list[Work] = []

    def tuned(self, family: str, warmup: int) -> Any:
        return self._tuned.get((family, warmup))

    def grid(self, label: str, warmup: int, start: Sequence[float],
             configs: Callable[[float], list[RunConfig]]) -> Any:
        return self._grid(label, warmup, start, configs)

    def runs(self, configs: list[RunConfig]) -> None:
        self._runs(configs)

    def later(self, configs: list[RunConfig]) -> None:
        self._rounds.append(configs)

    def ladder(self, name: str, steps: float) -> None:
        self._ladders.setdefault(name, steps)

    def ladders(self) -> list[Work]:
        """The ladders at init the claims read, those with a cache file counted 0 s."""
        if not self._ladders:
            return []
        left = [k for k in self._ladders if not (self.folder.cache_dir / f"{k}.json").exists()]
        steps = sum(self._ladders[k] for k in left)
        step = self._timer.step(self._timer.train_config(self.profile)) if left else 0.0
        return [Work("ladders at init", len(self._ladders), len(self._ladders) - len(left),
                     steps * step if left else 0.0)]

    def work(self, kind: str, units: int, cached: int, steps: float,
             parallel: bool = False) -> None:
        p = self.profile
        step = self._timer.step(self._timer.train_config(p)) if steps else 0.0
        self.other.append(Work(kind, units, cached,
                               steps * step / (max(1, p.workers) if parallel else 1)))


def _done(ctx: StudyFolder, cfg: RunConfig) -> bool:
    return _finished(ctx.runs_root / cfg.run_id())


def _record(ctx: StudyFolder, cfg: RunConfig) -> Any:
    from normlab.train import read_summary

    return record(cfg, read_summary(ctx.runs_root / cfg.run_id()) or {}, lr=cfg.train.lr,
                  warmup=cfg.train.warmup, seed=cfg.train.seed)


class _StepTimer:
    """Seconds per training step and per evaluation batch, measured here on the study's
    `device` once per model shape with one worker's share of the cores (each worker trains with
    that share: timed with every core, the step came out 1.6x short on 2 cores)."""

    def __init__(self, workers: int, device: str = "cpu") -> None:
        self.workers = max(1, workers)
        self.device = device
        self._times: dict[tuple, tuple[float, float]] = {}

    def train_config(self, p: Profile) -> RunConfig:
        from normlab.config import load_run_config

        return load_run_config(None, [
            f"model.n_blocks={p.train_blocks}", f"model.d_model={p.train_width}",
            f"model.n_heads={p.train_heads}", f"model.max_seq_len={p.seq_len}",
            f"data.seq_len={p.seq_len}", f"train.batch_size={p.batch_size}",
            f"train.device={self.device}"])

    def _measure(self, cfg: RunConfig) -> tuple[float, float]:
        m = cfg.model
        key = (m.n_blocks, m.d_model, m.n_heads, m.vocab_size, cfg.data.seq_len,
               cfg.train.batch_size)
        if key not in self._times:
            threads = torch.get_num_threads()
            torch.set_num_threads(default_threads(self.workers))
            try:
                self._times[key] = (time_steps(cfg, steps=3, warmup_steps=1),
                                    time_forward(cfg))
            finally:
                torch.set_num_threads(threads)
        return self._times[key]

    def step(self, cfg: RunConfig) -> float:
        return self._measure(cfg)[0]

    def run_seconds(self, cfg: RunConfig) -> float:
        """A run's steps and its evaluations (every `eval_every` steps and at the end)."""
        step_s, forward_s = self._measure(cfg)
        t = cfg.train
        evals = t.steps // t.eval_every + bool(t.steps % t.eval_every) if t.eval_every else 1
        return t.steps * step_s + evals * t.eval_batches * forward_s

    def round_seconds(self, configs: list[RunConfig]) -> float:
        """Runs trained together on the workers: ceil(n / workers) runs' time."""
        mean = sum(self.run_seconds(c) for c in configs) / len(configs)
        return math.ceil(len(configs) / self.workers) * mean

    def measured(self) -> dict[str, float]:
        return {f"{b} blocks x width {d}, batch {n} x {s}": v[0]
                for (b, d, _h, _v, s, n), v in self._times.items()}


def _sync(device: str) -> float:
    """The time once `device` has finished its queued work (a GPU runs asynchronously)."""
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _device(cfg: Any) -> str:
    from normlab.train.trainer import resolve_device

    return resolve_device(cfg.train.device).type


def time_steps(cfg: Any, steps: int = 3, warmup_steps: int = 2) -> float:
    """Seconds per steady training step (forward, backward, optimizer step) of `cfg`'s model on
    random bytes on its device (`train.device`), after `warmup_steps` untimed steps (first calls
    allocate and pick kernels)."""
    from normlab.nn import build_model
    from normlab.train.optim import build_optimizer

    device = _device(cfg)
    # a measurement: the caller's generators untouched
    with torch.random.fork_rng(devices=[0] if device == "cuda" else []):
        model = build_model(cfg.model, seed=0).to(device)
        opt = build_optimizer(model, cfg.train, fused=True)  # the optimizer a run uses
        gen = torch.Generator().manual_seed(0)
        idx = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.data.seq_len),
                            generator=gen).to(device)
        for i in range(warmup_steps + steps):
            if i == warmup_steps:
                t0 = _sync(device)
            model(idx, idx).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        t1 = _sync(device)
    return (t1 - t0) / steps


def time_forward(cfg: Any, batches: int = 3) -> float:
    """Seconds per evaluation batch (a forward without gradients) of `cfg`'s model on random
    bytes on its device (`train.device`), after one untimed batch."""
    from normlab.nn import build_model

    device = _device(cfg)
    with torch.random.fork_rng(devices=[0] if device == "cuda" else []), torch.no_grad():
        model = build_model(cfg.model, seed=0).to(device).eval()
        idx = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.data.seq_len),
                            generator=torch.Generator().manual_seed(0)).to(device)
        model(idx, idx)
        t0 = _sync(device)
        for _ in range(batches):
            model(idx, idx)
        t1 = _sync(device)
    return (t1 - t0) / batches


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _machine() -> str:
    return f"{cpu_model()}, {torch.get_num_threads()} threads, {platform.system()}"
