#!/usr/bin/env python
"""Compiled, side by side on a CUDA GPU: normlab `pre` and `post` against the nanoGPT-style
reference decoder of `bench_peers.py` (`ReferenceDecoder`), at GPT-2 small's shape.

Like for like: 12 blocks, width 768, 12 heads, context 1024, GPT-2's vocabulary of 50,257 tokens,
batch 8; learned positions, biases on every linear map and norm, exact-GELU MLP of width 4d, tied
output head (`bench_peers.normlab_config` with GPT-2's vocabulary); every contender trained with
bf16 autocast (fp32 master weights), fused attention (`scaled_dot_product_attention`), fused
AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1), gradient clipping at 1.0, TF32 allowed for the
fp32 matrix work (as nanoGPT's train.py sets it), and `torch.compile` on the model; random tokens.

A timed step is a full training step (forward + loss under autocast, backward, clipping,
`AdamW.step()`, `zero_grad()`). After untimed warm-up steps (the first compiles; its time is
reported), the contenders run in interleaved rounds (reference, pre, post, the first one rotated
each round), each round `--steps` steps per contender timed as one block between two device
synchronisations. Reported per contender: the median over rounds of the time a step, tokens/s,
the ratio to the reference's tokens/s (ratio of the medians, and the median and range of the
per-round ratios), and MFU (PaLM's accounting, `normlab.train.perf`) against the bf16 GEMM peak
measured in the same run and the data sheet's. Before timing, normlab-pre is checked to compute
the reference's function: with the reference's weights (plus noise, away from the init's near
uniform outputs) copied in, the same fp32 loss on one batch, without TF32, to 1e-5 relative.

Recorded in `--out` (default `benchmarks/results/gpu_peers.json`) and a Markdown table next to it,
with the device's name, the torch and CUDA versions, the date and the commit (`gpu_meta.py`). On a
machine without a CUDA GPU it says so and exits 0.

    python benchmarks/gpu_peers.py            # writes benchmarks/results/gpu_peers.{json,md}
    python benchmarks/gpu_peers.py --smoke    # a tiny shape on the CPU, eager, seconds: the
                                              # script's logic (the test runs this); records nothing
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run from a checkout without installing
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_peers import BETAS, LR, WEIGHT_DECAY, ReferenceDecoder, Shape, normlab_config  # noqa: E402
from gpu_check import nominal_peak  # noqa: E402
from gpu_meta import NO_GPU, meta_line, run_meta  # noqa: E402

from normlab.config import ModelConfig  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.train.optim import param_groups  # noqa: E402
from normlab.train.perf import gemm_peak_tflops, train_flops_per_token  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_peers.json"
GPT2_SMALL, GPT2_VOCAB = Shape(blocks=12, width=768, heads=12, seq_len=1024, batch=8), 50257
SMOKE, SMOKE_VOCAB = Shape(blocks=2, width=32, heads=2, seq_len=16, batch=2), 64
CONTENDERS = ("reference", "normlab-pre", "normlab-post")
GRAD_CLIP = 1.0
# the reference's weights, plus this much N(0, 1) noise, copied into normlab-pre: the two fp32
# losses on one batch must agree to this relative difference
PERTURB, SAME_FUNCTION_TOL = 0.2, 1e-5


def model_config(shape: Shape, placement: str, vocab: int) -> ModelConfig:
    """bench_peers' like-for-like normlab config, with `vocab` tokens."""
    return ModelConfig(**{**normlab_config(shape, placement).to_dict(), "vocab_size": vocab})


@dataclass
class Contender:
    name: str
    description: str
    model: torch.nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (compiled) forward + loss
    opt: torch.optim.Optimizer
    first_step_s: float = math.nan
    round_step_s: list[float] = field(default_factory=list)  # a step's time, each round
    first_loss: float = math.nan
    last_loss: float = math.nan

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def contenders(shape: Shape, vocab: int, device: torch.device, compile_model: bool
               ) -> list[Contender]:
    wrap = torch.compile if compile_model else (lambda m: m)
    torch.manual_seed(0)
    ref = ReferenceDecoder(shape, vocab=vocab).to(device)
    ref_net = wrap(ref)
    out = [Contender("reference", "ReferenceDecoder (bench_peers.py; nanoGPT's design)", ref,
                     lambda x, y: ref_net(x, y), ref.optimizer())]
    for placement in ("pre", "post"):
        model = build_model(model_config(shape, placement, vocab), seed=0).to(device)
        net = wrap(model)
        opt = torch.optim.AdamW(param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS,
                                fused=True)
        out.append(Contender(f"normlab-{placement}",
                             f"ModelConfig(placement={placement!r}), init {model.plan.init}",
                             model, lambda x, y, net=net: net(x, y).loss, opt))
    return out


def train_step(c: Contender, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = c.loss(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(c.model.parameters(), GRAD_CLIP)
    c.opt.step()
    c.opt.zero_grad(set_to_none=True)
    return loss.detach()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def same_function(shape: Shape, vocab: int, device: torch.device) -> dict:
    """normlab-pre with the reference's weights copied in (parameter by parameter, in order,
    after adding `PERTURB` x N(0, 1) noise to them): both losses on one batch in fp32, with
    full-precision matrix products."""
    torch.manual_seed(0)
    ref = ReferenceDecoder(shape, vocab=vocab).to(device)
    model = build_model(model_config(shape, "pre", vocab), seed=0).to(device)
    pairs = list(zip(ref.parameters(), model.parameters(), strict=True))
    if any(a.shape != b.shape for a, b in pairs):
        return {"same_parameter_shapes": False, "agrees": False}
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    noise = torch.Generator().manual_seed(2)
    try:
        with torch.no_grad():
            for a, b in pairs:
                # noise first: at init the outputs are near uniform, and two different
                # functions would give nearly the same loss there
                a.add_(torch.randn(a.shape, generator=noise).to(device), alpha=PERTURB)
                b.copy_(a)
            gen = torch.Generator().manual_seed(1)
            x, y = torch.randint(0, vocab, (2, 2, shape.seq_len), generator=gen).to(device)
            ours, theirs = model(x, y).loss.item(), ref(x, y).item()
    finally:
        torch.set_float32_matmul_precision(before)
    del ref, model, pairs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    diff = abs(ours - theirs)
    return {"same_parameter_shapes": True, "loss_reference": theirs, "loss_normlab_pre": ours,
            "loss_abs_diff": diff, "agrees": diff <= SAME_FUNCTION_TOL * abs(theirs)}


def run_rounds(cs: list[Contender], x, y, *, warmup: int, rounds: int, steps: int,
               verbose: bool) -> None:
    device = x.device
    for c in cs:
        sync(device)
        t0 = time.perf_counter()
        c.first_loss = train_step(c, x, y).item()  # compiles
        c.first_step_s = time.perf_counter() - t0
        for _ in range(warmup - 1):
            train_step(c, x, y)
        sync(device)
        if verbose:
            print(f"  {c.name}: first step {c.first_step_s:.1f} s (compiles), loss "
                  f"{c.first_loss:.3f}", flush=True)
    n = len(cs)
    for r in range(rounds):
        for c in cs[r % n:] + cs[:r % n]:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = train_step(c, x, y)
            sync(device)
            c.round_step_s.append((time.perf_counter() - t0) / steps)
            c.last_loss = loss.item()
        if verbose:
            print(f"  round {r + 1}/{rounds}: " + "  ".join(
                f"{c.name} {c.round_step_s[-1] * 1e3:.1f} ms" for c in cs), flush=True)


def summarize(cs: list[Contender], tokens_per_step: int, flops_per_token: float,
              peak: float, nominal: float | None) -> dict[str, dict]:
    ref = cs[0]
    rows = {}
    for c in cs:
        step = statistics.median(c.round_step_s)
        tps = tokens_per_step / step
        per_round = [a / b for a, b in zip(ref.round_step_s, c.round_step_s, strict=True)]
        flops = tps * flops_per_token / 1e12
        rows[c.name] = {
            "description": c.description, "params": c.params,
            "first_step_s": c.first_step_s, "step_s": step,
            "step_s_min": min(c.round_step_s), "step_s_max": max(c.round_step_s),
            "round_step_s": c.round_step_s, "tokens_per_s": tps,
            "vs_reference": statistics.median(ref.round_step_s) / step,
            "vs_reference_paired": statistics.median(per_round),
            "vs_reference_rounds": [min(per_round), max(per_round)],
            "mfu_measured": flops / peak, "mfu_nominal": flops / nominal if nominal else None,
            "first_loss": c.first_loss, "last_loss": c.last_loss}
    return rows


def differences(shape: Shape, params: dict[str, int], inits: dict[str, str]) -> list[str]:
    """What differs between normlab's models and the reference, in words."""
    lines = []
    expected = {"normlab-pre": 0, "normlab-post": -2 * shape.width}  # post: no final norm
    for name in CONTENDERS[1:]:
        if params[name] - params["reference"] != expected[name]:
            lines.append(f"{name} has {params[name] - params['reference']:+,} parameters "
                         f"against the reference ({params[name]:,} vs {params['reference']:,})")
    lines += [
        "normlab-post: LayerNorm after each residual add (Post-LN) instead of before each "
        "sublayer, and no final norm (2d parameters fewer); the same matrix products",
        "init (no effect on the work): the reference GPT-2's N(0, 0.02) with the projections "
        f"into the stream scaled by 1/sqrt(2L); normlab-pre {inits['normlab-pre']}, "
        f"normlab-post {inits['normlab-post']}",
        "AdamW weight decay (no effect on the work): the reference decays every matrix "
        "including the tied embedding, normlab every matrix but the embeddings"]
    return lines


def run(args: argparse.Namespace) -> dict:
    """Measure; returns the report (the caller prints and records it)."""
    if args.smoke:
        device, shape, vocab, compile_model = torch.device("cpu"), SMOKE, SMOKE_VOCAB, False
    else:
        device, shape, vocab = torch.device("cuda"), GPT2_SMALL, GPT2_VOCAB
        compile_model = not args.no_compile
    if args.batch:
        shape = Shape(shape.blocks, shape.width, shape.heads, shape.seq_len, args.batch)
    meta = run_meta(device)
    same = same_function(shape, vocab, device)
    if not same["agrees"]:
        print(f"normlab-pre does not compute the reference's function ({same}); the models "
              "are not like for like", file=sys.stderr)
    if device.type == "cuda":  # as nanoGPT's train.py: TF32 for what autocast leaves in fp32
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    peak = gemm_peak_tflops(torch.bfloat16, device, **(
        {"sizes": (4096, 8192), "seconds": 1.0} if device.type == "cuda"
        else {"sizes": (256,), "seconds": 0.05}))
    nominal = nominal_peak(meta["device"]) if device.type == "cuda" else None
    print(f"{meta_line(meta)}\n{shape.words()}, vocabulary {vocab:,}; bf16 autocast, fused "
          f"AdamW, {'torch.compile' if compile_model else 'eager'}; bf16 GEMM peak measured "
          f"{peak:.1f} TFLOP/s" + (f", data sheet {nominal:.1f}" if nominal else ""), flush=True)
    cs = contenders(shape, vocab, device, compile_model)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (shape.batch, shape.seq_len + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    t0 = time.perf_counter()
    run_rounds(cs, x, y, warmup=args.warmup, rounds=args.rounds, steps=args.steps,
               verbose=not args.smoke)
    flops = train_flops_per_token(model_config(shape, "pre", vocab), shape.seq_len)
    rows = summarize(cs, shape.batch * shape.seq_len, flops, peak, nominal)
    return {**meta, "shape": dataclasses.asdict(shape) | {"vocab": vocab}, "compile": compile_model,
            "precision": "bf16 autocast", "tf32": device.type == "cuda",
            "method": {"warmup_steps": args.warmup, "rounds": args.rounds,
                       "steps_per_round": args.steps, "wall_s": time.perf_counter() - t0,
                       "order": "reference, normlab-pre, normlab-post; the first rotated each "
                                "round",
                       "step": "forward+loss under bf16 autocast, backward, clip_grad_norm_ "
                               f"{GRAD_CLIP}, AdamW(fused=True).step, zero_grad(set_to_none)",
                       "optimizer": {"lr": LR, "betas": BETAS, "weight_decay": WEIGHT_DECAY}},
            "flops_per_token": flops, "bf16_gemm_peak_measured_tflops": peak,
            "bf16_peak_nominal_tflops": nominal, "normlab_pre_is_reference": same,
            "contenders": rows,
            "differences": differences(shape, {n: r["params"] for n, r in rows.items()},
                                       {c.name: c.description.rsplit("init ", 1)[-1]
                                        for c in cs})}


HEADER = ("contender", "params", "first step", "step", "tokens/s", "vs reference", "paired",
          "rounds", "MFU (measured peak)", "MFU (data sheet)", "loss first / last")


def table_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for name, r in report["contenders"].items():
        lo, hi = r["vs_reference_rounds"]
        rows.append((name, f"{r['params']:,}", f"{r['first_step_s']:.1f} s",
                     f"{r['step_s'] * 1e3:.1f} ms", f"{r['tokens_per_s']:,.0f}",
                     f"{r['vs_reference']:.3f}", f"{r['vs_reference_paired']:.3f}",
                     f"{lo:.2f}..{hi:.2f}", f"{r['mfu_measured']:.1%}",
                     f"{r['mfu_nominal']:.1%}" if r["mfu_nominal"] is not None else "-",
                     f"{r['first_loss']:.3f} / {r['last_loss']:.3f}"))
    return rows


def same_function_line(report: dict) -> str:
    same = report["normlab_pre_is_reference"]
    if same["agrees"]:
        return ("normlab-pre computes the reference's function: with the reference's weights "
                f"copied in, its fp32 loss differs by {same['loss_abs_diff']:.1e}")
    return f"WARNING: normlab-pre does not compute the reference's function ({same})"


def print_report(report: dict) -> None:
    rows = table_rows(report)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADER)]
    print()
    for row in (HEADER, *rows):
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))))
    print(same_function_line(report))


def markdown(report: dict) -> str:
    m, s = report["method"], report["shape"]
    nominal = report["bf16_peak_nominal_tflops"]
    lines = [f"# Peers on a GPU: normlab against a nanoGPT-style reference ({report['date']})",
             "", meta_line(report) + ".", "",
             f"{s['blocks']} blocks, width {s['width']}, {s['heads']} heads, context "
             f"{s['seq_len']}, vocabulary {s['vocab']:,}, batch {s['batch']}; "
             f"{report['precision']}, {'torch.compile' if report['compile'] else 'eager'}"
             f"{', TF32 allowed' if report['tf32'] else ''}. {m['warmup_steps']} warm-up steps "
             f"(the first compiles), then {m['rounds']} interleaved rounds x "
             f"{m['steps_per_round']} timed steps per contender; a step: {m['step']}. bf16 GEMM "
             f"peak measured in the same run: {report['bf16_gemm_peak_measured_tflops']:.1f} "
             "TFLOP/s; data sheet: "
             + (f"{nominal:.1f} TFLOP/s." if nominal else "unknown for this device."), "",
             "vs reference: tokens/s over the reference's (ratio of the medians; paired: the "
             "median of the per-round ratios, and their range).", "",
             "| " + " | ".join(HEADER) + " |", "|---|" + "---:|" * (len(HEADER) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    lines += ["", same_function_line(report) + ".", "", "Settings that differ from the "
              "reference:", ""]
    lines += [f"- {line}" for line in report["differences"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="timed steps per contender per round "
                   "(10)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per contender first, "
                   "the first compiling (3)")
    p.add_argument("--batch", type=int, default=None, help="sequences a step (8)")
    p.add_argument("--no-compile", action="store_true", help="eager, without torch.compile")
    p.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU, eager, 2 "
                   "rounds of 1 step: checks the script, records nothing")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="results JSON; a Markdown table goes next to it (.md)")
    args = p.parse_args(argv)
    if min(args.steps, args.rounds, args.warmup) < 1 or (args.batch is not None
                                                         and args.batch < 1):
        p.error("--steps, --rounds, --warmup and --batch must be at least 1")
    if args.smoke:
        args.steps, args.rounds, args.warmup = 1, 2, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print(f"gpu_peers.py: {NO_GPU}; run it where `torch.cuda.is_available()` is true.")
        return 0
    report = run(args)
    print_report(report)
    if not args.smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(report))
        print(f"written: {args.out} and {args.out.with_suffix('.md')}")
    finite = all(math.isfinite(r[k]) for r in report["contenders"].values()
                 for k in ("first_loss", "last_loss"))
    if not finite or not report["normlab_pre_is_reference"]["agrees"]:
        print("gpu_peers.py: a non-finite loss, or normlab-pre is not the reference's function",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
