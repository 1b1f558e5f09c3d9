#!/usr/bin/env python
"""Training-step throughput of normlab `pre`/`post` against x-transformers, in one run.

One timed step is a full training step: forward + cross-entropy, backward, `AdamW.step()`,
`zero_grad()`. Every contender gets the same shapes, the same batch, the same optimizer class and
flags. After a warmup the contenders are interleaved in rounds (round-robin, the starting
contender rotated every round) so a drift in machine speed hits all of them alike. Reported per
contender: median / min / max step seconds, tokens/s, the median split of a step into forward,
backward and optimizer time, and the parameter count; plus the target ratios

    normlab-pre  / xt-pre       tokens/s   (target >= 1.05)
    normlab-post / normlab-pre  tokens/s   (target >= 0.95)

each with its per-round range as a measure of spread.

Contenders (defaults of each library, as users build them):

    normlab-pre   ModelConfig(placement="pre")              linear + LayerNorm biases
    normlab-post  ModelConfig(placement="post")
    xt-pre        Decoder(dim, depth, heads, attn_flash=True)   no attention / LayerNorm biases
    xt-post       Decoder(..., pre_norm=False)

and, unless `--no-matched`, a parameter-exact pair (both without any bias):

    normlab-pre-nobias   ModelConfig(placement="pre", bias=False, norm_bias=False)
    xt-pre-nobias        Decoder(..., ff_no_bias=True)

Usage:
    python benchmarks/bench_step.py                 # full shapes, writes benchmarks/results/
    python benchmarks/bench_step.py --quick         # tiny shapes, seconds (bench_step.quick.*)
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from normlab.config import PLACEMENTS, ModelConfig  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.train.machine import cpu_model  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bench_step.json"
QUICK_OUT = ROOT / "benchmarks" / "results" / "bench_step.quick.json"

FULL_SHAPES = dict(n_blocks=6, d_model=256, n_heads=4, seq_len=256, batch=16, vocab=256)
QUICK_SHAPES = dict(n_blocks=2, d_model=64, n_heads=2, seq_len=32, batch=4, vocab=256)

TARGETS = {
    "normlab-pre / xt-pre": ("normlab-pre", "xt-pre", 1.05),
    "normlab-post / normlab-pre": ("normlab-post", "normlab-pre", 0.95),
}
EXTRA_RATIOS = {
    "normlab-pre-nobias / xt-pre-nobias": ("normlab-pre-nobias", "xt-pre-nobias"),
    "xt-post / xt-pre": ("xt-post", "xt-pre"),
}


# step time within 10% of pre's: tokens/s at least 1/1.1 of pre's
PLACEMENT_TARGET = round(1 / 1.1, 3)


# --- contenders -------------------------------------------------------------------------------

@dataclass
class Contender:
    name: str
    library: str
    description: str
    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    opt: torch.optim.Optimizer | None = None
    step_s: list[float] = field(default_factory=list)
    phase_s: dict[str, list[float]] = field(
        default_factory=lambda: {"forward": [], "backward": [], "optimizer": []})
    round_median_s: list[float] = field(default_factory=list)
    block_foreign_cores: list[float] = field(default_factory=list)  # accepted blocks
    rejected_blocks: list[float] = field(default_factory=list)  # foreign load of each rejected
    last_loss: float = float("nan")

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def normlab_contender(name: str, placement: str, shapes: dict, **overrides) -> Contender:
    cfg = ModelConfig(
        placement=placement, n_blocks=shapes["n_blocks"], d_model=shapes["d_model"],
        n_heads=shapes["n_heads"], max_seq_len=shapes["seq_len"], vocab_size=shapes["vocab"],
        dropout=0.0, positions="learned", mlp="gelu", tie_embeddings=True, **overrides,
    )
    model = build_model(cfg, seed=0)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model(x, y).loss

    extra = "".join(f", {k}={v}" for k, v in overrides.items())
    desc = f"ModelConfig(placement={placement!r}{extra}), init {model.plan.init}"
    return Contender(name, "normlab", desc, model, loss_fn)


def xt_model(shapes: dict, *, flash: bool, **decoder_kwargs) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    d, h = shapes["d_model"], shapes["n_heads"]
    return TransformerWrapper(
        num_tokens=shapes["vocab"], max_seq_len=shapes["seq_len"], tie_embedding=True,
        emb_dropout=0.0, use_abs_pos_emb=True,
        attn_layers=Decoder(dim=d, depth=shapes["n_blocks"], heads=h, attn_dim_head=d // h,
                            attn_flash=flash, attn_dropout=0.0, ff_dropout=0.0, ff_mult=4,
                            **decoder_kwargs),
    )


def xt_contender(name: str, shapes: dict, *, flash: bool, **decoder_kwargs) -> Contender:
    model = xt_model(shapes, flash=flash, **decoder_kwargs)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    kw = "".join(f", {k}={v}" for k, v in decoder_kwargs.items())
    desc = (f"TransformerWrapper(tie_embedding=True, Decoder(dim, depth, heads, "
            f"attn_flash={flash}{kw}))")
    return Contender(name, "x-transformers", desc, model, loss_fn)


def peer_contenders(shapes: dict, flash: bool, matched: bool) -> list[Contender]:
    """normlab pre/post and x-transformers pre/post, plus the bias-free pair when `matched`."""
    contenders = [
        normlab_contender("normlab-pre", "pre", shapes),
        normlab_contender("normlab-post", "post", shapes),
        xt_contender("xt-pre", shapes, flash=flash),
        xt_contender("xt-post", shapes, flash=flash, pre_norm=False),
    ]
    if matched:
        contenders += [
            normlab_contender("normlab-pre-nobias", "pre", shapes, bias=False, norm_bias=False),
            xt_contender("xt-pre-nobias", shapes, flash=flash, ff_no_bias=True),
        ]
    return contenders


def check_peer_flash(shapes: dict) -> dict:
    """Does `attn_flash=True` run on this device and agree with x-transformers' explicit path?"""
    try:
        flash = xt_model(shapes, flash=True)
        plain = xt_model(shapes, flash=False)
        plain.load_state_dict(flash.state_dict())
        gen = torch.Generator().manual_seed(1)
        x = torch.randint(0, shapes["vocab"], (2, shapes["seq_len"]), generator=gen)
        with torch.no_grad():
            diff = (flash(x) - plain(x)).abs().max().item()
        return {"works": True, "max_abs_diff_vs_explicit": diff, "agrees": diff < 1e-4}
    except Exception as exc:  # noqa: BLE001 - report, then fall back to the default path
        return {"works": False, "error": f"{type(exc).__name__}: {exc}"}


def resolved_impl(opt: torch.optim.Optimizer) -> str:
    """The AdamW code path torch picks for these flags and parameters (fused/foreach/for-loop)."""
    if opt.defaults.get("fused"):
        return "fused"
    foreach = opt.defaults.get("foreach")
    if foreach is None:
        try:
            from torch.optim.optimizer import _default_to_fused_or_foreach

            params = [p for g in opt.param_groups for p in g["params"]]
            _, foreach = _default_to_fused_or_foreach(params, False, use_fused=False)
        except (ImportError, TypeError):
            return "unknown (torch default)"
    return "foreach" if foreach else "for-loop (single tensor)"


def make_optimizer(model: nn.Module, impl: str, lr: float) -> torch.optim.Optimizer:
    flags = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True},
             "forloop": {"foreach": False}}[impl]
    return torch.optim.AdamW(model.parameters(), lr=lr, **flags)


# --- timing -----------------------------------------------------------------------------------

class CpuMonitor:
    """CPU time used by *other* processes, from /proc/stat minus this process's own time.

    A block of timed steps during which other processes used more than `max_foreign` cores is
    thrown away and run again once the machine is quiet (a shared 2-core box otherwise gives
    5x slower rounds whenever someone starts a test run)."""

    def __init__(self) -> None:
        self.hz = os.sysconf("SC_CLK_TCK")
        self.available = Path("/proc/stat").exists() and Path("/proc/self/stat").exists()

    def sample(self) -> tuple[float, int, int]:
        now = time.perf_counter()
        if not self.available:
            return now, 0, 0
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        busy = sum(int(f[i]) for i in (1, 2, 3, 6, 7, 8))  # user nice system irq softirq steal
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return now, busy, int(own[11]) + int(own[12])  # utime + stime, all threads

    def foreign_cores(self, a: tuple[float, int, int], b: tuple[float, int, int]) -> float:
        dt = b[0] - a[0]
        if dt <= 0 or not self.available:
            return 0.0
        return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / self.hz / dt)

    def wait_quiet(self, max_foreign: float, budget_s: float, window_s: float = 0.5,
                   quiet_windows: int = 1) -> float:
        """Sleep in `window_s` windows until other processes used < max_foreign cores for
        `quiet_windows` windows in a row, or until `budget_s` runs out. Returns seconds waited."""
        start = time.perf_counter()
        quiet = 0
        while quiet < quiet_windows and time.perf_counter() - start < budget_s:
            a = self.sample()
            time.sleep(window_s)
            quiet = quiet + 1 if self.foreign_cores(a, self.sample()) < max_foreign else 0
        return time.perf_counter() - start


def train_step(c: Contender, x: torch.Tensor, y: torch.Tensor, record: bool) -> None:
    t0 = time.perf_counter()
    loss = c.loss_fn(x, y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    c.opt.step()
    c.opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    if record:
        c.step_s.append(t3 - t0)
        c.phase_s["forward"].append(t1 - t0)
        c.phase_s["backward"].append(t2 - t1)
        c.phase_s["optimizer"].append(t3 - t2)
    c.last_loss = loss.detach().item()


@dataclass
class Gate:
    """Per-block check for foreign CPU load; `max_foreign=inf` switches it off."""

    monitor: CpuMonitor
    max_foreign: float
    max_wait_s: float
    waited_s: float = 0.0
    gave_up: bool = False

    @property
    def on(self) -> bool:
        return math.isfinite(self.max_foreign) and self.monitor.available


def run_block(c: Contender, x, y, steps: int, gate: Gate, verbose: bool) -> None:
    """`steps` timed steps of one contender; redone while another process loaded the CPUs."""
    retry = False
    while True:
        if retry and not gate.gave_up:
            # wait for a quiet spell (test runs come in bursts), then one untimed step: the
            # first step after an idle pause runs ~5-10% slow (threads parked, caches cold)
            budget = max(gate.max_wait_s - gate.waited_s, 0.0)
            gate.waited_s += gate.monitor.wait_quiet(gate.max_foreign, budget, 0.5,
                                                     quiet_windows=6)
            train_step(c, x, y, record=False)
        start = len(c.step_s)
        a = gate.monitor.sample()
        for _ in range(steps):
            train_step(c, x, y, record=True)
        foreign = gate.monitor.foreign_cores(a, gate.monitor.sample())
        if not gate.on or gate.gave_up or foreign < gate.max_foreign:
            c.block_foreign_cores.append(foreign)
            c.round_median_s.append(statistics.median(c.step_s[start:]))
            return
        # contaminated: drop the samples and try again once the machine is quiet
        del c.step_s[start:]
        for v in c.phase_s.values():
            del v[start:]
        c.rejected_blocks.append(foreign)
        retry = True
        if verbose:
            print(f"  {c.name}: other processes used {foreign:.2f} cores, block redone",
                  flush=True)
        if gate.waited_s >= gate.max_wait_s:
            gate.gave_up = True
            print(f"  waited {gate.waited_s:.0f}s for a quiet machine; accepting noisy blocks "
                  "from now on (see contaminated in the JSON)", file=sys.stderr, flush=True)


def run_rounds(contenders: list[Contender], x, y, *, warmup: int, rounds: int, steps: int,
               gate: Gate, verbose: bool) -> None:
    if gate.on:  # start on a quiet machine; blocks are checked after they ran
        gate.waited_s += gate.monitor.wait_quiet(gate.max_foreign, gate.max_wait_s, 0.5, 4)
    for c in contenders:
        for _ in range(warmup):
            train_step(c, x, y, record=False)
    n = len(contenders)
    for r in range(rounds):
        order = contenders[r % n:] + contenders[:r % n]
        for c in order:
            run_block(c, x, y, steps, gate, verbose)
        if verbose:
            line = "  ".join(f"{c.name} {c.round_median_s[-1] * 1e3:.0f}ms" for c in contenders)
            print(f"round {r + 1}/{rounds}: {line}", flush=True)


# --- reporting --------------------------------------------------------------------------------

def summarize(c: Contender, tokens_per_step: int) -> dict:
    med = statistics.median(c.step_s)
    return {
        "library": c.library,
        "model": c.description,
        "params": c.params,
        "step_s": {"median": med, "min": min(c.step_s), "max": max(c.step_s),
                   "n": len(c.step_s)},
        "tokens_per_s": {"median": tokens_per_step / med,
                         "min": tokens_per_step / max(c.step_s),
                         "max": tokens_per_step / min(c.step_s)},
        "phase_median_s": {k: statistics.median(v) for k, v in c.phase_s.items()},
        "round_median_step_s": c.round_median_s,
        "samples_step_s": c.step_s,
        "foreign_cores_max_accepted": max(c.block_foreign_cores, default=0.0),
        "rejected_blocks_foreign_cores": c.rejected_blocks,
        "final_loss": c.last_loss,
    }


def ratio(by_name: dict[str, Contender], num: str, den: str) -> dict | None:
    if num not in by_name or den not in by_name:
        return None
    a, b = by_name[num], by_name[den]
    # tokens/s ratio = inverse step-time ratio
    value = statistics.median(b.step_s) / statistics.median(a.step_s)
    # paired estimate: both contenders' medians from the same round, minutes apart at most
    per_round = [rb / ra for ra, rb in zip(a.round_median_s, b.round_median_s, strict=True)]
    return {"value": value, "paired_median": statistics.median(per_round),
            "ratio_of_minima": min(b.step_s) / min(a.step_s),
            "per_round_min": min(per_round), "per_round_max": max(per_round),
            "per_round": per_round}


def gate_line(result: dict) -> str:
    g = result["method"]["foreign_load_gate"]
    if not g["active"]:
        return "Foreign-load gate off: timings may include other processes' load."
    line = (f"Foreign-load gate: blocks during which other processes used >= "
            f"{g['max_foreign_cores']} cores were redone ({g['rejected_blocks']} redone, "
            f"{g['waited_s']:.0f} s spent waiting for a quiet machine).")
    if g["contaminated"]:
        line += " WARNING: gave up waiting; some blocks ran on a busy machine."
    return line


def markdown(result: dict) -> str:
    s = result["shapes"]
    lines = [
        f"# bench_step results ({result['date']})",
        "",
        f"{result['cpu_model']}, {result['torch_threads']} torch threads, torch "
        f"{result['torch_version']}, x-transformers {result['x_transformers_version']}. "
        f"{s['n_blocks']} blocks, d={s['d_model']}, {s['n_heads']} heads, context "
        f"{s['seq_len']}, batch {s['batch']}, vocab {s['vocab']}, fp32; AdamW "
        f"[{result['optimizer']['resolved']}], {result['method']['rounds']} rounds x "
        f"{result['method']['steps_per_round']} steps.",
        "",
        gate_line(result),
        "",
        "| contender | params | median step ms | min..max ms | tokens/s (median) "
        "| fwd / bwd / opt ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, c in result["contenders"].items():
        st, ph = c["step_s"], c["phase_median_s"]
        lines.append(
            f"| {name} | {c['params']:,} | {st['median'] * 1e3:.1f} | "
            f"{st['min'] * 1e3:.1f}..{st['max'] * 1e3:.1f} | "
            f"{c['tokens_per_s']['median']:,.0f} | {ph['forward'] * 1e3:.0f} / "
            f"{ph['backward'] * 1e3:.0f} / {ph['optimizer'] * 1e3:.0f} |")
    lines += ["", "| ratio (tokens/s) | ratio of medians | median of per-round ratios "
              "| per-round range | ratio of minima | target | met |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for name, r in result["ratios"].items():
        target = f">= {r['target']}" if "target" in r else "-"
        met = ("yes" if r["met"] else "**no**") if "met" in r else "-"
        lines.append(f"| {name} | {r['value']:.3f} | {r['paired_median']:.3f} | "
                     f"{r['per_round_min']:.3f}..{r['per_round_max']:.3f} | "
                     f"{r['ratio_of_minima']:.3f} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def print_table(result: dict) -> None:
    print()
    print(gate_line(result))
    print(f"{'contender':<20} {'params':>10} {'median ms':>10} {'min ms':>8} {'max ms':>8} "
          f"{'tok/s':>9} {'fwd/bwd/opt ms':>16}")
    for name, c in result["contenders"].items():
        st, ph = c["step_s"], c["phase_median_s"]
        split = f"{ph['forward'] * 1e3:.0f}/{ph['backward'] * 1e3:.0f}/{ph['optimizer'] * 1e3:.0f}"
        print(f"{name:<20} {c['params']:>10,} {st['median'] * 1e3:>10.1f} "
              f"{st['min'] * 1e3:>8.1f} {st['max'] * 1e3:>8.1f} "
              f"{c['tokens_per_s']['median']:>9,.0f} {split:>16}")
    print()
    for name, r in result["ratios"].items():
        tail = ""
        if "target" in r:
            tail = f"  target >= {r['target']}: {'MET' if r['met'] else 'MISSED'}"
        print(f"{name:<36} {r['value']:.3f}  (paired {r['paired_median']:.3f}, rounds "
              f"{r['per_round_min']:.3f}..{r['per_round_max']:.3f}, minima "
              f"{r['ratio_of_minima']:.3f}){tail}")
    print()


# --- main -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="timed steps per contender per round "
                   "(default 3; quick 2)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 10; "
                   "quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per contender "
                   "(default 3; quick 1)")
    p.add_argument("--out", type=Path, default=None, help=f"results JSON (default "
                   f"{DEFAULT_OUT.relative_to(ROOT)}; with --quick {QUICK_OUT.relative_to(ROOT)}"
                   "); a Markdown table is written next to it")
    p.add_argument("--quick", action="store_true", help="tiny shapes, a smoke run in seconds")
    p.add_argument("--optim", choices=["default", "foreach", "fused", "forloop"],
                   default="default", help="AdamW implementation flags, the same for every "
                   "contender (default: torch's choice)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--no-matched", action="store_true", help="skip the bias-free pair with "
                   "exactly equal parameter counts")
    p.add_argument("--max-foreign", type=float, default=None, help="redo a block of steps "
                   "when other processes used more than this many cores during it (default "
                   "0.05; off with --quick or 'inf')")
    p.add_argument("--max-wait", type=float, default=3600.0, help="seconds to wait in total "
                   "for a quiet machine before accepting noisy blocks (default 3600)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--placements", action="store_true", help="every normlab placement against "
                   "normlab-pre instead of the peer comparison (target: step time within 10%%)")
    p.add_argument("--only", default=None, help="with --placements: a comma list of placements "
                   "to time against pre (pre is always included), e.g. hybrid,hybrid_star")
    args = p.parse_args(argv)
    named = [name for name in PLACEMENTS if name != "custom"]
    if args.only is not None:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = sorted(wanted - set(named))
        if not args.placements or unknown or not wanted:
            p.error(f"--only: needs --placements and names among {', '.join(named)}"
                    + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        named = [name for name in named if name in wanted | {"pre"}]

    shapes = dict(QUICK_SHAPES if args.quick else FULL_SHAPES)
    steps = args.steps or (2 if args.quick else 3)
    rounds = args.rounds or (2 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    if args.placements and args.out is None:
        out = out.with_name(out.name.replace("bench_step", "bench_step.placements"))
    max_foreign = args.max_foreign
    if max_foreign is None:
        max_foreign = math.inf if args.quick else 0.05
    gate = Gate(CpuMonitor(), max_foreign, args.max_wait)
    if args.threads:
        torch.set_num_threads(args.threads)

    targets, extra_ratios = TARGETS, EXTRA_RATIOS
    if args.placements:
        flash = {"works": False, "error": "not compared (--placements)"}
        contenders = [normlab_contender(f"normlab-{name}", name, shapes) for name in named]
        targets = {f"normlab-{name} / normlab-pre": (f"normlab-{name}", "normlab-pre",
                                                     PLACEMENT_TARGET)
                   for name in named if name != "pre"}
        extra_ratios = {}
    else:
        flash = check_peer_flash(shapes)
        if not flash["works"]:
            print(f"x-transformers attn_flash=True failed ({flash['error']}); peer uses its "
                  "default attention path", file=sys.stderr)
        contenders = peer_contenders(shapes, flash["works"], matched=not args.no_matched)
    use_flash = flash["works"]
    for c in contenders:
        c.model.train()
        c.opt = make_optimizer(c.model, args.optim, args.lr)

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shapes["vocab"], (shapes["batch"], shapes["seq_len"] + 1),
                           generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    tokens_per_step = shapes["batch"] * shapes["seq_len"]

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}; "
          f"{len(contenders)} contenders x {rounds} rounds x {steps} steps "
          f"(+{warmup} warmup)", flush=True)
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    run_rounds(contenders, x, y, warmup=warmup, rounds=rounds, steps=steps, gate=gate,
               verbose=True)
    wall = time.perf_counter() - t_start
    load_after = os.getloadavg()

    for c in contenders:
        if not math.isfinite(c.last_loss):
            raise RuntimeError(f"{c.name}: non-finite loss {c.last_loss}")

    by_name = {c.name: c for c in contenders}
    ratios: dict[str, dict] = {}
    for label, (num, den, target) in targets.items():
        r = ratio(by_name, num, den)
        if r is not None:
            ratios[label] = {**r, "target": target, "met": r["value"] >= target,
                             "met_paired": r["paired_median"] >= target}
    for label, (num, den) in extra_ratios.items():
        r = ratio(by_name, num, den)
        if r is not None:
            ratios[label] = r

    opt0 = contenders[0].opt
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "x_transformers_version": importlib.metadata.version("x-transformers"),
        "python_version": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "quick": args.quick,
        "shapes": {**shapes, "dtype": "float32", "dropout": 0.0, "positions": "learned absolute",
                   "mlp": "GELU (exact), width 4*d", "tied_embeddings": True,
                   "tokens_per_step": tokens_per_step},
        "optimizer": {"class": "torch.optim.AdamW", "lr": args.lr, "impl": args.optim,
                      "foreach": opt0.defaults.get("foreach"),
                      "fused": opt0.defaults.get("fused"),
                      "resolved": resolved_impl(opt0),
                      "weight_decay": opt0.defaults.get("weight_decay")},
        "method": {"warmup_steps": warmup, "rounds": rounds, "steps_per_round": steps,
                   "order": "round-robin, starting contender rotated each round",
                   "step": "forward+loss, backward, AdamW.step, zero_grad(set_to_none=True)",
                   "wall_s": wall,
                   "foreign_load_gate": {
                       "max_foreign_cores": max_foreign if math.isfinite(max_foreign) else None,
                       "active": gate.on, "waited_s": gate.waited_s,
                       "rejected_blocks": sum(len(c.rejected_blocks) for c in contenders),
                       "contaminated": gate.gave_up}},
        "peer_attn_flash": {**flash, "used": use_flash},
        "contenders": {c.name: summarize(c, tokens_per_step) for c in contenders},
        "ratios": ratios,
    }

    print_table(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
