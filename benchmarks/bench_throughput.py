#!/usr/bin/env python
"""Training throughput of fp32 against bf16 (and, with --compile, torch.compile) on this machine,
with model FLOPs utilization against the GEMM peak measured in the same run, and the bf16 loss
curve against fp32's.

Every number comes from the real trainer (`train_run`) on the shipped corpus: the same seed, data,
optimizer and schedule, only `train.precision` / `train.compile` differ. fp32 and bf16 train in
alternating chunks of steps (each chunk resumes its run from the checkpoint), so a change in
machine load hits both alike; tokens/s is the median over the trainer's per-step times (which
exclude checkpointing), skipping the first step of each chunk. Compiled runs train in one piece
from a cold start (caches off); their compile time is the first step's time minus the median step.

    python benchmarks/bench_throughput.py                     # widths 128 256 512, CPU
    python benchmarks/bench_throughput.py --compile           # also bf16 + torch.compile
    python benchmarks/bench_throughput.py --device cuda --gpt2-small
    python benchmarks/bench_throughput.py --quick             # seconds, a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from normlab.config import RunConfig, load_run_config  # noqa: E402
from normlab.train import train_run  # noqa: E402
from normlab.train.logging import read_metrics  # noqa: E402
from normlab.train.machine import cpu_model  # noqa: E402
from normlab.train.perf import gemm_peak_tflops, train_flops_per_token  # noqa: E402

PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def config(width: int, precision: str, steps: int, args, compile_: bool = False) -> RunConfig:
    return load_run_config(None, [
        f"model.placement={args.placement}", f"model.n_blocks={args.blocks}",
        f"model.d_model={width}", f"model.n_heads={max(1, width // 64)}",
        f"model.max_seq_len={args.seq_len}", f"data.seq_len={args.seq_len}",
        f"train.batch_size={args.batch}", f"train.steps={steps}", "train.eval_every=0",
        "train.eval_batches=2", f"train.precision={precision}", f"train.compile={compile_}",
        "train.lr=1e-3", "train.warmup=20", "train.log_every=1", f"train.device={args.device}"])


def rows_of(root: Path, summary: dict) -> list[dict]:
    return read_metrics(root / summary["run_id"] / "metrics.jsonl")


def interleaved(width: int, steps: int, args, tmp: Path) -> dict[str, dict]:
    """fp32 and bf16 at one width, alternating chunks of `args.chunk` steps."""
    summaries, chunk_starts = {}, set()
    for stop in range(args.chunk, steps + args.chunk, args.chunk):
        chunk_starts.add(stop - args.chunk + 1)
        for precision in ("fp32", "bf16"):
            summaries[precision] = train_run(
                config(width, precision, steps, args), tmp / f"{width}-{precision}",
                progress=False, interrupt_at=min(stop, steps))
    out = {}
    for precision, s in summaries.items():
        if s["outcome"] != "completed":
            raise RuntimeError(f"width {width} {precision}: {s['outcome']} {s.get('reason')}")
        rows = rows_of(tmp / f"{width}-{precision}", s)
        steady = [r["time_s"] for r in rows if r["step"] not in chunk_starts]
        out[precision] = {"step_s": statistics.median(steady),
                          "loss_curve": [round(r["train_loss"], 4) for r in rows]}
    return out


def compiled(width: int, steps: int, precision: str, args, tmp: Path) -> dict:
    """One compiled run from a cold start: no graphs from earlier widths, no on-disk caches."""
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()
    torch._inductor.config.force_disable_caches = True
    root = tmp / f"{width}-{precision}-compiled"
    s = train_run(config(width, precision, steps, args, compile_=True), root, progress=False)
    if s["outcome"] != "completed":
        raise RuntimeError(f"width {width} {precision} compiled: {s['outcome']} {s.get('reason')}"
                           f" {s.get('message', '')}")
    rows = rows_of(root, s)
    step_s = statistics.median(r["time_s"] for r in rows[1:])
    return {"step_s": step_s, "compile_s": rows[0]["time_s"] - step_s,
            "loss_curve": [round(r["train_loss"], 4) for r in rows]}


def attention_paths(heads: int, args, rounds: int = 7) -> dict:
    """Forward+backward ms of bf16 causal attention at the benchmark's shape: the fused SDPA
    kernel against the explicit two-GEMM path that `explicit_attention_pays` picks on CPU."""
    from normlab.nn.layers import Attention

    cfg = config(64 * heads, "bf16", 1, args).model
    attn = Attention(cfg)
    shape = (args.batch, heads, args.seq_len, 64)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device=args.device, requires_grad=True)
               for _ in range(3))
    paths = {
        "fused_sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True),
        "explicit": lambda: attn._explicit(q, k, v, None, 0.0)[0],
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(rounds + 1):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn().float().sum().backward()
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def smoothed(curve: list[float], window: int = 10) -> list[float]:
    return [statistics.fmean(curve[max(0, i - window + 1):i + 1]) for i in range(len(curve))]


def tracking(fp32: list[float], bf16: list[float]) -> dict:
    """How closely bf16's loss curve follows fp32's: the largest gap of the 10-step moving
    averages, and the gap of the final moving average."""
    a, b = smoothed(fp32), smoothed(bf16)
    gaps = [y - x for x, y in zip(a, b, strict=True)]
    return {"max_abs_gap_smoothed": max(abs(g) for g in gaps), "final_gap_smoothed": gaps[-1],
            "final_loss_fp32": a[-1], "final_loss_bf16": b[-1]}


def figure(curves: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, gap) = plt.subplots(2, 1, figsize=(6, 5), dpi=110, sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    for name, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), smoothed(curve), label=name, lw=1.4)
    ax.set_ylabel("train loss (10-step mean)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    a, b = (smoothed(c) for c in curves.values())
    gap.plot(range(1, len(a) + 1), [y - x for x, y in zip(a, b, strict=True)], color="k", lw=1)
    gap.axhline(0, color="grey", lw=0.6)
    gap.set_ylabel("difference")
    gap.set_xlabel("step")
    gap.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(report: dict) -> str:
    peak = report["gemm_peak_tflops"]
    lines = [
        f"# Training throughput, fp32 vs bf16 ({report['date']})", "",
        f"{report['machine']}; torch {report['torch']}, {report['threads']} threads; "
        f"{report['shape']}.", "",
        f"GEMM peak measured in this run: fp32 {peak['fp32']:.3f} TFLOP/s, "
        f"bf16 {peak['bf16']:.3f} TFLOP/s ({peak['bf16'] / peak['fp32']:.1f}x).", "",
        "| width | params | fp32 tok/s | bf16 tok/s | bf16/fp32 | MFU fp32 | MFU bf16 "
        "| bf16 attention fused / explicit |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in report["widths"]:
        att = w.get("attention_ms_bf16")
        att_cell = f"{att['fused_sdpa']:.0f} / {att['explicit']:.0f} ms" if att else "-"
        lines.append(
            f"| {w['width']} | {w['params']:,} | {w['fp32']['tokens_per_s']:,.0f} | "
            f"{w['bf16']['tokens_per_s']:,.0f} | **{w['bf16_over_fp32']:.2f}x** | "
            f"{w['fp32']['mfu']:.1%} | {w['bf16']['mfu']:.1%} | {att_cell} |")
    comp = [w for w in report["widths"] if "bf16_compiled" in w]
    if comp:
        lines += ["", "| width | bf16+compile tok/s | over fp32 | over bf16 | compile time | MFU |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for w in comp:
            c = w["bf16_compiled"]
            lines.append(f"| {w['width']} | {c['tokens_per_s']:,.0f} | "
                         f"{c['tokens_per_s'] / w['fp32']['tokens_per_s']:.2f}x | "
                         f"{c['tokens_per_s'] / w['bf16']['tokens_per_s']:.2f}x | "
                         f"{c['compile_s']:.0f} s | {c['mfu']:.1%} |")
    t = report["tracking"]
    lines += ["", f"Loss curve at width {t['width']} over {t['steps']} steps (10-step moving "
              f"averages): largest bf16 - fp32 gap {t['max_abs_gap_smoothed']:.4f}, final gap "
              f"{t['final_gap_smoothed']:+.4f} ({t['final_loss_fp32']:.4f} fp32, "
              f"{t['final_loss_bf16']:.4f} bf16). Figure: `{t['figure']}`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--steps", type=int, default=30, help="steps per width (throughput)")
    ap.add_argument("--track-width", type=int, default=256)
    ap.add_argument("--track-steps", type=int, default=300,
                    help="steps at --track-width, whose loss curves are compared")
    ap.add_argument("--chunk", type=int, default=10, help="steps per interleaved chunk")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--placement", default="pre")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--compile", action="store_true", help="also bf16 + torch.compile")
    ap.add_argument("--gpt2-small", action="store_true",
                    help="GPT-2-small shape: 12 blocks, width 768, context 1024, batch 8")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, seconds; records nothing")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_throughput.json")
    args = ap.parse_args(argv)
    if args.gpt2_small:
        args.widths, args.blocks, args.seq_len, args.batch = [768], 12, 1024, 8
        args.track_width = 768
    if args.quick:
        args.widths, args.blocks, args.seq_len, args.batch = [64], 2, 64, 4
        args.steps = args.track_steps = 8
        args.chunk, args.track_width = 4, 64
    if args.track_width not in args.widths:
        ap.error(f"--track-width {args.track_width} is not among --widths {args.widths}")

    device = torch.device(args.device)
    peak = {name: gemm_peak_tflops(dt, device) for name, dt in PEAK_DTYPES.items()}
    print(f"GEMM peak: fp32 {peak['fp32']:.3f}, bf16 {peak['bf16']:.3f} TFLOP/s")
    tokens_per_step = args.batch * args.seq_len
    widths, track = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for width in args.widths:
            steps = args.track_steps if width == args.track_width else args.steps
            t0 = time.perf_counter()
            runs = interleaved(width, steps, args, Path(tmp))
            if args.compile:
                runs["bf16_compiled"] = compiled(width, args.steps, "bf16", args, Path(tmp))
            cfg = config(width, "fp32", steps, args).model
            flops = train_flops_per_token(cfg, args.seq_len)
            entry = {"width": width, "n_heads": cfg.n_heads, "steps": steps,
                     "params": sum(p.numel() for p in _model_params(cfg))}
            for name, r in runs.items():
                tps = tokens_per_step / r["step_s"]
                dtype = "fp32" if name == "fp32" else "bf16"
                entry[name] = {"tokens_per_s": tps, "step_s": r["step_s"],
                               "mfu": tps * flops / (peak[dtype] * 1e12),
                               **{k: v for k, v in r.items() if k not in ("step_s", "loss_curve")}}
            entry["bf16_over_fp32"] = entry["bf16"]["tokens_per_s"] / entry["fp32"]["tokens_per_s"]
            if args.device == "cpu":
                entry["attention_ms_bf16"] = attention_paths(cfg.n_heads, args)
            widths.append(entry)
            print(f"width {width}: fp32 {entry['fp32']['tokens_per_s']:,.0f} tok/s, bf16 "
                  f"{entry['bf16']['tokens_per_s']:,.0f} tok/s -> {entry['bf16_over_fp32']:.2f}x"
                  f" (MFU {entry['fp32']['mfu']:.1%} / {entry['bf16']['mfu']:.1%})"
                  + (f"; bf16+compile {entry['bf16_compiled']['tokens_per_s']:,.0f} tok/s, "
                     f"compile {entry['bf16_compiled']['compile_s']:.0f} s"
                     if args.compile else "") + f"  [{time.perf_counter() - t0:.0f} s]")
            if width == args.track_width:
                track = {"width": width, "steps": steps,
                         **tracking(runs["fp32"]["loss_curve"], runs["bf16"]["loss_curve"]),
                         "curves": {k: runs[k]["loss_curve"] for k in ("fp32", "bf16")}}
    shape = (f"{args.placement}, {args.blocks} blocks, head width 64, context {args.seq_len}, "
             f"batch {args.batch}, device {args.device}")
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": str(torch.__version__),
              "threads": torch.get_num_threads(),
              "machine": torch.cuda.get_device_name() if args.device == "cuda" else cpu_model(),
              "shape": shape, "gemm_peak_tflops": peak, "widths": widths, "tracking": track}
    fig_path = args.out.with_suffix(".loss.png")
    track["figure"] = str(fig_path.relative_to(ROOT)) if fig_path.is_relative_to(ROOT) else (
        str(fig_path))
    print(f"loss tracking at width {track['width']}: max smoothed gap "
          f"{track['max_abs_gap_smoothed']:.4f}, final {track['final_gap_smoothed']:+.4f}")
    if args.quick:
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(markdown(report))
    figure(track["curves"], fig_path, f"{shape}\nwidth {track['width']}: bf16 vs fp32")
    print(f"recorded in {args.out} (+ .md, {fig_path.name})")
    return 0


def _model_params(cfg):
    from normlab.nn import build_model

    return build_model(cfg, seed=0).parameters()


if __name__ == "__main__":
    sys.exit(main())
