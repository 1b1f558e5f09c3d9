#!/usr/bin/env python
"""Cost of the full init probe (stream and gradient statistics) against one plain training pass.

Target (issue 4): for a 1000-block model at width 64, `normlab.probe.stream_and_grad_stats` on
one batch costs at most 1.5x the time and 1.5x the peak memory of one plain forward and backward
pass of the same model on the same batch,

    plain   loss = model(idx, targets).loss; loss.backward()
    probe   stream_and_grad_stats(model, [(idx, targets)])    # every stream and gradient number

Time: one process builds the model once, warms both up, then alternates plain and probe for
`--rounds` rounds (the order flips every round) and compares medians; the per-round ratios give
the spread. Memory: every measurement runs in a fresh subprocess that builds the model, reads its
resident set size (RSS), resets the kernel's peak-RSS mark (`/proc/self/clear_refs`), runs the
pass once and reads the peak (`VmHWM`): the pass's peak memory is peak minus RSS before.
`tracemalloc` does not see torch's CPU allocations; RSS does. glibc is told to return large
blocks to the kernel (`MALLOC_MMAP_THRESHOLD_`), so a freed activation does not hide in the heap.

Usage:
    python benchmarks/bench_probe.py            # 1000 blocks; writes benchmarks/results/
    python benchmarks/bench_probe.py --quick    # 50 blocks, seconds (bench_probe.quick.*)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from normlab.train.machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
FULL = dict(n_blocks=1000, d_model=64, n_heads=2, seq_len=64, batch=4, placement="pre")
QUICK = dict(n_blocks=50, d_model=64, n_heads=2, seq_len=64, batch=4, placement="pre")
TARGET = 1.5
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


# --- the two workloads --------------------------------------------------------------------------

def setup(shapes: dict, threads: int):
    import torch

    from normlab.config import make_model_config
    from normlab.nn import build_model
    from normlab.probe import text_batches

    torch.set_num_threads(threads)
    cfg = make_model_config(placement=shapes["placement"], n_blocks=shapes["n_blocks"],
                            d_model=shapes["d_model"], n_heads=shapes["n_heads"],
                            max_seq_len=shapes["seq_len"])
    model = build_model(cfg, seed=0).eval()
    batch = text_batches(n_batches=1, batch_size=shapes["batch"], seq_len=shapes["seq_len"])[0]
    return model, batch


def plain(model, batch) -> None:
    model.zero_grad(set_to_none=True)
    model(*batch).loss.backward()
    model.zero_grad(set_to_none=True)


def probe(model, batch) -> None:
    from normlab.probe import stream_and_grad_stats

    stream_and_grad_stats(model, [batch])


WORKLOADS = {"plain": plain, "probe": probe}


# --- memory: one fresh process per measurement ---------------------------------------------------

def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child_memory(which: str, shapes: dict, threads: int) -> dict:
    import gc

    model, batch = setup(shapes, threads)
    gc.collect()
    before = _rss_kb()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak-RSS mark (Linux >= 4.0)
        f.write("5")
    reset_ok = _hwm_kb() <= before + 1024
    t0 = time.perf_counter()
    WORKLOADS[which](model, batch)
    seconds = time.perf_counter() - t0
    peak = _hwm_kb()
    return {"workload": which, "rss_before_mb": before / 1024, "peak_mb": peak / 1024,
            "delta_mb": (peak - before) / 1024, "seconds": seconds, "peak_reset": reset_ok}


def measure_memory(shapes: dict, threads: int, repeats: int) -> dict:
    env = {**os.environ, **MALLOC_ENV}
    rows = []
    for r in range(repeats):
        for which in (("plain", "probe") if r % 2 == 0 else ("probe", "plain")):
            cmd = [sys.executable, __file__, "--child", which, "--shapes", json.dumps(shapes),
                   "--threads", str(threads)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  memory {which}: {rows[-1]['delta_mb']:.1f} MB above "
                  f"{rows[-1]['rss_before_mb']:.1f} MB", flush=True)
    med = {w: {k: statistics.median(x[k] for x in rows if x["workload"] == w)
               for k in ("delta_mb", "peak_mb", "rss_before_mb")} for w in WORKLOADS}
    return {"runs": rows, "median": med,
            "ratio_delta": med["probe"]["delta_mb"] / med["plain"]["delta_mb"],
            "ratio_total_peak": med["probe"]["peak_mb"] / med["plain"]["peak_mb"]}


# --- time: one process, interleaved rounds -------------------------------------------------------

def measure_time(shapes: dict, threads: int, rounds: int) -> dict:
    model, batch = setup(shapes, threads)
    for fn in (plain, probe):  # warm up: lazy initialization, allocator, caches
        fn(model, batch)
    times: dict[str, list[float]] = {"plain": [], "probe": []}
    for r in range(rounds):
        for which in (("plain", "probe") if r % 2 == 0 else ("probe", "plain")):
            t0 = time.perf_counter()
            WORKLOADS[which](model, batch)
            times[which].append(time.perf_counter() - t0)
        print(f"  round {r}: plain {times['plain'][-1]:.3f} s, probe {times['probe'][-1]:.3f} s",
              flush=True)
    med = {w: statistics.median(v) for w, v in times.items()}
    per_round = [q / p for p, q in zip(times["plain"], times["probe"], strict=True)]
    return {"seconds": times, "median_s": med, "ratio": med["probe"] / med["plain"],
            "per_round_ratio": [min(per_round), max(per_round)],
            "params": sum(p.numel() for p in model.parameters())}


def write_markdown(result: dict, path: Path) -> None:
    s, t, m = result["shapes"], result["time"], result["memory"]
    lines = [
        f"# bench_probe results ({result['date']})", "",
        f"{result['machine']}, {result['threads']} torch thread(s), torch {result['torch']}. "
        f"Model: {s['placement']}, {s['n_blocks']} blocks, d={s['d_model']}, {s['n_heads']} "
        f"heads, {t['params']:,} parameters; batch {s['batch']} x {s['seq_len']} tokens, fp32, "
        f"CPU. Load average at start {result['load_start']}, at end {result['load_end']}.", "",
        "plain = `model(idx, targets).loss.backward()`; probe = "
        "`normlab.probe.stream_and_grad_stats(model, [batch])` (every stream and gradient "
        "statistic, one batch).", "",
        "| measure | plain | probe | ratio | spread | target | met |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| time, median s ({result['rounds']} rounds) | {t['median_s']['plain']:.3f} | "
        f"{t['median_s']['probe']:.3f} | {t['ratio']:.3f} | per round "
        f"{t['per_round_ratio'][0]:.3f}..{t['per_round_ratio'][1]:.3f} | <= {TARGET} | "
        f"{'yes' if result['pass_time'] else 'NO'} |",
        f"| peak memory above the built model, MB (median of {result['mem_repeats']} fresh "
        f"processes) | {m['median']['plain']['delta_mb']:.1f} | "
        f"{m['median']['probe']['delta_mb']:.1f} | {m['ratio_delta']:.3f} | "
        f"{min(r['delta_mb'] for r in m['runs']):.1f}..{max(r['delta_mb'] for r in m['runs']):.1f}"
        f" MB over all runs | <= {TARGET} | {'yes' if result['pass_memory'] else 'NO'} |",
        f"| peak process RSS, MB | {m['median']['plain']['peak_mb']:.1f} | "
        f"{m['median']['probe']['peak_mb']:.1f} | {m['ratio_total_peak']:.3f} | | - | - |",
        "", f"Overall: **{'PASS' if result['pass'] else 'FAIL'}**.", "",
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="50 blocks instead of 1000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mem-repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=list(WORKLOADS), help=argparse.SUPPRESS)
    ap.add_argument("--shapes", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(child_memory(args.child, json.loads(args.shapes), args.threads)))
        return

    import torch

    shapes = QUICK if args.quick else FULL
    out = args.out or RESULTS / ("bench_probe.quick.json" if args.quick else "bench_probe.json")
    load_start = [round(x, 2) for x in os.getloadavg()]
    print(f"shapes {shapes}, threads {args.threads}, load {load_start}", flush=True)
    print("time:", flush=True)
    t = measure_time(shapes, args.threads, args.rounds)
    print("memory:", flush=True)
    m = measure_memory(shapes, args.threads, args.mem_repeats)
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} "
                   f"{platform.release()}",
        "python": platform.python_version(), "torch": torch.__version__,
        "threads": args.threads, "shapes": shapes, "rounds": args.rounds,
        "mem_repeats": args.mem_repeats, "malloc_env": MALLOC_ENV,
        "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()],
        "target_ratio": TARGET, "time": t, "memory": m,
        "pass_time": t["ratio"] <= TARGET, "pass_memory": m["ratio_delta"] <= TARGET,
    }
    result["pass"] = result["pass_time"] and result["pass_memory"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    write_markdown(result, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
