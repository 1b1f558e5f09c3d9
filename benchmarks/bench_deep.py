#!/usr/bin/env python
"""Memory and time of activation checkpointing on deep models, up to a 1000-block model.

Each measurement runs in a fresh process (its peak resident memory is the measurement): a few
full training steps (forward, backward, AdamW) of a `pre` model on random bytes. First, at depths
small enough to train both ways, plain backprop against activation checkpointing: peak memory and
step time, and the memory each extra block costs (a least-squares line over depths). Then the
1000-block model with checkpointing, measured, and without, extrapolated from the line, against
this machine's memory.

    python benchmarks/bench_deep.py              # width 128, context 256, batch 16
    python benchmarks/bench_deep.py --quick      # tiny, seconds; records nothing
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from normlab.train.machine import cpu_model  # noqa: E402


def child(blocks: int, checkpointing: bool, args) -> dict:
    """One measurement, in this (fresh) process."""
    from normlab.config import make_model_config
    from normlab.nn import build_model

    cfg = make_model_config(n_blocks=blocks, d_model=args.width, n_heads=max(1, args.width // 64),
                            max_seq_len=args.seq_len)
    model = build_model(cfg, seed=0)
    model.activation_checkpointing = checkpointing
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.batch, args.seq_len), generator=gen)
    base_rss = _peak_rss_bytes()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = model(x, x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return {"blocks": blocks, "checkpointing": checkpointing, "params": model.num_params(),
            "loss": loss.item(), "peak_rss_gib": _peak_rss_bytes() / 2**30,
            "rss_before_steps_gib": base_rss / 2**30,
            "step_s": statistics.median(times[1:] if len(times) > 1 else times)}


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(blocks: int, checkpointing: bool, args) -> dict:
    cmd = [sys.executable, __file__, "--child", str(blocks), str(int(checkpointing)),
           "--width", str(args.width), "--seq-len", str(args.seq_len),
           "--batch", str(args.batch), "--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{blocks} blocks, checkpointing={checkpointing}: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  {blocks:5d} blocks, checkpointing {'on ' if checkpointing else 'off'}: "
          f"peak {result['peak_rss_gib']:.2f} GiB, {result['step_s']:.2f} s/step")
    return result


def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def machine_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def markdown(r: dict) -> str:
    lines = [f"# Activation checkpointing on deep models ({r['date']})", "",
             f"{r['machine']}, {r['memory_gib']:.0f} GiB; torch {r['torch']}; {r['shape']}.", "",
             "| blocks | checkpointing | peak memory | step time |", "|---:|---|---:|---:|"]
    for m in r["measured"]:
        lines.append(f"| {m['blocks']} | {'on' if m['checkpointing'] else 'off'} | "
                     f"{m['peak_rss_gib']:.2f} GiB | {m['step_s']:.2f} s |")
    s = r["summary"]
    lines += ["", f"Memory per block: {s['mib_per_block_off']:.1f} MiB without checkpointing, "
              f"{s['mib_per_block_on']:.2f} MiB with it. Time with checkpointing over without, at "
              f"equal depth: {s['time_ratio_min']:.2f}x-{s['time_ratio_max']:.2f}x.", "",
              f"{s['deep_blocks']} blocks: with checkpointing {s['deep_peak_gib_on']:.2f} GiB "
              f"measured ({s['deep_step_s_on']:.1f} s/step); without, "
              f"{s['deep_peak_gib_off_extrapolated']:.1f} GiB extrapolated, against "
              f"{r['memory_gib']:.0f} GiB on this machine.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--depths", type=int, nargs="+", default=[25, 50, 100],
                    help="depths measured both ways")
    ap.add_argument("--deep", type=int, default=1000, help="the deep model, checkpointed")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=2, type=int, metavar=("BLOCKS", "CHECKPOINTING"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_deep.json")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], bool(args.child[1]), args)))
        return 0
    if args.quick:
        args.width, args.seq_len, args.batch, args.steps = 32, 32, 2, 2
        args.depths, args.deep = [4, 8], 50
    measured = [measure(b, on, args) for b in args.depths for on in (False, True)]
    measured.append(measure(args.deep, True, args))
    off = [m for m in measured if not m["checkpointing"]]
    on = [m for m in measured if m["checkpointing"] and m["blocks"] in args.depths]
    slope_off, icpt_off = line([m["blocks"] for m in off], [m["peak_rss_gib"] for m in off])
    slope_on, _ = line([m["blocks"] for m in on], [m["peak_rss_gib"] for m in on])
    ratios = [b["step_s"] / a["step_s"] for a, b in zip(off, on, strict=True)]
    deep = measured[-1]
    summary = {"mib_per_block_off": slope_off * 1024, "mib_per_block_on": slope_on * 1024,
               "time_ratio_min": min(ratios), "time_ratio_max": max(ratios),
               "deep_blocks": args.deep, "deep_peak_gib_on": deep["peak_rss_gib"],
               "deep_step_s_on": deep["step_s"], "deep_loss_finite": deep["loss"] == deep["loss"],
               "deep_peak_gib_off_extrapolated": icpt_off + slope_off * args.deep}
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": str(torch.__version__),
              "machine": cpu_model(), "memory_gib": machine_memory_gib(),
              "shape": f"pre, width {args.width}, context {args.seq_len}, batch {args.batch}, "
                       f"fp32, {args.steps} steps each",
              "measured": measured, "summary": summary}
    print(markdown(report))
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        args.out.with_suffix(".md").write_text(markdown(report))
        print(f"recorded in {args.out} (+ .md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
