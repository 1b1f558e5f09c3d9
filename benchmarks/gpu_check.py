#!/usr/bin/env python
"""Training throughput of normlab's main placements on a CUDA GPU, at GPT-2 small's shape.

Each placement (default: pre, post, sandwich, deepnorm, mix) is built on normlab's one code path
at GPT-2 small's shape (12 blocks, width 768, 12 heads, context 1024, GPT-2's vocabulary of
50,257 tokens, tied head, learned positions, exact-GELU MLP of width 4d), trained with bf16
autocast (fp32 master weights), fused attention (`scaled_dot_product_attention`), fused AdamW and
`torch.compile`, on random tokens, for a fixed number of steps after untimed warm-up steps (the
first of which compiles). Printed per placement: the median step time, tokens/s, and MFU (PaLM's
accounting, `normlab.train.perf`: model FLOPs a token over the peak) against two peaks: the bf16
GEMM peak measured in the same run, and the device's nominal dense bf16 peak when its name is in
`NOMINAL_BF16_TFLOPS`.

Recorded in `--out` (default `benchmarks/results/gpu_check.json`) and a Markdown table next to it,
with the device's name, the torch and CUDA versions, the date and the commit (`gpu_meta.py`).
On a machine without a CUDA GPU it says so and exits 0: nothing is checked there.

    python benchmarks/gpu_check.py                    # every placement; writes benchmarks/results/
    python benchmarks/gpu_check.py --placements pre   # one
    python benchmarks/gpu_check.py --smoke            # a tiny model on the CPU: the script's own
                                                      # logic in seconds (the test runs this)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # run from a checkout without installing
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from gpu_meta import NO_GPU, meta_line, run_meta  # noqa: E402

from normlab.config import ModelConfig  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.placements import PLACEMENTS as ALL_PLACEMENTS  # noqa: E402
from normlab.train.optim import param_groups  # noqa: E402
from normlab.train.perf import gemm_peak_tflops, train_flops_per_token  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
PLACEMENTS = ("pre", "post", "sandwich", "deepnorm", "mix")
# dense bf16 tensor-core peaks from the vendors' data sheets (TFLOP/s, without sparsity)
# (an H100 named without PCIe or NVL is the SXM part: "NVIDIA H100 80GB HBM3")
NOMINAL_BF16_TFLOPS = {"H200": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.4,
                       "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10G": 70.0}


# GPT-2 small's size (Radford et al. 2019) and the smoke run's, as ModelConfig fields
GPT2_SMALL = {"n_blocks": 12, "d_model": 768, "n_heads": 12, "max_seq_len": 1024,
              "vocab_size": 50257}
SMOKE = {"n_blocks": 2, "d_model": 32, "n_heads": 2, "max_seq_len": 16, "vocab_size": 64}
BATCH, SMOKE_BATCH = 8, 2


def shape_words(size: dict[str, int], batch: int) -> str:
    return (f"{size['n_blocks']} blocks, width {size['d_model']}, {size['n_heads']} heads, "
            f"context {size['max_seq_len']}, vocabulary {size['vocab_size']:,}, batch {batch}")


def nominal_peak(device_name: str) -> float | None:
    """The data sheet's dense bf16 peak of a device whose name contains a key of the table (the
    longest key first: "H100 PCIe" before "H100")."""
    for key in sorted(NOMINAL_BF16_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return NOMINAL_BF16_TFLOPS[key]
    return None


def model_config(placement: str, size: dict[str, int]) -> ModelConfig:
    return ModelConfig(placement=placement, **size, tie_embeddings=True, positions="learned",
                       mlp="gelu")


def time_placement(placement: str, size: dict[str, int], batch: int, device: torch.device, *,
                   steps: int, warmup: int, compile_model: bool) -> dict:
    """Train `steps` timed steps (after `warmup` untimed ones) and return the step times."""
    cfg = model_config(placement, size)
    seq_len, vocab = size["max_seq_len"], size["vocab_size"]
    model = build_model(cfg, seed=0).to(device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95),
                                  fused=True)
    net = torch.compile(model) if compile_model else model
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    y = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = net(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # also waits for the step, as a training loop's log would

    t0 = time.perf_counter()
    first_loss = step()  # compiles
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        last_loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    return {"placement": placement, "params": params,
            "first_step_s": first, "step_s": statistics.median(times), "steps": steps,
            "first_loss": first_loss, "last_loss": last_loss,
            "flops_per_token": train_flops_per_token(cfg, seq_len)}


def markdown(report: dict) -> str:
    """The recorded run as a Markdown table, with what it ran on."""
    nominal = report["bf16_peak_nominal_tflops"]
    lines = [f"# Placements on a GPU at GPT-2 small's shape ({report['date']})", "",
             meta_line(report) + ".", "",
             f"{shape_words(report['model'], report['batch'])}; bf16 autocast, fused AdamW, "
             f"{'torch.compile' if report['compile'] else 'eager'}; median of "
             f"{report['steps']} timed steps after {report['warmup']} untimed ones (the first "
             "compiles). bf16 GEMM peak measured in the same run: "
             f"{report['bf16_gemm_peak_measured_tflops']:.1f} TFLOP/s; data sheet: "
             + (f"{nominal:.1f} TFLOP/s." if nominal else "unknown for this device."), "",
             "| placement | params | first step | step | tokens/s | MFU (measured peak) "
             "| MFU (data sheet) | loss first / last |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        mfu_nominal = f"{r['mfu_nominal']:.1%}" if r["mfu_nominal"] is not None else "-"
        lines.append(f"| {r['placement']} | {r['params']:,} | {r['first_step_s']:.1f} s | "
                     f"{r['step_s'] * 1e3:.1f} ms | {r['tokens_per_s']:,.0f} | "
                     f"{r['mfu_measured']:.1%} | {mfu_nominal} | "
                     f"{r['first_loss']:.3f} / {r['last_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--placements", nargs="+", default=list(PLACEMENTS),
                   choices=[n for n in ALL_PLACEMENTS if n != "custom"], metavar="PLACEMENT",
                   help=f"placements to time (default: {' '.join(PLACEMENTS)})")
    p.add_argument("--steps", type=int, default=20, help="timed steps per placement (20)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps first, the first compiling (5)")
    p.add_argument("--batch", type=int, default=None, help="sequences a step (8)")
    p.add_argument("--no-compile", action="store_true", help="eager, without torch.compile")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny model on the CPU, eager, 2 steps: checks the script, records "
                        "nothing")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="results JSON; a Markdown table goes next to it (.md)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1")

    if args.smoke:
        device, size, batch = torch.device("cpu"), SMOKE, SMOKE_BATCH
        args.steps, args.warmup, compile_model = 2, 1, False
    elif not torch.cuda.is_available():
        print(f"gpu_check.py: {NO_GPU} (normlab's GPU path is untested here); run it where "
              "`torch.cuda.is_available()` is true.")
        return 0
    else:
        device, size, batch = torch.device("cuda"), GPT2_SMALL, BATCH
        compile_model = not args.no_compile
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.batch is not None:
        batch = args.batch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run)"
    measured = gemm_peak_tflops(torch.bfloat16, device, sizes=(
        (4096, 8192) if device.type == "cuda" else (256,)), seconds=(1.0 if device.type == "cuda"
                                                                      else 0.05))
    nominal = nominal_peak(name)
    print(f"{name}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"{shape_words(size, batch)}; bf16 autocast, "
          "fused AdamW, "
          f"{'torch.compile' if compile_model else 'eager'}")
    print(f"bf16 GEMM peak measured {measured:.1f} TFLOP/s"
          + (f", nominal {nominal:.1f}" if nominal else ", nominal unknown for this device"))
    rows = []
    print(f"{'placement':<10} {'params':>12} {'first step':>11} {'step':>9} {'tokens/s':>11} "
          f"{'MFU meas.':>10} {'MFU nom.':>9}")
    for placement in args.placements:
        r = time_placement(placement, size, batch, device, steps=args.steps, warmup=args.warmup,
                           compile_model=compile_model)
        if device.type == "cuda":  # the placement's model and optimizer state are gone
            torch.cuda.empty_cache()
        tokens = batch * size["max_seq_len"] / r["step_s"]
        flops = tokens * r["flops_per_token"] / 1e12
        r |= {"tokens_per_s": tokens, "mfu_measured": flops / measured,
              "mfu_nominal": flops / nominal if nominal else None}
        rows.append(r)
        print(f"{placement:<10} {r['params']:>12,} {r['first_step_s']:>10.1f}s "
              f"{r['step_s'] * 1e3:>7.1f}ms {tokens:>11,.0f} {r['mfu_measured']:>10.1%} "
              + (f"{r['mfu_nominal']:>9.1%}" if nominal else f"{'-':>9}"))
    if not args.smoke:
        report = {**run_meta(device), "model": size, "batch": batch,
                  "compile": compile_model, "steps": args.steps, "warmup": args.warmup,
                  "bf16_gemm_peak_measured_tflops": measured,
                  "bf16_peak_nominal_tflops": nominal, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(report))
        print(f"written: {args.out} and {args.out.with_suffix('.md')}")
    bad = [r["placement"] for r in rows
           if not all(math.isfinite(r[k]) for k in ("first_loss", "last_loss"))]
    if bad:
        print(f"gpu_check.py: non-finite loss for {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
