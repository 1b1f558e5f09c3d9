"""The measurements behind the theory claims' ladders, cached in the study folder.

- `init_ladder`: every rung x placement x depth x seed at init: `normlab.probe.init_stats` (squared
  stream norms, Post-LN's norm input, each block's W^2 gradient) and, on request, the output
  change under a weight perturbation (Admin's measure);
- `update_ladder`: DeepNet's model update `||f(x; theta_1) - f(x; theta_0)||` after the first
  AdamW steps, per rung x variant x depth x seed, and the distance between two independent inits
  (the scale at which the measure saturates).

Placements may name a variant of a placement: `admin_o1` is Admin with admin-torch's O(1) omega.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from normlab.config import ModelConfig, parse_config
from normlab.study.ladders import Rung

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "admin_o1": ("admin", {"admin_omega": "o1"}),
}


def rung_config(ctx: Any, rung: Rung, placement: str, n_blocks: int) -> ModelConfig:
    """The model of `rung` for `placement` (or a variant in `VARIANTS`) at depth `n_blocks`."""
    base, extra = VARIANTS.get(placement, (placement, {}))
    data = {"n_blocks": n_blocks, "max_seq_len": ctx.profile.probe_seq_len,
            **rung.model_fields(base), **extra}
    return parse_config(ModelConfig, data)


def init_ladder(ctx: Any, name: str, rungs: Sequence[Rung], placements: Sequence[str],
                depths: Sequence[int], perturb: bool = False, stats: bool = True
                ) -> dict[str, Any]:
    """`{rung.key: {placement: [{"n_blocks", "seed", "stats", "perturb_change"}]}}` (`stats`:
    `normlab.probe.init_stats`; `perturb`: Admin's output change). Each model is one cell
    (`init_cell`), measured on the study's workers (`map_local`)."""
    def compute() -> dict[str, Any]:
        p = ctx.profile
        batches = ctx.probe_batches()
        ctx.log(f"{name}: {len(rungs)} rungs x {len(placements)} placements x depths "
                f"{list(depths)} x {p.init_seeds} seeds at init{_where(ctx)}")
        keys = [(rung.key, placement) for rung in rungs for placement in placements]
        cells = [(rung_config(ctx, rung, placement, L), seed, batches, stats, perturb,
                  _device(ctx)) for rung in rungs for placement in placements
                 for L in depths for seed in range(p.init_seeds)]
        rows = iter(_on_workers(ctx, init_cell, cells))
        out: dict[str, Any] = {}
        for key, placement in keys:
            out.setdefault(key, {})[placement] = [
                next(rows) for _L in depths for _seed in range(p.init_seeds)]
        return out
    return ctx.cached(name, compute)


def init_cell(cell: tuple[ModelConfig, int, list, bool, bool, str]) -> dict[str, Any]:
    """One model of `init_ladder`: `cfg` built at `seed`, measured on `batches` on `device`."""
    from normlab.nn import build_model
    from normlab.probe.init_stats import init_statistics
    from normlab.probe.inputs import on_device
    from normlab.probe.sensitivity import perturbation_sensitivity

    cfg, seed, batches, stats, perturb, device = cell
    model, batches = on_device(build_model(cfg, seed=seed), batches, device)
    row: dict[str, Any] = {"n_blocks": cfg.n_blocks, "seed": seed}
    if stats:
        row["stats"] = init_statistics(model, batches)
    if perturb:
        row["perturb_change"] = perturbation_sensitivity(model, batches,
                                                         seed=seed)["perturb_change"]
    return row


UPDATE_VARIANTS: dict[str, tuple[str, bool, bool]] = {
    # label: (placement, with warmup, measured at every depth: the depth law's variants)
    "post, no warmup": ("post", False, True),
    "deepnorm, no warmup": ("deepnorm", False, True),
    "post, warmup": ("post", True, False),
    "pre, no warmup": ("pre", False, False),
}


def update_ladder(ctx: Any, name: str, rungs: Sequence[tuple[Rung, float]],
                  depths: Sequence[int], steps: int, warmup: int,
                  variants: Sequence[str] | None = None, distance: bool = True
                  ) -> dict[str, Any]:
    """DeepNet's model update per (rung, lr) x variant x seed, at every depth for the depth
    law's variants and at the deepest for the others, and the init-to-init distance of post per
    rung and depth: `{rung.key: {"lr", "series": {label: [{"n_blocks", "seed", "update": [..]}]},
    "init_distance": [{"n_blocks", "seed", "distance"}]}}`. Each model (or pair of inits) is
    one cell (`update_cell`), measured on the study's workers (`map_local`). `variants` (labels
    of `UPDATE_VARIANTS`; None: all) and `distance` (False: no init-to-init distance) ask for
    less: C7's linear regime reads post and DeepNorm only, at lrs where nothing saturates."""
    labels = list(UPDATE_VARIANTS) if variants is None else list(variants)
    def compute() -> dict[str, Any]:
        from normlab.probe import text_batches

        p = ctx.profile
        train = text_batches("shakespeare", n_batches=steps, batch_size=p.probe_batch_size,
                             seq_len=p.probe_seq_len, split="train")
        batches = ctx.probe_batches()
        ctx.log(f"{name}: {len(rungs)} rungs x {len(labels)} variants x depths "
                f"{list(depths)} x {p.init_seeds} seeds, {steps} steps{_where(ctx)}")
        slots: list[tuple[str, str | None]] = []  # (rung key, variant label, or None: distance)
        cells: list[tuple] = []
        for rung, lr in rungs:
            for L in depths:
                for label in labels:
                    placement, warm, every_depth = UPDATE_VARIANTS[label]
                    if not every_depth and max(depths) != L:
                        continue
                    cfg = rung_config(ctx, rung, placement, L)
                    for seed in range(p.init_seeds):
                        slots.append((rung.key, label))
                        cells.append(("update", cfg, seed, _device(ctx), train, batches[0],
                                      steps, lr, warmup if warm else 0))
                cfg = rung_config(ctx, rung, "post", L)
                for seed in range(p.init_seeds if distance else 0):
                    slots.append((rung.key, None))
                    cells.append(("distance", cfg, seed, _device(ctx), batches[0]))
        out: dict[str, Any] = {rung.key: {"lr": lr, "series": {label: [] for label in
                                                               labels},
                                          "init_distance": []} for rung, lr in rungs}
        for (key, label), row in zip(slots, _on_workers(ctx, update_cell, cells), strict=True):
            if label is None:
                out[key]["init_distance"].append(row)
            else:
                out[key]["series"][label].append(row)
        return out
    return ctx.cached(name, compute)


def update_cell(cell: tuple) -> dict[str, Any]:
    """One cell of `update_ladder`, on `device`: the model update of `cfg` at `seed` after
    `steps` steps (`("update", cfg, seed, device, train, eval_batch, steps, lr, warmup)`), or
    the output distance between its inits at `seed` and `seed + 10_000` on the eval batch
    (`("distance", cfg, seed, device, eval_batch)`)."""
    from normlab.nn import build_model
    from normlab.probe.inputs import on_device
    from normlab.probe.sensitivity import update_size

    kind, cfg, seed, device = cell[:4]
    if kind == "distance":
        a, [batch] = on_device(build_model(cfg, seed=seed), [cell[4]], device)
        b, _ = on_device(build_model(cfg, seed=seed + 10_000), [], device)
        return {"n_blocks": cfg.n_blocks, "seed": seed,
                "distance": output_distance(a, b, batch[0])}
    train, eval_batch, steps, lr, warmup = cell[4:]
    model, [eval_batch, *train] = on_device(build_model(cfg, seed=seed), [eval_batch, *train],
                                            device)
    res = update_size(model, train, eval_batch, steps=steps, lr=lr, warmup=warmup, seed=seed)
    return {"n_blocks": cfg.n_blocks, "seed": seed, "update": res["update_size"]}


def _device(ctx: Any) -> str:
    """Where the ladders measure: the study's device (`--device`)."""
    return str(ctx.device)


def _where(ctx: Any) -> str:
    """What a ladder's log line says of its device: nothing on the CPU."""
    return "" if _device(ctx) == "cpu" else f" on {_device(ctx)}"


def _on_workers(ctx: Any, fn: Any, cells: list) -> list:
    """`fn` over `cells` on the study's local workers (`normlab.sweep.executors.map_local`:
    in this process outside a study's kept pool, when the study trains on a Ray cluster, or
    when it measures on a GPU, where one process keeps the device busy: the cells are small
    models, and each worker process would hold a CUDA context of its own)."""
    from normlab.sweep.executors import map_local
    from normlab.train.machine import default_threads

    if getattr(ctx, "executor", "local") != "local" or _device(ctx) != "cpu":
        return [fn(cell) for cell in cells]
    workers = ctx.profile.workers
    return map_local(fn, cells, workers=workers, threads=default_threads(workers))


def output_distance(a: Any, b: Any, idx: Any) -> float:
    """Mean over tokens of ||f_a(x) - f_b(x)|| on the stream the head reads (tap final.out)."""
    import torch

    from normlab.nn import capture

    outs = []
    for model in (a, b):
        model.eval()
        with torch.no_grad(), capture(model, "final.out") as cache:
            model.stream(idx)
        outs.append(cache["final.out"])
    return (outs[0] - outs[1]).norm(dim=-1).mean().item()
