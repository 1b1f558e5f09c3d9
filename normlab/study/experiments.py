"""The measurements the claims share, computed once per study folder and cached there.

- `init_sweep`: probes of models at init over placements x depths x seeds (Xavier init, the
  setting of Xiong et al.'s analysis, for every placement so only the placement differs).
- `runs`: training runs on the Shakespeare corpus (a grid over placement x lr x warmup x seed,
  plus the variants some claims need); each is an ordinary run folder under `runs/`, so a study
  re-run trains nothing twice and an interrupted one resumes.
- `trained_probes`: probes of the checkpoints of the tuned runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.config import ModelConfig, RunConfig, load_run_config, parse_config
from normlab.probe import probe_model, text_batches
from normlab.probe.suite import finite_or_none
from normlab.probe.sweep import depth_sweep
from normlab.study.profiles import Profile
from normlab.train import load_trained_model
from normlab.train.logging import write_json_atomic
from normlab.train.trainer import FINISHED, train_many_step

# A diverged run scores the loss of the uniform byte predictor: it learned nothing usable.
DIVERGED_LOSS = math.log(256)

Log = Callable[[str], None]


class StudyContext:
    """Caches shared measurements in the study folder; every claim reads from here."""

    def __init__(self, out: Path, profile: Profile, log: Log) -> None:
        self.out, self.profile, self.log = out, profile, log
        self.cache_dir = out / "cache"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.fig_dir = out / "figures"
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        self.runs_root = out / "runs"
        self._memo: dict[str, Any] = {}

    # -- caching ------------------------------------------------------------------------------
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
        value = finite_or_none(compute())
        write_json_atomic(path, value)
        self._memo[name] = value
        return value

    # -- inputs -------------------------------------------------------------------------------
    def probe_batches(self, seq_len: int | None = None) -> list:
        p = self.profile
        return text_batches("shakespeare", n_batches=p.probe_batches,
                            batch_size=p.probe_batch_size, seq_len=seq_len or p.probe_seq_len)

    def init_base(self, **fields: Any) -> ModelConfig:
        p = self.profile
        data = {"d_model": p.width, "n_heads": p.heads, "max_seq_len": p.probe_seq_len,
                "init": "xavier", **fields}
        return parse_config(ModelConfig, data)

    # -- shared measurements ------------------------------------------------------------------
    def init_sweep(self) -> dict[str, Any]:
        """pre / post / admin / deepnorm at every init depth and seed: stream, grads, perturb."""
        def compute() -> dict[str, Any]:
            p = self.profile
            self.log(f"depth sweep at init: depths {list(p.init_depths)}, {p.init_seeds} seeds")
            placements = ["pre", "post", "admin", "deepnorm"]
            result = {}
            for placement in placements:
                # admin and deepnorm keep their own inits (their constants are part of the method)
                init = "xavier" if placement in ("pre", "post") else None
                base = self.init_base(init=init)
                result[placement] = depth_sweep(
                    base, [placement], list(p.init_depths), list(range(p.init_seeds)),
                    self.probe_batches(), ("stream", "grads", "perturb"))
            return result
        return self.cached("init_sweep", compute)

    def update_sizes(self) -> dict[str, Any]:
        """DeepNet's model update ||f(x; theta_t) - f(x; theta_0)|| over the first steps, at the
        deepest init depth and the highest learning rate of the grid."""
        def compute() -> dict[str, Any]:
            from normlab.nn import build_model

            p = self.profile
            L, lr = max(p.init_depths), max(p.lrs)
            self.log(f"update size: {L} blocks, lr {lr:g}, {p.update_steps} steps")
            train_batches = text_batches("shakespeare", n_batches=p.update_steps,
                                         batch_size=p.probe_batch_size,
                                         seq_len=p.probe_seq_len, split="train")
            batches = self.probe_batches()
            variants = {"post, no warmup": ("post", "xavier", 0),
                        "post, warmup": ("post", "xavier", p.update_steps),
                        "deepnorm, no warmup": ("deepnorm", None, 0),
                        "pre, no warmup": ("pre", "xavier", 0)}
            out: dict[str, Any] = {"n_blocks": L, "lr": lr, "steps": p.update_steps,
                                   "series": {}}
            for label, (placement, init, warmup) in variants.items():
                per_seed = []
                for seed in range(p.init_seeds):
                    model = build_model(self.init_base(placement=placement, n_blocks=L,
                                                       init=init), seed=seed)
                    res = probe_model(model, batches[:1], ("update",), train_batches=train_batches,
                                      update_steps=p.update_steps, update_lr=lr,
                                      update_warmup=warmup, seed=seed)
                    per_seed.append(res["series"]["update_size"])
                out["series"][label] = per_seed
            return out
        return self.cached("update_sizes", compute)

    def run_config(self, placement: str, lr: float, warmup: int, seed: int,
                   **model: Any) -> RunConfig:
        p = self.profile
        sets = [f"model.placement={placement}", f"model.n_blocks={p.train_blocks}",
                f"model.d_model={p.train_width}", f"model.n_heads={p.train_heads}",
                f"model.max_seq_len={p.seq_len}", f"data.seq_len={p.seq_len}",
                f"train.batch_size={p.batch_size}", f"train.steps={p.steps}", f"train.lr={lr}",
                f"train.warmup={warmup}", f"train.seed={seed}",
                f"train.eval_every={max(1, p.steps // 4)}", f"train.eval_batches={p.eval_batches}",
                f"train.log_every={max(1, p.steps // 50)}",
                f"train.checkpoint_every={max(50, p.steps // 5)}", "train.device=cpu"]
        sets += [f"model.{k}={v}" for k, v in model.items()]
        return load_run_config(None, sets)

    def train(self, configs: list[RunConfig]) -> list[dict[str, Any]]:
        """Train (or reuse) every run; returns their summaries in order. Runs still to do go to
        the sweep's local worker processes (one torch thread share each)."""
        todo = [c for c in configs if not _finished(self.runs_root / c.run_id())]
        if todo:
            self.log(f"training {len(todo)} run(s) of {len(configs)} "
                     f"({self.profile.steps} steps each, {self.profile.workers} workers)")
        if len(todo) > 1 and self.profile.workers > 1:
            from normlab.sweep.executors import Task, default_threads, run_local

            finished = []

            def on_finish(run_id: str, summary: dict[str, Any], _wall: float) -> None:
                finished.append(run_id)
                self.log(f"  {len(finished)}/{len(todo)} {run_id}: {summary.get('outcome')}"
                         + (f" ({summary['reason']})" if summary.get("reason") else ""))

            workers = self.profile.workers
            run_local([Task(c.run_id(), c.to_dict()) for c in todo], self.runs_root,
                      workers=workers, threads=default_threads(workers),
                      on_start=lambda _run_id: None, on_finish=on_finish)
        return [train_many_step(cfg, self.runs_root, progress=False) for cfg in configs]

    def grid(self) -> dict[str, Any]:
        """pre and post x lrs x {warmup} x seeds (C9, C3, C13) plus no-warmup runs at the top
        lr (C6) and pre without final norm at every lr (C11)."""
        if "grid" in self._memo:
            return self._memo["grid"]
        p = self.profile
        table: dict[str, Any] = {}
        specs: list[tuple[str, RunConfig]] = []
        for placement in ("pre", "post"):
            for lr in p.lrs:
                for seed in range(p.seeds):
                    specs.append((f"{placement}|{lr}|{p.warmup}|{seed}|final",
                                  self.run_config(placement, lr, p.warmup, seed)))
            for seed in range(p.seeds):
                specs.append((f"{placement}|{max(p.lrs)}|0|{seed}|final",
                              self.run_config(placement, max(p.lrs), 0, seed)))
        for lr in p.lrs:
            for seed in range(p.seeds):
                specs.append((f"pre|{lr}|{p.warmup}|{seed}|nofinal",
                              self.run_config("pre", lr, p.warmup, seed, final_norm="off")))
        summaries = self.train([c for _, c in specs])
        for (key, cfg), s in zip(specs, summaries, strict=True):
            table[key] = {"run_id": cfg.run_id(), "outcome": s["outcome"],
                          "reason": s.get("reason"), "step": s.get("step"),
                          "val_loss": s.get("val_loss"), "train_loss": s.get("train_loss"),
                          "score": score(s)}
        self._memo["grid"] = table
        return table

    def tuned_lr(self, placement: str, variant: str = "final") -> float:
        """The grid lr with the lowest mean final validation loss (diverged runs scored as the
        uniform predictor's loss)."""
        p, grid = self.profile, self.grid()
        means = {lr: sum(grid[f"{placement}|{lr}|{p.warmup}|{s}|{variant}"]["score"]
                         for s in range(p.seeds)) / p.seeds for lr in p.lrs}
        return min(means, key=means.get)

    def trained_probes(self) -> dict[str, Any]:
        """stream, merge, drop and lens probes of the tuned pre and post runs, per seed."""
        def compute() -> dict[str, Any]:
            p = self.profile
            grid = self.grid()
            batches = self.probe_batches(seq_len=min(p.probe_seq_len, p.seq_len))
            out: dict[str, Any] = {}
            for placement in ("pre", "post"):
                lr = self.tuned_lr(placement)
                out[placement] = {"lr": lr, "seeds": []}
                for seed in range(p.seeds):
                    entry = grid[f"{placement}|{lr}|{p.warmup}|{seed}|final"]
                    _, model = load_trained_model(self.runs_root / entry["run_id"])
                    res = probe_model(model, batches, ("stream", "merge", "drop", "lens"),
                                      seed=seed)
                    out[placement]["seeds"].append({"outcome": entry["outcome"],
                                                    "per_block": res["per_block"],
                                                    "summary": res["summary"]})
            self.log("probed the tuned pre and post checkpoints")
            return out
        return self.cached("trained_probes", compute)


def score(summary: dict[str, Any]) -> float:
    """Final validation loss, or the uniform predictor's loss for a run that did not finish."""
    if summary.get("outcome") == "completed" and isinstance(summary.get("val_loss"), float):
        return summary["val_loss"]
    return DIVERGED_LOSS


def _finished(run_dir: Path) -> bool:
    from normlab.train import read_summary

    s = read_summary(run_dir)
    return bool(s and s.get("outcome") in FINISHED)
