#!/usr/bin/env python
"""Training-step throughput of normlab `pre` and `post` against a plain-PyTorch reference decoder
built to nanoGPT's design, at the study's shapes and a wider one, in one run.

The reference (`ReferenceDecoder`, below) is the smallest decoder of that design: token and
learned position embeddings, Pre-LN blocks (LayerNorm -> causal self-attention with one fused
Q/K/V projection and `F.scaled_dot_product_attention` -> residual add; LayerNorm -> exact-GELU
MLP of width 4d -> residual add), a final LayerNorm and an output head tied to the token
embedding; biases on every linear map and LayerNorm, GPT-2's init, AdamW in fp32. normlab's
models are configured like for like (`ModelConfig` with the same width, heads, MLP, positions,
biases and tied head); what still differs is printed with the results.

One timed step is a full training step: forward + cross-entropy, backward, `AdamW.step()`,
`zero_grad()`, the same for all three contenders (fused AdamW, the same flags). After untimed
warmup steps the contenders run in interleaved rounds (reference, pre, post, the starting one
rotated each round), as `bench_step.py` runs them, with its load gate; reported per contender:
median step time, tokens/s, its ratio to the reference's (ratio of the medians, and the median
of the per-round ratios), and the share of the GEMM peak measured at the start of the same run
that its model FLOPs reach (PaLM's accounting, `normlab.train.perf`). fp32, and where the CPU has
native bf16 (avx512_bf16 or amx_bf16 among its flags) also bf16 under autocast.

Shapes: the study's (width 64, 2 heads, context 64, batch 16; 6 and 24 blocks) and width 256 x 6
blocks (4 heads, context 256, batch 16). CPU only.

    python benchmarks/bench_peers.py            # the three shapes; writes benchmarks/results/
    python benchmarks/bench_peers.py --quick    # tiny shapes, seconds, records nothing
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run from a checkout without installing
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_step import (  # noqa: E402
    Contender,
    CpuMonitor,
    Gate,
    gate_line,
    ratio,
    run_rounds,
    summarize,
)
from recording import new_report, record  # noqa: E402

from normlab.config import ModelConfig  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.train.machine import NATIVE_BF16_FLAGS, cpu_flags, native_bf16  # noqa: E402
from normlab.train.optim import param_groups  # noqa: E402
from normlab.train.perf import gemm_peak_tflops, train_flops_per_token  # noqa: E402
from normlab.train.precision import precision_context  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "bench_peers.json"
VOCAB = 256  # normlab's byte data


@dataclass(frozen=True)
class Shape:
    blocks: int
    width: int
    heads: int
    seq_len: int
    batch: int

    @property
    def name(self) -> str:
        return f"L{self.blocks}-d{self.width}-T{self.seq_len}-B{self.batch}"

    def words(self) -> str:
        return (f"{self.blocks} blocks, width {self.width}, {self.heads} heads, context "
                f"{self.seq_len}, batch {self.batch}")


# the study's training runs (profiles quick/standard/long: 6 blocks, its deep runs 24), and the
# width-256 shape of bench_step.py and bench_throughput.py
SHAPES = (Shape(6, 64, 2, 64, 16), Shape(24, 64, 2, 64, 16), Shape(6, 256, 4, 256, 16))
QUICK_SHAPES = (Shape(2, 32, 2, 16, 4), Shape(4, 32, 2, 16, 4))
CONTENDERS = ("reference", "normlab-pre", "normlab-post")
PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LR, BETAS, WEIGHT_DECAY = 3e-4, (0.9, 0.95), 0.1


# --- the reference: a decoder to nanoGPT's design, in plain PyTorch -------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=bias)  # Q, K and V in one GEMM
        self.out = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class ReferenceBlock(nn.Module):
    """Pre-LN: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(width, bias=bias)
        self.attn = CausalSelfAttention(width, heads, bias)
        self.norm_mlp = nn.LayerNorm(width, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width, bias=bias), nn.GELU(),
                                 nn.Linear(4 * width, width, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


class ReferenceDecoder(nn.Module):
    def __init__(self, shape: Shape, vocab: int = VOCAB, bias: bool = True) -> None:
        super().__init__()
        d = shape.width
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(shape.seq_len, d)
        self.blocks = nn.ModuleList(ReferenceBlock(d, shape.heads, bias)
                                    for _ in range(shape.blocks))
        self.norm = nn.LayerNorm(d, bias=bias)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied
        for m in self.modules():  # GPT-2: N(0, 0.02), zero biases, LayerNorm (1, 0)
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for block in self.blocks:  # the projections into the stream, scaled by 1/sqrt(2L)
            for proj in (block.attn.out, block.mlp[2]):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * shape.blocks))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def optimizer(self) -> torch.optim.Optimizer:
        """AdamW with weight decay on every matrix (the tied embedding included), none on
        biases and LayerNorm gains."""
        params = list(self.parameters())  # a tied weight once
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, fused=True)


# --- contenders --------------------------------------------------------------------------------

def normlab_config(shape: Shape, placement: str) -> ModelConfig:
    """normlab's model at the reference's settings: width, heads, exact-GELU MLP of width 4d,
    learned positions, biases on linear maps and norms, tied head, no dropout."""
    return ModelConfig(placement=placement, n_blocks=shape.blocks, d_model=shape.width,
                       n_heads=shape.heads, d_ff=4 * shape.width, max_seq_len=shape.seq_len,
                       vocab_size=VOCAB, positions="learned", mlp="gelu", gelu_approx="none",
                       attention="softmax", bias=True, norm_bias=True, norm="layernorm",
                       tie_embeddings=True, dropout=0.0, embed_norm=False)


def contenders(shape: Shape, precision: str) -> list[Contender]:
    autocast = precision_context(precision, torch.device("cpu"))
    torch.manual_seed(0)
    ref = ReferenceDecoder(shape)

    def ref_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast:
            return ref(x, y)

    out = [Contender("reference", "plain PyTorch", "ReferenceDecoder (nanoGPT's design)", ref,
                     ref_loss, opt=ref.optimizer())]
    for placement in ("pre", "post"):
        model = build_model(normlab_config(shape, placement), seed=0)

        def loss(x: torch.Tensor, y: torch.Tensor, model=model) -> torch.Tensor:
            with autocast:
                return model(x, y).loss

        opt = torch.optim.AdamW(param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS,
                                fused=True)
        out.append(Contender(f"normlab-{placement}", "normlab",
                             f"ModelConfig(placement={placement!r}), init {model.plan.init}",
                             model, loss, opt=opt))
    return out


def same_function(shape: Shape) -> dict:
    """Does normlab-pre compute the reference's function? The reference's weights are copied
    into normlab's pre model, parameter by parameter in order (their shapes must agree), and
    both losses are taken on one batch, in fp32."""
    torch.manual_seed(0)
    ref = ReferenceDecoder(shape)
    model = build_model(normlab_config(shape, "pre"), seed=0)
    pairs = list(zip(ref.parameters(), model.parameters(), strict=True))
    if any(a.shape != b.shape for a, b in pairs):
        return {"same_parameter_shapes": False, "agrees": False}
    with torch.no_grad():
        for a, b in pairs:
            b.copy_(a)
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randint(0, VOCAB, (2, 2, shape.seq_len), generator=gen)
        diff = abs(ref(x, y).item() - model(x, y).loss.item())
    return {"same_parameter_shapes": True, "loss_abs_diff": diff, "agrees": diff < 1e-5}


def differences(shape: Shape, precision: str, params: dict[str, int],
                inits: dict[str, str]) -> list[str]:
    """What differs between normlab's models and the reference at this shape, in words."""
    lines = []
    ref = params["reference"]
    # Post-LN ends in a block's norm, so it has no final norm: its gain and bias, 2d parameters
    expected = {"normlab-pre": 0, "normlab-post": -2 * shape.width}
    for name in CONTENDERS[1:]:
        if params[name] - ref != expected[name]:
            lines.append(f"{name} has {params[name] - ref:+,} parameters against the reference "
                         f"({params[name]:,} vs {ref:,}) at {shape.name}")
    lines.append("normlab-post: LayerNorm after each residual add (Post-LN) instead of before "
                 "each sublayer, and no final norm (2d parameters fewer); the same GEMMs")
    lines.append("init (no effect on the work): reference GPT-2's N(0, 0.02) with projections "
                 "into the stream scaled by 1/sqrt(2L); normlab-pre "
                 f"{inits['normlab-pre']}, normlab-post {inits['normlab-post']}")
    lines.append("AdamW weight decay (no effect on the work): the reference decays every matrix "
                 "including the tied embedding, normlab every matrix but the embeddings")
    if precision == "bf16":
        lines.append("bf16: normlab computes attention as two batched GEMMs on CPU "
                     "(normlab.nn.layers.explicit_attention_pays), the reference calls "
                     "scaled_dot_product_attention; normlab casts the logits to fp32 before "
                     "the loss")
    return lines


# --- measurement -------------------------------------------------------------------------------

def gemm_peaks(precisions: list[str], quick: bool) -> dict[str, float]:
    kw = {"sizes": (256, 512), "seconds": 0.05} if quick else {}
    return {p: gemm_peak_tflops(PEAK_DTYPES[p], **kw) for p in precisions}


def measure(shape: Shape, precision: str, peak_tflops: float, args, gate: Gate) -> dict:
    cs = contenders(shape, precision)
    for c in cs:
        c.model.train()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (shape.batch, shape.seq_len + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    tokens_per_step = shape.batch * shape.seq_len
    if not args.quick:
        print(f"{shape.name} {precision}: {shape.words()}", flush=True)
    run_rounds(cs, x, y, warmup=args.warmup, rounds=args.rounds, steps=args.steps, gate=gate,
               verbose=not args.quick)
    for c in cs:
        if not math.isfinite(c.last_loss):
            raise RuntimeError(f"{shape.name} {precision} {c.name}: loss {c.last_loss}")
    flops = train_flops_per_token(normlab_config(shape, "pre"), shape.seq_len)
    by_name = {c.name: c for c in cs}
    rows = {}
    for c in cs:
        s = summarize(c, tokens_per_step)
        tps = s["tokens_per_s"]["median"]
        r = ratio(by_name, c.name, "reference")
        rows[c.name] = {**s, "peak_fraction": tps * flops / (peak_tflops * 1e12),
                        "vs_reference": r}
    params = {c.name: c.params for c in cs}
    inits = {c.name: c.description.rsplit("init ", 1)[-1] for c in cs}
    result = {"shape": shape.name, "blocks": shape.blocks, "width": shape.width,
              "heads": shape.heads, "seq_len": shape.seq_len, "batch": shape.batch,
              "precision": precision, "tokens_per_step": tokens_per_step,
              "flops_per_token": flops, "gemm_peak_tflops": peak_tflops,
              "contenders": rows, "differences": differences(shape, precision, params, inits)}
    del cs, by_name
    gc.collect()
    return result


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    native = native_bf16()
    precisions = args.precisions or (["fp32", "bf16"] if native else ["fp32"])
    if "bf16" in precisions and not native:
        print("bf16 asked for on a CPU without native bf16 (no "
              f"{' or '.join(NATIVE_BF16_FLAGS[:2])}): expect it to be far slower than fp32",
              file=sys.stderr)
    max_foreign = args.max_foreign if args.max_foreign is not None else (
        math.inf if args.quick else 0.05)
    gate = Gate(CpuMonitor(), max_foreign, args.max_wait)
    same = {shape.name: same_function(shape) for shape in shapes}
    for name, check in same.items():
        if not check["agrees"]:
            print(f"{name}: normlab-pre does not compute the reference's function ({check}); "
                  "the models are not like for like", file=sys.stderr)
    peaks = gemm_peaks(precisions, args.quick)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; GEMM peak "
          + ", ".join(f"{p} {v:.3f} TFLOP/s" for p, v in peaks.items()), flush=True)
    t0 = time.perf_counter()
    results = [measure(shape, p, peaks[p], args, gate) for shape in shapes for p in precisions]
    return new_report(
        args, quick=args.quick, native_bf16_flags=sorted(set(NATIVE_BF16_FLAGS) & cpu_flags()),
        precisions=precisions, gemm_peak_tflops=peaks, normlab_pre_is_reference=same,
        method={"warmup_steps": args.warmup, "rounds": args.rounds,
                "steps_per_round": args.steps, "wall_s": time.perf_counter() - t0,
                "order": "reference, normlab-pre, normlab-post; starting contender rotated "
                         "each round",
                "step": "forward+loss, backward, AdamW(fused=True).step, "
                        "zero_grad(set_to_none=True)",
                "optimizer": {"lr": LR, "betas": BETAS, "weight_decay": WEIGHT_DECAY,
                              "fused": True},
                "foreign_load_gate": {
                    "max_foreign_cores": max_foreign if math.isfinite(max_foreign) else None,
                    "active": gate.on, "waited_s": gate.waited_s, "contaminated": gate.gave_up,
                    "rejected_blocks": sum(len(c["rejected_blocks_foreign_cores"])
                                           for r in results
                                           for c in r["contenders"].values())}},
        results=results)


# --- reporting ---------------------------------------------------------------------------------

HEADER = ("shape", "precision", "contender", "params", "step ms", "tokens/s", "vs reference",
          "paired", "rounds", "GEMM peak")


def table_rows(report: dict) -> list[tuple[str, ...]]:
    rows = []
    for r in report["results"]:
        for name, c in r["contenders"].items():
            v = c["vs_reference"]
            rows.append((r["shape"], r["precision"], name, f"{c['params']:,}",
                         f"{c['step_s']['median'] * 1e3:.1f}",
                         f"{c['tokens_per_s']['median']:,.0f}", f"{v['value']:.3f}",
                         f"{v['paired_median']:.3f}",
                         f"{v['per_round_min']:.2f}..{v['per_round_max']:.2f}",
                         f"{c['peak_fraction']:.1%}"))
    return rows


def machine_line(report: dict) -> str:
    native = {True: f"native bf16 ({', '.join(report['native_bf16_flags'])})",
              False: "no native bf16", None: "bf16 support unknown"}[report["native_bf16"]]
    return (f"{report['cpu']}, {native}; {report['threads']} torch threads, torch "
            f"{report['torch']}; GEMM peak measured in this run: "
            + ", ".join(f"{p} {v:.3f} TFLOP/s" for p, v in report["gemm_peak_tflops"].items()))


def same_function_line(report: dict) -> str:
    checks = report["normlab_pre_is_reference"]
    if all(c["agrees"] for c in checks.values()):
        worst = max(c["loss_abs_diff"] for c in checks.values())
        return (f"normlab-pre computes the reference's function: with the reference's weights "
                f"copied in, its loss differs by at most {worst:.1e} at every shape")
    bad = ", ".join(name for name, c in checks.items() if not c["agrees"])
    return f"WARNING: normlab-pre does not compute the reference's function at {bad}"


def difference_lines(report: dict) -> list[str]:
    """Each difference once, with the shapes and precisions it holds for when not all."""
    seen: dict[str, list[str]] = {}
    for r in report["results"]:
        for line in r["differences"]:
            seen.setdefault(line, []).append(f"{r['shape']} {r['precision']}")
    everywhere = len(report["results"])
    return [line if len(where) == everywhere else f"{line} [{', '.join(where)}]"
            for line, where in seen.items()]


def print_report(report: dict) -> None:
    rows = table_rows(report)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADER)]
    print()
    print(machine_line(report))
    print(gate_line(report))
    print("vs reference: tokens/s over the reference's (ratio of medians; paired: median of "
          "the per-round ratios, and their range); GEMM peak: model FLOPs/s over the peak")
    for row in (HEADER, *rows):
        print("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))))
    print(same_function_line(report))
    print("settings that differ from the reference:")
    for line in difference_lines(report):
        print(f"  - {line}")
    print()


def markdown(report: dict) -> str:
    m = report["method"]
    lines = [
        f"# Peers: normlab against a nanoGPT-style reference ({report['date']})", "",
        machine_line(report) + ".", "",
        f"CPU flags: `{report['cpu_flags']}`", "",
        f"{m['warmup_steps']} warmup steps, then {m['rounds']} interleaved rounds x "
        f"{m['steps_per_round']} timed steps per contender; {m['step']}. {gate_line(report)}",
        "", "| " + " | ".join(HEADER) + " |", "|---|---|---|" + "---:|" * (len(HEADER) - 3)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(report)]
    lines += ["", same_function_line(report) + ".", "", "Settings that differ from the "
              "reference:", ""]
    lines += [f"- {line}" for line in difference_lines(report)]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes, a smoke run in seconds; "
                   "records nothing")
    p.add_argument("--steps", type=int, default=None, help="timed steps per contender per "
                   "round (default 3; quick 1)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 10; "
                   "quick 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per contender "
                   "(default 3; quick 1)")
    p.add_argument("--precisions", nargs="+", choices=list(PEAK_DTYPES), default=None,
                   help="default: fp32, and bf16 where the CPU has native bf16")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--max-foreign", type=float, default=None, help="redo a block of steps "
                   "when other processes used more than this many cores during it (default "
                   "0.05; off with --quick or 'inf'); see bench_step.py")
    p.add_argument("--max-wait", type=float, default=3600.0, help="seconds to wait in total "
                   "for a quiet machine before accepting noisy blocks (default 3600)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON (a Markdown "
                   "table goes next to it); not written with --quick")
    p.set_defaults(device="cpu")
    args = p.parse_args(argv)
    args.steps = args.steps or (1 if args.quick else 3)
    args.rounds = args.rounds or (2 if args.quick else 10)
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print_report(report)
    record(args, report, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
