#!/usr/bin/env python
"""`make gpu-check`: normlab's checks on a CUDA GPU in one command, with a log and a summary.

Stages, in order, each in a process of its own and each run whatever the one before it gave:

  tests       pytest tests/gpu -n 8: training and resume bit for bit at context 256 in fp32 and
              bf16, a stacked group against its separate runs, `precision: auto`, the probes, a
              small sweep and `normlab study --profile tiny`, on the GPU
  placements  benchmarks/gpu_check.py --placements pre post: GPT-2 small, compiled, bf16;
              tokens/s and MFU
  peers       benchmarks/gpu_peers.py: the same shape compiled side by side with the
              nanoGPT-style reference decoder of bench_peers.py

Each stage has a time limit, and all of them together a budget (`--budget`, 450 s): a stage
still running at its limit is stopped and counts as failed; a stage left no time is not run
and counts as failed. The exit status is 0 when every stage passed, 1 otherwise.

Written to `--out-dir` (default benchmarks/results/): gpu_check_all.log (every stage's output,
as it was printed), gpu_check_all.json and .md (each stage's outcome, time and command, the
tests' counts, the benchmarks' main numbers; the device, torch and CUDA versions, date and
commit), and the benchmarks' own gpu_check.{json,md} and gpu_peers.{json,md}.

On a machine without a CUDA GPU it says so, runs and writes nothing, and exits 0. `--smoke` runs
every stage's CPU form instead (tests/gpu skipped, the benchmarks' --smoke): this script's own
logic, in about a minute.

    python benchmarks/gpu_check_all.py                  # on a GPU machine (make gpu-check)
    python benchmarks/gpu_check_all.py --stages peers   # one stage again
    python benchmarks/gpu_check_all.py --smoke --out-dir /tmp/gpu-smoke
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from gpu_meta import NO_GPU, meta_line, run_meta  # noqa: E402

DEFAULT_OUT = BENCHMARKS / "results"
STAGES = ("tests", "placements", "peers")
BUDGET_S = 450.0  # all stages together: 7.5 minutes
MIN_STAGE_S = 10.0  # a stage left less than this is not started
TAIL_LINES = 30


@dataclass
class Stage:
    name: str
    what: str
    argv: list[str]
    timeout_s: float
    results: list[str] = field(default_factory=list)  # files it writes, below the out dir
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    name: str
    what: str
    command: str
    status: str  # passed | failed | timed out | not run
    returncode: int | None
    seconds: float
    timeout_s: float
    tail: list[str]
    results: list[str]
    summary: str = ""


def stages(args: argparse.Namespace, out_dir: Path) -> list[Stage]:
    """The stages `args` asks for, as commands for `args.python`."""
    py = args.python
    if args.smoke:
        tests = [py, "-m", "pytest", "tests/gpu", "-q", "-rs", "-p", "no:cacheprovider"]
        placements = [py, "benchmarks/gpu_check.py", "--smoke", "--placements", "pre", "post"]
        peers = [py, "benchmarks/gpu_peers.py", "--smoke"]
    else:
        tests = [py, "-m", "pytest", "tests/gpu", "-n", str(args.workers), "-q", "-rs",
                 "-p", "no:cacheprovider", "--durations=10"]
        placements = [py, "benchmarks/gpu_check.py", "--placements", "pre", "post",
                      "--steps", str(args.steps), "--warmup", "3",
                      "--out", str(out_dir / "gpu_check.json")]
        peers = [py, "benchmarks/gpu_peers.py", "--out", str(out_dir / "gpu_peers.json")]
    every = [
        # deterministic cuBLAS for the bit-exact tests, set before any process starts CUDA
        Stage("tests", "pytest tests/gpu: train, resume, groups, precision, probes, sweep, "
              "study on the GPU", tests, 240.0, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
        Stage("placements", "gpu_check.py: pre and post at GPT-2 small, compiled, bf16",
              placements, 240.0, [] if args.smoke else ["gpu_check.json", "gpu_check.md"]),
        Stage("peers", "gpu_peers.py: pre and post against the nanoGPT-style reference, "
              "compiled, bf16", peers, 240.0, [] if args.smoke else ["gpu_peers.json",
                                                                    "gpu_peers.md"])]
    return [s for s in every if s.name in args.stages]


# what a pytest run that started this script (tests/test_gpu_check.py) leaves in the environment:
# a stage's own pytest would take itself for one of that run's workers
PARENT_PYTEST = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                 "PYTEST_CURRENT_TEST", "NORMLAB_TEST_GROUPS")


def stage_env(stage: Stage, commit_id: str) -> dict[str, str]:
    """The environment of a stage: this one, with the checkout first on PYTHONPATH (normlab is
    run from it, not installed; what was there stays, after it) and the commit named for results
    written without git."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k not in PARENT_PYTEST}
    return {**env, "PYTHONPATH": path, "NORMLAB_COMMIT": commit_id,
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **stage.env}


def _pump(stream: TextIO, sinks: list[TextIO], tail: collections.deque) -> None:
    for line in stream:
        for sink in sinks:
            sink.write(line)
            sink.flush()
        tail.append(line.rstrip("\n"))


def run_stage(stage: Stage, log: TextIO, env: dict[str, str], limit_s: float) -> Outcome:
    """Run one stage to its end or to `limit_s` seconds (then its whole process group is
    stopped), its output going to this process's stdout and to `log` as it comes."""
    command = " ".join(stage.argv)
    header = f"\n=== {stage.name}: {stage.what}\n$ {command}\n"
    for sink in (sys.stdout, log):
        sink.write(header)
        sink.flush()
    t0 = time.perf_counter()
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(stage.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    reader = threading.Thread(target=_pump, args=(proc.stdout, [sys.stdout, log], tail),
                              daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop_group(proc)
    reader.join(timeout=10)
    seconds = time.perf_counter() - t0
    status = ("timed out" if timed_out else "passed" if proc.returncode == 0 else "failed")
    note = (f"=== {stage.name}: {status} in {seconds:.0f} s"
            + (f" (its limit: {limit_s:.0f} s)" if timed_out else
               f" (exit status {proc.returncode})") + "\n")
    for sink in (sys.stdout, log):
        sink.write(note)
        sink.flush()
    return Outcome(stage.name, stage.what, command, status,
                   None if timed_out else proc.returncode, seconds, limit_s, list(tail),
                   stage.results, summary=tests_line(tail) if stage.name == "tests" else "")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's process group (pytest's workers too), SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


_COUNTS = re.compile(r"\d+ (passed|failed|skipped|errors?|xfailed|xpassed)")


def tests_line(tail) -> str:
    """pytest's closing line ("12 passed, 3 skipped in 80.1s"), or ""."""
    for line in reversed(list(tail)):
        if _COUNTS.search(line):
            return line.strip("= ").strip()
    return ""


def highlights(out_dir: Path, passed: set[str]) -> list[str]:
    """The main numbers of the benchmarks that passed in this run, from what they wrote."""
    lines = []
    placements = out_dir / "gpu_check.json"
    if "placements" in passed and placements.is_file():
        r = json.loads(placements.read_text())
        for row in r["rows"]:
            lines.append(f"placements: {row['placement']} {row['tokens_per_s']:,.0f} tokens/s, "
                         f"MFU {row['mfu_measured']:.1%} of the measured bf16 peak"
                         + (f", {row['mfu_nominal']:.1%} of the data sheet's"
                            if row.get("mfu_nominal") is not None else "")
                         + f", compiled in {row['first_step_s']:.0f} s")
    peers = out_dir / "gpu_peers.json"
    if "peers" in passed and peers.is_file():
        r = json.loads(peers.read_text())
        for name, row in r["contenders"].items():
            lines.append(f"peers: {name} {row['tokens_per_s']:,.0f} tokens/s, "
                         f"{row['vs_reference']:.3f}x the reference (paired "
                         f"{row['vs_reference_paired']:.3f}), MFU {row['mfu_measured']:.1%}")
        same = r["normlab_pre_is_reference"]
        lines.append("peers: normlab-pre " + ("computes" if same["agrees"] else
                                              "does NOT compute")
                     + " the reference's function with its weights"
                     + (f" (loss difference {same['loss_abs_diff']:.1e})"
                        if "loss_abs_diff" in same else ""))
    return lines


def markdown(report: dict) -> str:
    lines = [f"# make gpu-check ({report['date']})", "", meta_line(report) + ".", "",
             f"**{'All stages passed' if report['passed'] else 'FAILED'}** in "
             f"{report['total_s']:.0f} s (budget {report['budget_s']:.0f} s). Log: "
             "`gpu_check_all.log`.", "",
             "| stage | outcome | time | limit | what | results |",
             "|---|---|---:|---:|---|---|"]
    for s in report["stages"]:
        outcome = s["status"] + (f" ({s['summary']})" if s["summary"] else "")
        lines.append(f"| {s['name']} | {outcome} | {s['seconds']:.0f} s | "
                     f"{s['timeout_s']:.0f} s | {s['what']} | "
                     f"{', '.join(f'`{f}`' for f in s['results']) or '-'} |")
    if report["highlights"]:
        lines += ["", *(f"- {line}" for line in report["highlights"])]
    failed = [s for s in report["stages"] if s["status"] != "passed"]
    for s in failed:
        lines += ["", f"## {s['name']}: {s['status']}", "", f"`{s['command']}`", "", "```",
                  *s["tail"], "```"]
    return "\n".join(lines) + "\n"


def gpu_present() -> tuple[bool, str]:
    """Whether this Python sees a CUDA GPU, and if not, why (in words)."""
    try:
        import torch
    except ImportError as e:
        return False, f"torch is not importable by {sys.executable} ({e})"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees none (torch.cuda.is_available() is false)"
    return True, torch.cuda.get_device_name(0)


def nvidia_smi_gpus() -> list[str]:
    """The GPUs `nvidia-smi -L` lists (none where there is no nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                   help=f"the stages to run, in this order ({' '.join(STAGES)})")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT,
                   help="where the log, the summary and the results go (benchmarks/results)")
    p.add_argument("--budget", type=float, default=BUDGET_S,
                   help=f"seconds for all stages together ({BUDGET_S:.0f})")
    p.add_argument("--workers", type=int, default=8, help="pytest -n for tests/gpu (8)")
    p.add_argument("--steps", type=int, default=20, help="gpu_check.py's timed steps (20)")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter of the stages (this one)")
    p.add_argument("--smoke", action="store_true",
                   help="every stage's CPU form, without a GPU: checks this script")
    args = p.parse_args(argv)
    if args.workers < 1 or args.steps < 1 or args.budget <= 0:
        p.error("--workers and --steps must be at least 1, --budget positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = None
    if not args.smoke:
        present, why = gpu_present()
        if not present:
            listed = nvidia_smi_gpus()
            if listed:  # a GPU this Python cannot use: the check itself is broken
                print(f"gpu_check_all.py: nvidia-smi lists {len(listed)} GPU(s) ({listed[0]}) "
                      f"but {why}; run it with a Python whose torch sees the GPU (make "
                      "gpu-check GPU_PY=...)", file=sys.stderr)
                return 1
            print(f"gpu_check_all.py: {NO_GPU}: {why}. Nothing was run or written; run "
                  "`make gpu-check` on a machine with one (benchmarks/README.md).")
            return 0
        device = "cuda"

    meta = run_meta(device)
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = stages(args, out_dir)
    print(f"gpu_check_all.py: {meta_line(meta)}; stages {', '.join(s.name for s in todo)} "
          f"within {args.budget:.0f} s; log {out_dir / 'gpu_check_all.log'}", flush=True)
    t0 = time.perf_counter()
    outcomes = []
    with (out_dir / "gpu_check_all.log").open("w") as log:
        log.write(meta_line(meta) + "\n")
        for stage in todo:
            left = args.budget - (time.perf_counter() - t0)
            if left < MIN_STAGE_S:
                note = f"=== {stage.name}: not run: {left:.0f} s left of the budget\n"
                sys.stdout.write(note)
                log.write(note)
                outcomes.append(Outcome(stage.name, stage.what, " ".join(stage.argv),
                                        "not run", None, 0.0, 0.0, [], stage.results))
                continue
            outcomes.append(run_stage(stage, log, stage_env(stage, meta["commit"]),
                                      min(stage.timeout_s, left)))
    passed = all(o.status == "passed" for o in outcomes)
    report = {**meta, "passed": passed, "total_s": time.perf_counter() - t0,
              "budget_s": args.budget, "smoke": args.smoke,
              "stages": [o.__dict__ for o in outcomes],
              "highlights": [] if args.smoke else highlights(
                  out_dir, {o.name for o in outcomes if o.status == "passed"})}
    (out_dir / "gpu_check_all.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "gpu_check_all.md").write_text(markdown(report))
    print()
    for o in outcomes:
        print(f"{o.name:<11} {o.status:<9} {o.seconds:>5.0f} s  {o.summary}")
    for line in report["highlights"]:
        print(line)
    print(f"{'all stages passed' if passed else 'FAILED'} in {report['total_s']:.0f} s; "
          f"summary {out_dir / 'gpu_check_all.md'}, log {out_dir / 'gpu_check_all.log'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
