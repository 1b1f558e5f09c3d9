"""The stacked optimizer's step: `StackedAdamW.step` (one fused-kernel call per distinct setting,
over the rows of every member with it) against the per-member calls it replaced (kept here only to
compare), at 8, 64 and 256 members of a small decoder, as an lr x seed grid of 8 lrs.

    python benchmarks/bench_stacked_adamw.py            # records results/bench_stacked_adamw.*
    python benchmarks/bench_stacked_adamw.py --quick    # a smoke run, nothing recorded
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from recording import new_report, record

from normlab.config import make_model_config
from normlab.nn import build_model
from normlab.nn.stacked import StackedTransformer
from normlab.train.optim import decayed_names
from normlab.train.stacked_adamw import StackedAdamW

HP = dict(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
LRS = 8  # distinct lrs of the grid: member i trains at lr 1e-3 * 2 ** -(i % LRS)


def per_member_step(optim: StackedAdamW, grads: torch.Tensor, hp: list[dict]) -> None:
    """The step as it was: torch's fused AdamW kernel on each member's row, its decayed and
    undecayed columns apart (step counts advanced by the caller)."""
    n, total = optim.n_decayed, optim.flat.shape[1]
    parts = [(slice(0, n), True)] * (n > 0) + [(slice(n, total), False)] * (total > n)
    for i, h in enumerate(hp):
        step = torch.tensor(float(optim.steps[i]), device=optim.flat.device)
        for cols, decayed in parts:
            torch._fused_adamw_(
                [optim.flat[i, cols]], [grads[i, cols]], [optim.exp_avg[i, cols]],
                [optim.exp_avg_sq[i, cols]], [], [step], amsgrad=False, maximize=False,
                lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"], eps=h["eps"],
                weight_decay=h["weight_decay"] if decayed else 0.0)


def time_steps(fn, steps: int) -> float:
    fn()  # untimed: first calls allocate
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "bench_stacked_adamw.json")
    args = ap.parse_args()
    if args.quick:
        args.members, args.steps = [2, 4], 2
    cfg = make_model_config(placement="pre", n_blocks=args.blocks, d_model=args.width,
                            n_heads=max(1, args.width // 32), max_seq_len=64)
    decayed = decayed_names(build_model(cfg, seed=0))
    rows = []
    for m in args.members:
        stacked = StackedTransformer([build_model(cfg, seed=s) for s in range(m)]).to(args.device)
        optim = StackedAdamW(stacked, decayed)
        grads = torch.randn_like(optim.flat) * 1e-2
        hp = [HP | {"lr": HP["lr"] * 2.0 ** -(i % LRS)} for i in range(m)]
        new = time_steps(lambda o=optim, g=grads, h=hp: o.step(g.clone(), h), args.steps)
        old = time_steps(lambda o=optim, g=grads, h=hp: per_member_step(o, g.clone(), h),
                         args.steps)
        clone = time_steps(lambda g=grads: g.clone(), args.steps)  # (both pay it)
        rows.append({"members": m, "params_per_member": optim.flat.shape[1],
                     "old_ms": 1e3 * (old - clone), "new_ms": 1e3 * (new - clone),
                     "old_over_new": (old - clone) / (new - clone)})
        print(f"{m:4d} members x {optim.flat.shape[1]:,} params: per-member fused "
              f"{rows[-1]['old_ms']:.2f} ms, grouped {rows[-1]['new_ms']:.2f} ms, "
              f"old/new {rows[-1]['old_over_new']:.2f}", flush=True)
    report = new_report(args, shape=f"pre, {args.blocks} blocks, width {args.width}",
                        steps=args.steps, rows=rows)

    def markdown(r: dict) -> str:
        lines = [f"# bench_stacked_adamw results ({r['date']})", "",
                 f"{r['cpu']}, {r['threads']} torch threads, torch {r['torch']}, device "
                 f"{r['device']}. One optimizer step of a stack of {r['shape']} decoders "
                 f"(median of {r['steps']}, the gradient copy subtracted), members at {LRS} "
                 "distinct lrs.", "",
                 "| members | params per member | per-member fused (ms) | grouped fused (ms) | "
                 "old/new |", "|---:|---:|---:|---:|---:|"]
        lines += [f"| {x['members']} | {x['params_per_member']:,} | {x['old_ms']:.2f} | "
                  f"{x['new_ms']:.2f} | {x['old_over_new']:.2f} |" for x in r["rows"]]
        return "\n".join(lines) + "\n"

    record(args, report, markdown)


if __name__ == "__main__":
    main()
