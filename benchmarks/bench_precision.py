"""Training throughput fp32 vs bf16 autocast on this machine, with the loss after a fixed number of
steps (the real trainer, real corpus, same seed). Records results in benchmarks/results/.

    python benchmarks/bench_precision.py [--steps 60] [--width 256] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from normlab.config import load_run_config
from normlab.machine import cpu_model
from normlab.train import train_run
from normlab.train.logging import read_metrics


def config(precision: str, args):
    return load_run_config(None, [
        f"model.placement={args.placement}", f"model.n_blocks={args.blocks}",
        f"model.d_model={args.width}", f"model.n_heads={max(1, args.width // 64)}",
        f"model.max_seq_len={args.seq_len}", f"data.seq_len={args.seq_len}",
        f"train.batch_size={args.batch}", f"train.steps={args.steps}", "train.eval_every=0",
        "train.eval_batches=4", f"train.precision={precision}", "train.lr=1e-3",
        "train.warmup=10", "train.log_every=1", "train.device=cpu"])


def run_interleaved(args, root: Path) -> list[dict]:
    """Train the fp32 and bf16 runs in alternating chunks of steps (each chunk resumes the run
    from its checkpoint), so a change in machine load affects both alike. Per-step times come
    from the trainer's own metrics, which exclude checkpointing."""
    summaries = {}
    for stop in range(args.chunk, args.steps + args.chunk, args.chunk):
        for precision in ("fp32", "bf16"):
            summaries[precision] = train_run(config(precision, args), root / precision,
                                             progress=False, interrupt_at=min(stop, args.steps))
    return [result(p, summaries[p], root) for p in ("fp32", "bf16")]


def result(precision: str, s: dict, root: Path) -> dict:
    rows = read_metrics(root / precision / s["run_id"] / "metrics.jsonl")
    # the first step of each chunk pays for a fresh process state (allocator, caches): skip it
    steady = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 1]
    return {"precision": precision, "outcome": s["outcome"],
            "tokens_per_s_median": statistics.median(steady),
            "train_loss_last": rows[-1]["train_loss"], "val_loss": s.get("val_loss"),
            "loss_curve": [round(r["train_loss"], 4) for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--placement", default="pre")
    ap.add_argument("--chunk", type=int, default=10, help="steps per interleaved chunk")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, seconds")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_precision.json"))
    args = ap.parse_args()
    if args.quick:
        args.steps, args.width, args.blocks, args.seq_len, args.batch = 8, 64, 2, 64, 4
        args.chunk = 4
    with tempfile.TemporaryDirectory() as tmp:
        results = run_interleaved(args, Path(tmp))
    fp32, bf16 = results
    ratio = bf16["tokens_per_s_median"] / fp32["tokens_per_s_median"]
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "torch": str(torch.__version__),
        "threads": torch.get_num_threads(), "cpu": cpu_model(),
        "shape": {k: getattr(args, k) for k in ("placement", "blocks", "width", "seq_len",
                                                "batch", "steps")},
        "results": results, "bf16_over_fp32_tokens_per_s": ratio,
        "loss_gap_last": bf16["train_loss_last"] - fp32["train_loss_last"],
    }
    print(f"{'precision':<10}{'tokens/s':>12}{'last loss':>12}{'val loss':>12}")
    for r in results:
        print(f"{r['precision']:<10}{r['tokens_per_s_median']:>12,.0f}"
              f"{r['train_loss_last']:>12.4f}{r['val_loss'] or float('nan'):>12.4f}")
    print(f"bf16 / fp32 tokens/s: {ratio:.2f}x; loss gap after {args.steps} steps: "
          f"{report['loss_gap_last']:+.4f}")
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"recorded in {args.out}")


if __name__ == "__main__":
    main()
