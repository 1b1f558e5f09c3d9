"""The cost of per-block logging (stream norm and gradient norm of every block, on by default at
every `log_every`-th step) against the same training step without it, in one process.

One model of each shape trains with the trainer's own pieces (`param_groups`, fused AdamW, the
`capture` of each block's output and `block_stats`, as `train_run` does on a statistics step).
After `--warmup` untimed steps, each round times one step without statistics and one with them,
in alternating order, so a machine whose load drifts (this one is shared) hits both alike.

    step cost      the fastest statistics step / the fastest plain step - 1 (best of the
                   rounds: on a shared machine other load only adds time)
    norms cost     the `block_stats` call alone (the norms and their one host sync), timed
                   inside the statistics step, best of the rounds, as a share of a plain step
    writing cost   what the statistics add to writing one metrics line (JSON and TensorBoard
                   scalars), timed on a real line with and without them
    overhead       (the larger of step and norms cost + writing cost) / K, as a share of a step:
                   statistics are taken every K = `--every` steps (the default cadence)

A second measurement, **a group's records** (`--members`, 64): what a stacked group's host
spends on the records of its members, against the way they were written before, in the same
run: one logged step (a record of 5 scalars per member through `MetricsLog`, which now flushes
metrics.jsonl at most once a second and before each checkpoint, and sends a record's scalars to
TensorBoard as one event) against a flush and one TensorBoard event per scalar per record; and a
group's start (each member's config.yaml, written with libyaml's emitter by `write_yaml`)
against PyYAML's pure-Python emitter, which writes the same text.

Records results in benchmarks/results/ (bench_logging.json and .md).

    python benchmarks/bench_logging.py                # default shape and a deep narrow one
    python benchmarks/bench_logging.py --quick        # a tiny shape, seconds, records nothing
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from recording import new_report, record

from normlab.config import ModelConfig, load_run_config
from normlab.nn import build_model, capture
from normlab.train.logging import MetricsLog
from normlab.train.optim import param_groups
from normlab.train.trainer import block_stats
from normlab.userinput import write_yaml

# name: (blocks, width, heads, batch, seq_len); "default" is ModelConfig's and TrainConfig's
SHAPES = {"default": (6, 256, 4, 16, 128), "deep": (24, 64, 2, 8, 64), "tiny": (2, 32, 2, 4, 32)}


def write_seconds(record: dict, tmp: Path, repeats: int = 50) -> float:
    """Seconds to write `record` once through `MetricsLog` (metrics.jsonl and TensorBoard)."""
    tmp.mkdir(parents=True)
    log = MetricsLog(tmp / "metrics.jsonl", tb_dir=tmp / "tb")
    log.write(record)  # opens the files: not counted
    t0 = time.perf_counter()
    for k in range(repeats):
        log.write(record | {"step": k + 1})
    seconds = (time.perf_counter() - t0) / repeats
    log.close()
    return seconds


class PerRecordLog(MetricsLog):
    """`MetricsLog.write` as it was: a flush per record, one TensorBoard event per scalar."""

    def write(self, record: dict) -> None:
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        tb = self._writer()
        for key, value in record.items():
            if key != "step":
                tb.add_scalar(key.replace(".", "/"), value, record["step"])


def group_records(members: int, steps: int, tmp: Path) -> dict:
    """Seconds a group of `members` spends writing one logged step's records (best of two
    passes of `steps` steps, old and new interleaved) and writing the members' config.yaml."""
    def logged_step_seconds(kind: type[MetricsLog], name: str) -> float:
        logs = [kind(tmp / name / f"m{i}" / "metrics.jsonl", tb_dir=tmp / name / f"m{i}" / "tb")
                for i in range(members)]
        for log in logs:
            log.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            for i, log in enumerate(logs):
                log.write({"step": step, "train_loss": 2.0 + i / members, "lr": 1e-3,
                           "grad_norm": 0.5, "time_s": 0.06, "tokens_per_s": 17000.0})
        seconds = (time.perf_counter() - t0) / steps
        for log in logs:
            log.close()
        return seconds

    before, now = [], []
    for k in range(2):
        before.append(logged_step_seconds(PerRecordLog, f"before{k}"))
        now.append(logged_step_seconds(MetricsLog, f"now{k}"))
    data = load_run_config(None, ["train.lr=1e-3"]).to_dict()

    def yaml_seconds(dump) -> float:
        t0 = time.perf_counter()
        for _ in range(members):
            dump(data)
        return time.perf_counter() - t0

    pure = yaml_seconds(lambda d: yaml.safe_dump(d, sort_keys=False))
    fast = yaml_seconds(write_yaml)
    return {"members": members, "steps": steps, "logged_step_s_before": min(before),
            "logged_step_s": min(now), "logged_step_ratio": min(before) / min(now),
            "configs_s_pure_python": pure, "configs_s": fast, "configs_ratio": pure / fast}


def measure(shape: str, args, tmp: Path) -> dict:
    blocks, width, heads, batch, seq = SHAPES[shape]
    device = torch.device(args.device)
    cfg = ModelConfig(n_blocks=blocks, d_model=width, n_heads=heads, max_seq_len=seq)
    model = build_model(cfg, seed=0).to(device)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    y = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(stats: bool) -> tuple[float, float, dict]:
        sync()
        t0 = time.perf_counter()
        tap = capture(model, "blocks.*.mlp.stream_out") if stats else contextlib.nullcontext()
        with tap as cap:
            loss = model(x, y).loss
        loss.backward()
        record = {"step": 1, "train_loss": loss.item(), "lr": 1e-4, "grad_norm":
                  torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()}
        t1 = time.perf_counter()
        if stats:
            record.update(block_stats(model, cap))
        norms_s = time.perf_counter() - t1
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t0, norms_s, record

    for k in range(args.warmup):
        step(k % 2 == 0)
    plain, with_stats, norms = [], [], []
    for k in range(args.rounds):
        for stats in (False, True) if k % 2 == 0 else (True, False):
            seconds, norms_s, record = step(stats)
            if stats:
                with_stats.append(seconds)
                norms.append(norms_s)
                stat_record = record
            else:
                plain.append(seconds)
                plain_record = record
    # Best of the rounds: on a shared machine other load only ever adds time, so the fastest
    # step of each kind is the closest to what the step itself costs.
    step_s = min(plain)
    write_extra = (write_seconds(stat_record, tmp / f"{shape}-on")
                   - write_seconds(plain_record, tmp / f"{shape}-off"))
    step_cost = min(with_stats) / step_s - 1
    norms_cost = min(norms) / step_s
    writing_cost = max(0.0, write_extra) / step_s
    per_stats_step = max(step_cost, norms_cost) + writing_cost
    return {"shape": shape, "blocks": blocks, "width": width, "heads": heads, "batch": batch,
            "seq_len": seq, "every": args.every, "step_s": step_s,
            "median_step_s": statistics.median(plain), "stats_step_s": min(with_stats),
            "step_cost": step_cost, "norms_s": min(norms), "norms_cost": norms_cost,
            "write_extra_s": write_extra, "writing_cost": writing_cost,
            "cost_per_stats_step": per_stats_step, "overhead": per_stats_step / args.every,
            "stat_values_per_line": sum(k.startswith("blocks.") for k in stat_record)}


def markdown(report: dict) -> str:
    lines = [
        "# Per-block logging overhead (`benchmarks/bench_logging.py`)", "",
        f"{report['date']}, {report['cpu']}, {report['threads']} torch thread(s), torch "
        f"{report['torch']}, device {report['device']}. One training step with per-block "
        f"stream and gradient norms against one without, interleaved in {report['rounds']} "
        f"rounds after {report['warmup']} warm-up steps, best of the rounds; statistics every "
        f"K = {report['every']} steps.", "",
        "| shape | values per line | step, best (median) | statistics step | norms alone | "
        "writing | cost of one statistics step | overhead at every K-th step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(
            f"| {r['blocks']} blocks, width {r['width']}, batch {r['batch']} x {r['seq_len']} | "
            f"{r['stat_values_per_line']} | {r['step_s'] * 1e3:.1f} ms "
            f"({r['median_step_s'] * 1e3:.1f} ms) | {r['step_cost']:+.2%} | "
            f"{r['norms_cost']:.2%} | {r['writing_cost']:.2%} | "
            f"{r['cost_per_stats_step']:.2%} | **{r['overhead']:.2%}** (ratio "
            f"{1 + r['overhead']:.4f}) |")
    g = report.get("group_records")
    if g:
        lines += [
            "", f"**A group's records** ({g['members']} members, best of two passes of "
            f"{g['steps']} logged steps; a record of 5 scalars per member):", "",
            "| what | before | now | ratio |", "|---|---:|---:|---:|",
            f"| one logged step's records (flush and TensorBoard event per scalar, before) | "
            f"{g['logged_step_s_before'] * 1e3:.1f} ms | {g['logged_step_s'] * 1e3:.1f} ms | "
            f"**{g['logged_step_ratio']:.1f}x** |",
            f"| the members' config.yaml text (pure-Python emitter, before) | "
            f"{g['configs_s_pure_python'] * 1e3:.0f} ms | {g['configs_s'] * 1e3:.0f} ms | "
            f"**{g['configs_ratio']:.1f}x** |"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["default", "deep"], choices=list(SHAPES))
    ap.add_argument("--every", type=int, default=10, help="statistics cadence [log_every's "
                    "default, 10]")
    ap.add_argument("--warmup", type=int, default=4, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of two timed steps")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads [torch's default]")
    ap.add_argument("--members", type=int, default=64, help="a group's size for its records")
    ap.add_argument("--group-steps", type=int, default=20, help="logged steps timed per pass")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, seconds, records nothing")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_logging.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.shapes, args.rounds, args.members, args.group_steps = ["tiny"], 6, 4, 3
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        g = group_records(args.members, args.group_steps, Path(tmp) / "group")
        print(f"a group of {g['members']}: one logged step's records "
              f"{g['logged_step_s'] * 1e3:.1f} ms (before {g['logged_step_s_before'] * 1e3:.1f} "
              f"ms, {g['logged_step_ratio']:.1f}x); config.yaml text {g['configs_s'] * 1e3:.0f} "
              f"ms (before {g['configs_s_pure_python'] * 1e3:.0f} ms, {g['configs_ratio']:.1f}x)",
              flush=True)
        for shape in args.shapes:
            r = measure(shape, args, Path(tmp))
            results.append(r)
            print(f"{shape}: step {r['step_s'] * 1e3:.1f} ms (best of {args.rounds}); a "
                  f"statistics step {r['step_cost']:+.2%}, norms alone {r['norms_cost']:.2%}, "
                  f"writing {r['writing_cost']:.2%}; every {args.every} steps: overhead "
                  f"{r['overhead']:.2%} of a step (ratio {1 + r['overhead']:.4f})", flush=True)
    report = new_report(args, every=args.every, warmup=args.warmup, rounds=args.rounds,
                        results=results, group_records=g)
    record(args, report, markdown)

if __name__ == "__main__":
    main()
