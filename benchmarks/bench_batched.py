"""Sweep throughput: M runs trained as one stacked model vs the same runs one after another.

Both contenders go through the real trainers (`train_group` and `train_run`) in one process, on
the same M configs (one model shape, M learning rates), in interleaved rounds: each round advances
the stacked group and then every separate run by `--steps` steps (each chunk resumes from the
checkpoint the previous one wrote), and the contender that starts alternates, so machine load
hits both alike. Step times come from the trainers' own metrics (they exclude checkpointing and
evaluation); the first step of each chunk is not counted (fresh process state after a resume).
Records results in benchmarks/results/.

    python benchmarks/bench_batched.py [--widths 64 128 256] [--members 8] [--device cpu|cuda]
    python benchmarks/bench_batched.py --quick      # tiny shapes, seconds, records nothing
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from recording import new_report, record

from normlab.config import load_run_config
from normlab.train import train_run
from normlab.train.group import train_group
from normlab.train.logging import read_metrics

MAX_STEPS = 1_000_000  # never reached: chunks stop by interrupt_at, so no final evaluation


def decoder_run(blocks: int, width: int, seq_len: int, batch: int, device: str, *sets: str):
    """A pre-LN decoder run of this shape (heads = width/64) that logs every step and never ends
    by itself (runs stop by `interrupt_at`, so no final evaluation), with `sets` on top."""
    return load_run_config(None, [
        "model.placement=pre", f"model.n_blocks={blocks}", f"model.d_model={width}",
        f"model.n_heads={max(1, width // 64)}", f"model.max_seq_len={seq_len}",
        f"data.seq_len={seq_len}", f"train.batch_size={batch}",
        f"train.steps={MAX_STEPS}", "train.eval_every=0", "train.eval_batches=1",
        "train.log_every=1", "train.warmup=10", f"train.device={device}", *sets])


def configs(width: int, args) -> list:
    lrs = [1e-4 * (30 ** (i / max(1, args.members - 1))) for i in range(args.members)]
    return [decoder_run(args.blocks, width, args.seq_len, args.batch, args.device,
                        f"train.lr={lr:.3g}") for lr in lrs]


def step_times(root: Path, cfgs, first_steps: set[int]) -> list[list[float]]:
    """Per run: the time of each counted step (first step of each chunk left out)."""
    return [[r["time_s"] for r in read_metrics(root / c.run_id() / "metrics.jsonl")
             if "time_s" in r and r["step"] not in first_steps] for c in cfgs]


def measure(width: int, args, tmp: Path) -> dict:
    cfgs = configs(width, args)
    tokens = args.batch * args.seq_len
    stacked_root, separate_root = tmp / f"stacked{width}", tmp / f"separate{width}"
    chunk = args.steps + 1
    rounds = []
    for k in range(args.rounds):
        stop = (k + 1) * chunk

        def stacked(stop=stop):
            train_group(cfgs, stacked_root, interrupt_at=stop)

        def separate(stop=stop):
            for c in cfgs:
                train_run(c, separate_root, progress=False, interrupt_at=stop)

        order = [stacked, separate] if k % 2 == 0 else [separate, stacked]
        for run in order:
            run()
        firsts = {k * chunk + 1}
        st = step_times(stacked_root, cfgs, firsts)[0][-args.steps:]  # every member: same times
        se = [t[-args.steps:] for t in step_times(separate_root, cfgs, firsts)]
        stacked_tps = len(cfgs) * tokens / statistics.median(st)
        separate_tps = tokens / statistics.mean(statistics.median(t) for t in se)
        rounds.append({"stacked_tokens_per_s": stacked_tps, "separate_tokens_per_s": separate_tps,
                       "ratio": stacked_tps / separate_tps})
    all_st = [t for t in step_times(stacked_root, cfgs, set(range(1, MAX_STEPS, chunk)))[0]]
    all_se = step_times(separate_root, cfgs, set(range(1, MAX_STEPS, chunk)))
    stacked_tps = len(cfgs) * tokens / statistics.median(all_st)
    separate_tps = tokens / statistics.mean(statistics.median(t) for t in all_se)
    return {"width": width, "n_heads": max(1, width // 64), "members": len(cfgs),
            "lrs": [c.train.lr for c in cfgs],
            "stacked_tokens_per_s": stacked_tps, "separate_tokens_per_s": separate_tps,
            "ratio": stacked_tps / separate_tps,
            "paired_median_ratio": statistics.median(r["ratio"] for r in rounds),
            "round_ratios": [r["ratio"] for r in rounds],
            "stacked_step_s": all_st, "separate_step_s": all_se}


def markdown(report: dict) -> str:
    s = report["shape"]
    lines = [f"# bench_batched results ({report['date']})", "",
             f"{report['cpu']}, {report['threads']} torch threads, torch {report['torch']}, "
             f"device {report['device']}. {s['members']} runs of a pre-LN decoder: "
             f"{s['blocks']} blocks, heads = width/64, context {s['seq_len']}, batch "
             f"{s['batch']}, fp32, lrs 1e-4..3e-3; {s['rounds']} rounds x {s['steps']} timed "
             "steps per contender.", "",
             "| width | stacked tokens/s (all runs) | separate tokens/s | ratio | "
             "median per-round ratio | per-round range |", "|---:|---:|---:|---:|---:|---|"]
    for r in report["results"]:
        lines.append(f"| {r['width']} | {r['stacked_tokens_per_s']:,.0f} | "
                     f"{r['separate_tokens_per_s']:,.0f} | {r['ratio']:.2f} | "
                     f"{r['paired_median_ratio']:.2f} | {min(r['round_ratios']):.2f}.."
                     f"{max(r['round_ratios']):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per contender per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads [torch's default]")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, seconds, records nothing")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_batched.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.widths, args.members, args.blocks, args.seq_len, args.batch = [32], 3, 2, 32, 4
        args.steps, args.rounds = 2, 2
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for width in args.widths:
            r = measure(width, args, Path(tmp))
            results.append(r)
            print(f"width {width:>4}: stacked {r['stacked_tokens_per_s']:>9,.0f} tok/s, separate "
                  f"{r['separate_tokens_per_s']:>9,.0f} tok/s, ratio {r['ratio']:.2f} "
                  f"(per round {', '.join(f'{x:.2f}' for x in r['round_ratios'])})", flush=True)
    report = new_report(args, shape={k: getattr(args, k) for k in (
        "members", "blocks", "seq_len", "batch", "steps", "rounds")}, results=results)
    record(args, report, markdown)

if __name__ == "__main__":
    main()
