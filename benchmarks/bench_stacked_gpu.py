"""Stacked groups on a GPU: whole lr grids trained as one model, against the same runs one after
another (issue 44's targets).

Two measurements, both in bf16 as `precision: auto` trains on a GPU:

1. **The engine** (`train_group` and `train_run`, the trainers themselves): for each depth and
   width, one run alone, then groups of G runs (an lr x seed grid) for each G of `--groups`, each
   for `--steps` steps. Step times come from the trainers' own metrics.jsonl (they exclude
   checkpoints and evaluation), the first `--skip` steps left out (allocation, lazy init). Runs
   one after another each train at the lone run's rate, so the sequential baseline's tokens/s is
   the lone run's. Reported per group: its step time, tokens/s of all its runs, their ratio to
   the lone run's, the share of the measured bf16 GEMM peak (`normlab.train.perf`), and the
   device's peak memory. A group that does not fit says so and is not a data point.
2. **Where a group's step goes** (`--profile-shape`, 64 runs of 6 blocks at width 64): torch's
   profiler over `--profile-steps` steps of the engine's own loop, after `--skip`, each step's
   phases labelled (the batch, the forward and backward, the optimizer's update, the records
   after it; what is left is the loop's per-member bookkeeping), and the operators that took the
   most time.
3. **The stacked step alone**, at one shape (`--graph-shape`): a forward, backward and
   `StackedAdamW` step timed eager, under `torch.compile` (default mode) and under
   `torch.compile(mode="reduce-overhead")` (CUDA graphs), with the CUDA kernels launched per step
   counted by torch's profiler: the numbers that choose how the engine should cut launches.

    python benchmarks/bench_stacked_gpu.py                 # on a GPU: results/bench_stacked_gpu.*
    python benchmarks/bench_stacked_gpu.py --quick         # tiny, on the CPU, records nothing
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from bench_batched import decoder_run
from recording import new_report, record

from normlab.nn import build_model
from normlab.nn.stacked import StackedTransformer
from normlab.train import group as group_engine
from normlab.train import train_run
from normlab.train.group import train_group
from normlab.train.logging import read_metrics
from normlab.train.optim import adamw_hyper, decayed_names
from normlab.train.perf import gemm_peak_tflops, steady_step_seconds, train_flops_per_token
from normlab.train.precision import precision_context
from normlab.train.stacked_adamw import StackedAdamW

GRID_LRS = 8  # a group is an lr x seed grid, as the study's: 8 lrs, the seeds filling the rest


def configs(blocks: int, width: int, members: int, args) -> list:
    """`members` runs of one shape as an lr x seed grid (run i: lr i mod 8, log-spaced 1e-4 to
    3e-3, seed i div 8): the members that share an lr share the optimizer's call, as a study's
    grid does (a group of all-distinct lrs would cost the optimizer one call per member)."""
    lrs = [1e-4 * (30 ** (i / (GRID_LRS - 1))) for i in range(GRID_LRS)]
    return [decoder_run(blocks, width, args.seq_len, args.batch, args.device,
                        f"train.lr={lrs[i % GRID_LRS]:.4g}", f"train.seed={i // GRID_LRS}",
                        f"train.precision={args.precision}") for i in range(members)]


def median_step(root: Path, cfg, skip: int) -> float:
    times = [r["time_s"] for r in read_metrics(root / cfg.run_id() / "metrics.jsonl")
             if "time_s" in r and r["step"] > skip]
    if not times:
        raise RuntimeError(f"{cfg.run_id()}: no timed steps after step {skip}")
    return statistics.median(times)


def why(summary: dict) -> str:
    """What stopped a run that neither finished nor was interrupted, from its summary."""
    said = ": ".join(str(summary[k]) for k in ("reason", "message") if summary.get(k))
    return f"{summary['outcome']}" + (f" ({said[:300]})" if said else "")


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def engine_rows(blocks: int, width: int, args, tmp: Path, peak_tflops: float) -> list[dict]:
    cfgs = configs(blocks, width, max(args.groups), args)
    tokens = args.batch * args.seq_len
    flops = train_flops_per_token(cfgs[0].model, args.seq_len)
    base = {"blocks": blocks, "width": width}
    reset_peak(args.device)
    t0 = time.perf_counter()
    lone = train_run(cfgs[0], tmp / f"lone{blocks}x{width}", progress=False,
                     interrupt_at=args.steps)
    if lone["outcome"] not in ("interrupted", "completed"):
        return [{**base, "group": 1, "engine": "run", "error": why(lone)}]
    lone_step = median_step(tmp / f"lone{blocks}x{width}", cfgs[0], args.skip)
    lone_tps = tokens / lone_step
    rows = [{**base, "group": 1, "engine": "run", "step_ms": lone_step * 1e3,
             "tokens_per_s": lone_tps, "ratio": 1.0,
             "mfu": lone_tps * flops / (peak_tflops * 1e12), "peak_gib": peak_gib(args.device),
             "wall_s": time.perf_counter() - t0}]
    print(f"{blocks:>3} blocks, width {width:>4}: one run {lone_step * 1e3:7.2f} ms a step, "
          f"{lone_tps:>11,.0f} tokens/s", flush=True)
    for g in args.groups:
        if blocks > 6 and g > args.max_deep_group:
            continue
        reset_peak(args.device)
        root = tmp / f"group{blocks}x{width}x{g}"
        t0 = time.perf_counter()
        try:
            out = train_group(cfgs[:g], root, interrupt_at=args.steps)
        except torch.OutOfMemoryError as e:
            rows.append({**base, "group": g, "engine": "stacked", "error": f"out of memory: {e}"})
            print(f"    group of {g:>3}: out of memory", flush=True)
            continue
        failed = [s for s in out.values() if s["outcome"] not in ("interrupted", "completed")]
        if failed:
            rows.append({**base, "group": g, "engine": "stacked", "error": why(failed[0])})
            print(f"    group of {g:>3}: failed: {rows[-1]['error']}", flush=True)
            continue
        step = median_step(root, cfgs[0], args.skip)
        tps = g * tokens / step
        rows.append({**base, "group": g, "engine": "stacked", "step_ms": step * 1e3,
                     "tokens_per_s": tps, "ratio": tps / lone_tps,
                     "mfu": tps * flops / (peak_tflops * 1e12), "peak_gib": peak_gib(args.device),
                     "wall_s": time.perf_counter() - t0})
        print(f"    group of {g:>3}: {step * 1e3:7.2f} ms a step, {tps:>11,.0f} tokens/s, "
              f"{tps / lone_tps:6.1f}x one after another, MFU {rows[-1]['mfu']:.2%}, "
              + (f"peak {rows[-1]['peak_gib']:.1f} GiB" if args.device == "cuda" else ""),
              flush=True)
    return rows


# the phases of a group's step (`normlab.train.group._GroupLoop`), labelled for the profiler
PHASES = {"train_step": "step (all of it)", "batch": "batch", "gradients": "forward and backward",
          "update": "optimizer update", "after_step": "records after the step"}


def profiled_group(args, tmp: Path) -> dict:
    """Torch's profiler over steps `--skip`+1 .. `--skip`+`--profile-steps` of a group of the
    profile shape trained by the engine itself: each phase's time a step and the operators'
    table."""
    from torch.profiler import ProfilerActivity, profile, record_function

    blocks, width, members = args.profile_shape
    cfgs = configs(blocks, width, members, args)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    prof = profile(activities=acts)
    first, last = args.skip + 1, args.skip + args.profile_steps
    seen = {"steps": 0}
    loop = group_engine._GroupLoop

    def labelled(name: str):
        original = getattr(loop, name)

        def wrapper(self, *a, **k):
            if name == "train_step":
                seen["steps"] += 1
                if seen["steps"] == first:
                    prof.start()
            with record_function(PHASES[name]):
                out = original(self, *a, **k)
            if name == "train_step" and seen["steps"] == last:
                if args.device == "cuda":
                    torch.cuda.synchronize()
                prof.stop()
            return out
        return wrapper

    with contextlib.ExitStack() as patches:
        for name in PHASES:
            patches.enter_context(mock.patch.object(loop, name, labelled(name)))
        train_group(cfgs, tmp / "profiled", interrupt_at=last + 1)
    events = {e.key: e for e in prof.key_averages()}
    phases = {label: events[label].cpu_time_total / 1e3 / args.profile_steps
              for label in PHASES.values() if label in events}
    device_sort = next((k for k in ("self_device_time_total", "self_cuda_time_total")
                        if args.device == "cuda"), None)
    table = prof.key_averages().table(sort_by=device_sort or "self_cpu_time_total",
                                      row_limit=args.profile_rows, max_name_column_width=60)
    print(f"  profile of {members} x {blocks} blocks x width {width}, ms a step: "
          + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
    return {"blocks": blocks, "width": width, "members": members,
            "steps": args.profile_steps, "phases_ms": phases, "table": table}


def stacked_step(cfg, members: int, device: torch.device, mode: str):
    """One training step of a stack of `members` runs of `cfg` as `_GroupLoop` takes it (forward
    and loss under bf16 autocast, backward, one host copy of losses and norms, clipping,
    `StackedAdamW`), with the forward compiled in `mode` ("eager": not compiled)."""
    models = [build_model(cfg.model, seed=i) for i in range(members)]
    stack = StackedTransformer(models).to(device)
    optim = StackedAdamW(stack, decayed_names(models[0]))
    net = stack if mode == "eager" else torch.compile(
        stack, mode=None if mode == "default" else mode)
    gen = torch.Generator().manual_seed(0)
    shape = (members, cfg.train.batch_size, cfg.data.seq_len)
    x = torch.randint(0, cfg.model.vocab_size, shape, generator=gen).to(device)
    y = torch.randint(0, cfg.model.vocab_size, shape, generator=gen).to(device)
    hp = [adamw_hyper(cfg.train, cfg.train.lr)] * members
    autocast = precision_context(cfg.train.precision if cfg.train.precision != "auto"
                                 else "bf16", device)

    def step() -> None:
        with autocast:
            losses = net(x, y).loss
        losses.sum().backward()
        grads = optim.gather_grads()
        norms = torch.stack([losses.detach().float(),
                             torch.linalg.vector_norm(grads, dim=1)]).tolist()[1]
        optim.clip_(grads, norms, [1.0] * members)
        optim.step(grads, hp)
        optim.zero_grad()

    return step


def launches(step, device: str) -> int | None:
    """The kernels one call of `step` launches (CUDA runtime and driver launch calls, graph
    launches counted as one)."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages()
               if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch",
                                    "cudaLaunchCooperativeKernel", "cuLaunchKernelEx",
                                    "cudaLaunchKernelExC")))


def graph_rows(args) -> list[dict]:
    blocks, width, members = args.graph_shape
    cfg = configs(blocks, width, 1, args)[0]
    device = torch.device(args.device)
    tokens = members * args.batch * args.seq_len
    rows = []
    for mode in args.modes:
        t0 = time.perf_counter()
        try:
            step = stacked_step(cfg, members, device, mode)
            for _ in range(3):  # compiling (and recording graphs) happens here, timed apart
                step()
            if args.device == "cuda":
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            seconds = steady_step_seconds(step, warmup=2, repeats=args.repeats, device=device)
            n = launches(step, args.device)
        except Exception as e:  # a mode that fails is a result: say how
            rows.append({"mode": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"  stacked step {mode:>15}: failed: {rows[-1]['error']}", flush=True)
            continue
        finally:
            torch._dynamo.reset()
        rows.append({"mode": mode, "blocks": blocks, "width": width, "members": members,
                     "step_ms": seconds * 1e3, "tokens_per_s": tokens / seconds,
                     "launches": n, "first_steps_s": first_s})
        print(f"  stacked step {mode:>15}: {seconds * 1e3:7.2f} ms ({members} x {blocks} blocks "
              f"x width {width}), {n} launches, first 3 steps {first_s:.0f} s", flush=True)
    return rows


def markdown(report: dict) -> str:
    s = report["shape"]
    lines = [f"# bench_stacked_gpu results ({report['date']})", "",
             f"{report.get('gpu', report['cpu'])}, torch {report['torch']}; CPU {report['cpu']}. "
             f"Pre-LN decoders, heads = width/64, context {s['seq_len']}, batch {s['batch']}, "
             f"{s['precision']}; {s['steps']} steps per contender, the first {s['skip']} not "
             f"counted. Measured {s['precision']} GEMM peak: {report['peak_tflops']:.1f} "
             "TFLOP/s.", "",
             "## The engine: groups against the same runs one after another", "",
             "| blocks | width | runs | step (ms) | tokens/s | x one after another | "
             "share of bf16 peak | peak memory (GiB) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['blocks']} | {r['width']} | {r['group']} | {r['error']} |"
                         " | | | |")
            continue
        mem = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        lines.append(f"| {r['blocks']} | {r['width']} | {r['group']}"
                     f"{' (alone)' if r['engine'] == 'run' else ''} | {r['step_ms']:.2f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['ratio']:.1f} | {r['mfu']:.2%} | {mem} |")
    if report.get("profile"):
        p = report["profile"]
        lines += ["", f"## Where a group's step goes: {p['members']} runs of {p['blocks']} blocks "
                  f"at width {p['width']}, {p['steps']} steps profiled", "",
                  "| phase | ms a step (host wall, torch profiler) |", "|---|---:|",
                  *(f"| {k} | {v:.2f} |" for k, v in p["phases_ms"].items()), "", "```",
                  p["table"].rstrip(), "```"]
    if report["graph"]:
        lines += ["", "## The stacked step alone: eager, compiled, CUDA graphs", "",
                  "| mode | step (ms) | tokens/s | kernel launches | first 3 steps (s) |",
                  "|---|---:|---:|---:|---:|"]
        for r in report["graph"]:
            if "error" in r:
                lines.append(f"| {r['mode']} | {r['error']} | | | |")
            else:
                lines.append(f"| {r['mode']} | {r['step_ms']:.2f} | {r['tokens_per_s']:,.0f} | "
                             f"{r['launches']} | {r['first_steps_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--blocks", type=int, nargs="+", default=[6, 24])
    ap.add_argument("--groups", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--max-deep-group", type=int, default=64,
                    help="the largest group measured above 6 blocks (64)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10, help="first steps not counted (10)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--graph-shape", type=int, nargs=3, default=[6, 64, 64],
                    metavar=("BLOCKS", "WIDTH", "RUNS"))
    ap.add_argument("--modes", nargs="*", default=["eager", "default", "reduce-overhead"],
                    help="the stacked step's modes (none: skip that measurement)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--profile-shape", type=int, nargs=3, default=[6, 64, 64],
                    metavar=("BLOCKS", "WIDTH", "RUNS"))
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="steps profiled (0: no profile)")
    ap.add_argument("--profile-rows", type=int, default=30)
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="tiny, on the CPU, records nothing")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_stacked_gpu.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.device, args.widths, args.blocks, args.groups = "cpu", [32], [2], [2, 3]
        args.seq_len, args.batch, args.steps, args.skip, args.repeats = 16, 2, 6, 2, 2
        args.graph_shape, args.modes, args.precision = [2, 32, 2], ["eager"], "fp32"
        args.profile_shape, args.profile_steps, args.profile_rows = [2, 32, 3], 2, 8
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_stacked_gpu.py: no CUDA GPU on this machine, so nothing was measured "
              "(--quick runs its logic on the CPU)")
        return 0
    if args.skip >= args.steps:
        ap.error("--skip must be below --steps")
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = gemm_peak_tflops(dtype, args.device)
    report = new_report(args, shape={k: getattr(args, k) for k in (
        "seq_len", "batch", "steps", "skip", "precision")}, peak_tflops=peak,
        results=[], graph=[])
    # recorded after each measurement, so a run stopped at its time limit keeps what it measured;
    # the profile and the stacked step's modes come after the first depth, before the slower
    # deep groups
    with tempfile.TemporaryDirectory() as tmp:
        for k, blocks in enumerate(args.blocks):
            for width in args.widths:
                report["results"] += engine_rows(blocks, width, args, Path(tmp), peak)
                record(args, report, markdown, quiet=True)
            if k == 0 and args.profile_steps:
                report["profile"] = profiled_group(args, Path(tmp))
                record(args, report, markdown, quiet=True)
            if k == 0 and args.modes:
                report["graph"] = graph_rows(args)
                record(args, report, markdown, quiet=True)
    record(args, report, markdown)
    if args.quick:
        print(markdown(report))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
