#!/usr/bin/env python
"""A study's measurements at init: one ladder computed in this process against the same ladder's
models spread over the study's kept worker processes (`normlab.sweep.executors.map_local`).

The ladder is C8's (`fairseq_ladder` at the profile's width and heads; post, pre, admin and
admin_o1; the profile's depths and seeds; init statistics and Admin's output change): the
largest of the quick profile. Each contender computes it from scratch in a fresh study folder
(nothing cached), in interleaved rounds whose order flips every round; the kept pool is started
before the first round, as a study starts it for its first runs. "here" uses this process's
torch threads (all cores unless `--threads`), as a study did before its ladders went to the
workers; "workers" uses the profile's workers at one thread each. Both must give the same
numbers up to the last digits of float sums (checked). Records results in benchmarks/results/.

    python benchmarks/bench_ladders.py                 # quick's ladder, 3 rounds
    python benchmarks/bench_ladders.py --quick         # the tiny profile's, seconds, no record
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from recording import new_report, record

import normlab.study.ladder_runs as ladder_runs
from normlab.study.experiments import StudyFolder
from normlab.study.ladders import fairseq_ladder
from normlab.study.profiles import PROFILES
from normlab.sweep.executors import keep_local_workers, map_local
from normlab.train.machine import default_threads

PLACEMENTS = ["post", "pre", "admin", "admin_o1"]


def ladder(profile: Any, root: Path) -> tuple[float, dict]:
    folder = StudyFolder(root, profile, log=lambda _m: None)
    rungs = fairseq_ladder(profile.width, profile.heads)
    t = time.perf_counter()
    data = folder.init_ladder("ladder", rungs, PLACEMENTS, list(profile.init_depths),
                              perturb=True, stats=True)
    return time.perf_counter() - t, data


def leaves(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [x for k in value for x in leaves(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    return [value] if isinstance(value, float) and math.isfinite(value) else []


def _warm(_x: int) -> int:
    return 0


def in_process(_ctx: Any, fn: Any, cells: list) -> list:
    return [fn(cell) for cell in cells]


def markdown(r: dict) -> str:
    return "\n".join([
        f"# bench_ladders results ({r['date']})", "",
        f"{r['cpu']}, torch {r['torch']}; profile {r['profile']}: C8's ladder, "
        f"{r['models']} models at init (stats and Admin's output change); here: "
        f"{r['threads']} torch thread(s) in one process; workers: {r['workers']} processes of "
        f"{r['worker_threads']} thread(s); {len(r['rounds'])} interleaved rounds.", "",
        "| contender | median s | rounds (s) |", "|---|---:|---|",
        f"| here | {r['here_s']:.1f} | {', '.join(f'{x:.1f}' for x in r['here_rounds'])} |",
        f"| workers | {r['workers_s']:.1f} | "
        f"{', '.join(f'{x:.1f}' for x in r['workers_rounds'])} |", "",
        f"Speed-up (ratio of medians): **{r['speedup']:.2f}x**; largest relative difference "
        f"between the two contenders' numbers: {r['max_rel_diff']:.1e}.", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="quick", choices=list(PROFILES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="this process's torch threads")
    ap.add_argument("--quick", action="store_true", help="the tiny profile, records nothing")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_ladders.json"))
    args = ap.parse_args(argv)
    args.device = "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    profile = PROFILES["tiny" if args.quick else args.profile]
    workers = profile.workers
    here, there, worst = [], [], 0.0
    with keep_local_workers(), tempfile.TemporaryDirectory() as tmp:
        map_local(_warm, range(workers), workers=workers, threads=default_threads(workers))
        for i in range(1 if args.quick else args.rounds):
            order = ["here", "workers"] if i % 2 == 0 else ["workers", "here"]
            got = {}
            for who in order:
                root = Path(tmp) / f"{who}{i}"
                if who == "here":  # every cell in this process, as before map_local
                    on_workers, ladder_runs._on_workers = ladder_runs._on_workers, in_process
                    try:
                        got[who] = ladder(profile, root)
                    finally:
                        ladder_runs._on_workers = on_workers
                else:
                    got[who] = ladder(profile, root)
            here.append(got["here"][0])
            there.append(got["workers"][0])
            for a, b in zip(leaves(got["here"][1]), leaves(got["workers"][1]), strict=True):
                worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-12))
            print(f"round {i + 1}: here {here[-1]:.1f} s, workers {there[-1]:.1f} s", flush=True)
    models = len(fairseq_ladder(profile.width, profile.heads)) * len(PLACEMENTS) \
        * len(profile.init_depths) * profile.init_seeds
    report = new_report(args, profile=profile.name, models=models, workers=workers,
                        worker_threads=default_threads(workers), rounds=list(range(len(here))),
                        here_rounds=here, workers_rounds=there,
                        here_s=statistics.median(here), workers_s=statistics.median(there),
                        speedup=statistics.median(here) / statistics.median(there),
                        max_rel_diff=worst)
    print(markdown(report))
    if worst > 1e-3:
        print(f"the contenders' numbers differ by {worst:.1e} (relative): not float noise")
        return 1
    record(args, report, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
