#!/usr/bin/env python
"""Where one training step's time goes: normlab `pre` at the shapes of `bench_peers.py`, one
step profiled by `torch.profiler` (operators' own CPU time, averaged over steps), grouped by kind.

A step is what a run's step does: forward and cross-entropy, backward, the gradient norm and
clipping, fused AdamW's update, `zero_grad`. The groups: matrix products (mm, addmm, bmm, the
linear layers), attention's fused kernel, GELU, LayerNorm, the loss (log-softmax), copies and
fills, the optimizer, and everything else (small elementwise and view operators, autograd's
bookkeeping). The share of each, and the milliseconds a step, are printed per shape; the
results go to benchmarks/results/profile_step.json and .md with the CPU's name and flags.

    python benchmarks/profile_step.py              # the three shapes, fp32, this process's threads
    python benchmarks/profile_step.py --threads 1  # as a study worker runs
    python benchmarks/profile_step.py --quick      # tiny shapes, seconds, records nothing
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run from a checkout without installing
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_peers import QUICK_SHAPES, SHAPES, VOCAB, Shape  # noqa: E402
from recording import new_report, record  # noqa: E402

from normlab.config import ModelConfig  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.train.optim import param_groups  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "profile_step.json"
# operator name -> group; the first group whose words occur in the name
GROUPS = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                         "aten::matmul")),
    ("attention kernel", ("scaled_dot_product", "flash_attention")),
    ("GELU", ("gelu",)),
    ("LayerNorm", ("layer_norm",)),
    ("loss (log-softmax, NLL)", ("log_softmax", "nll_loss")),
    ("copies and fills", ("aten::copy_", "aten::fill_", "aten::zero_", "aten::clone")),
    ("optimizer (fused AdamW, zero_grad)", ("adamw", "Optimizer.")),
    ("gradient norm and clipping", ("linalg_vector_norm", "_foreach_norm", "aten::stack",
                                    "_foreach_mul")),
)
OTHER = "other operators and autograd"


def group_of(name: str) -> str:
    low = name.lower()
    for group, words in GROUPS:
        if any(w.lower() in low for w in words):
            return group
    return OTHER


def profile_shape(shape: Shape, steps: int, warmup: int) -> dict:
    cfg = ModelConfig(placement="pre", vocab_size=VOCAB, n_blocks=shape.blocks,
                      d_model=shape.width, n_heads=shape.heads, max_seq_len=shape.seq_len)
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (shape.batch, shape.seq_len), generator=gen)
    y = torch.randint(0, VOCAB, (shape.batch, shape.seq_len), generator=gen)

    def step() -> None:
        model(x, y).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - t0) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    by_group: dict[str, float] = {}
    for event in prof.key_averages():
        group = group_of(event.key)
        by_group[group] = by_group.get(group, 0.0) + event.self_cpu_time_total / 1e3 / steps
    total = sum(by_group.values())
    order = [g for g, _ in GROUPS] + [OTHER]
    return {"shape": shape.name, "words": shape.words(), "step_ms": wall * 1e3,
            "profiled_ms": total,
            "groups": {g: {"ms": by_group.get(g, 0.0), "share": by_group.get(g, 0.0) / total}
                       for g in order}}


def markdown(report: dict) -> str:
    lines = [f"# profile_step results ({report['date']})", "",
             f"{report['cpu']}, {report['threads']} torch thread(s), torch {report['torch']}; "
             "normlab pre, fp32, one full training step (forward + loss, backward, clipping, "
             f"fused AdamW); operators' own CPU time averaged over {report['steps']} steps.",
             "", "| shape | step (ms) | " + " | ".join(report["group_names"]) + " |",
             "|---|---:|" + "---:|" * len(report["group_names"])]
    for row in report["rows"]:
        cells = [f"{row['groups'][g]['share']:.0%}" for g in report["group_names"]]
        lines.append(f"| {row['words']} | {row['step_ms']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes, records nothing")
    p.add_argument("--steps", type=int, default=10, help="profiled steps per shape (10)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (5)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    args.device = "cpu"
    report = new_report(args, steps=args.steps, rows=[],
                        group_names=[g for g, _ in GROUPS] + [OTHER])
    for shape in shapes:
        row = profile_shape(shape, args.steps, args.warmup)
        report["rows"].append(row)
        print(f"{row['words']}: {row['step_ms']:.1f} ms a step")
        for g, v in row["groups"].items():
            print(f"  {g:<36} {v['ms']:7.2f} ms  {v['share']:5.1%}")
    record(args, report, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
