"""The step times behind C9's and C10's cost estimates (docs/study.md, C9 and C10).

    python scripts/step_times.py [--threads 1] [--only c10|c9]

prints one JSON object: seconds per step (or per run) of
- a pretraining step of the long profile's shape (6 blocks, width 64, batch 16 x 64 bytes);
- a C10 fine-tuning step (the same model with a linear head, all weights trained, a batch of 16
  256-byte passages read in 4 windows of 64 bytes), and a whole fine-tuning run's fixed part
  (standardization and the evaluation of its test, training and validation passages);
- a C10 frozen linear probe run (the body's features of every training passage computed once,
  then a head trained for the long profile's 1000 steps, then the same evaluation);
- a step of a 6-block byte-level decoder of width 1024 (about 76M parameters: the size of the
  language models at which Post-LN was compared with Pre-LN, C9) on 256-byte sequences.

Each is timed in CPU seconds of this process (`time.process_time`) as well as wall seconds: on
a machine shared with other work the wall time measures the neighbours, while with one thread
the CPU time is what the step costs a core. Nothing is written; no study run is started.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import torch


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float], n: int = 1) -> dict[str, float]:
    wall, cpu = _clock()
    return {"wall_s": (wall - t[0]) / n, "cpu_s": (cpu - t[1]) / n}


def _model(width: int, heads: int, blocks: int, seq: int, placement: str = "pre"):
    from normlab.config import load_run_config
    from normlab.nn import build_model

    cfg = load_run_config(None, [f"model.n_blocks={blocks}", f"model.d_model={width}",
                                 f"model.n_heads={heads}", f"model.max_seq_len={seq}",
                                 f"model.placement={placement}", f"data.seq_len={seq}"])
    return build_model(cfg.model, seed=0)


def pretrain_step(width: int, heads: int, blocks: int, seq: int, batch: int, steps: int,
                  warmup: int = 2) -> dict[str, Any]:
    """Forward, backward and AdamW of a decoder on random bytes (`normlab.study.runner.
    time_steps`'s loop), per step."""
    model = _model(width, heads, blocks, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 256, (batch, seq))
    for i in range(warmup + steps):
        if i == warmup:
            t = _clock()
        model(idx, idx).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"params": model.num_params(), "tokens_per_step": batch * seq, **_since(t, steps)}


def finetune_step(steps: int, warmup: int = 2) -> dict[str, Any]:
    """C10's fine-tuning step at the long profile's sizes (`normlab.finetune.finetune_model`'s
    loop without its data): 16 passages of 256 bytes, 4 windows of 64, all weights trained."""
    import torch.nn.functional as F

    from normlab.finetune import SequenceClassifier

    clf = SequenceClassifier(_model(64, 2, 6, 64), 3, window=64)
    opt = torch.optim.AdamW(clf.parameters(), lr=1e-3)
    idx = torch.randint(0, 256, (16, 256))
    y = torch.randint(0, 3, (16,))
    for i in range(warmup + steps):
        if i == warmup:
            t = _clock()
        loss = F.cross_entropy(clf(idx), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(clf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return _since(t, steps)


def finetune_runs(steps: int) -> dict[str, Any]:
    """Two short fine-tuning runs on the genre task with the long profile's evaluation sizes
    (`normlab.finetune.finetune_model`), `steps` and 2 `steps` apart: their difference is
    `steps` training steps, the rest (copy, standardization, evaluation) the run's fixed part;
    and a frozen linear probe run of the long profile's 1000 steps."""
    from normlab.data.genre import genre_task
    from normlab.finetune import finetune_model

    task = genre_task("genre", passage_bytes=256, val_fraction=0.1)
    model = _model(64, 2, 6, 64)
    kw = {"batch_size": 16, "warmup": 1, "window": 64, "test_max": 512, "val_max": 512,
          "train_eval_max": 256, "standardize": 512, "device": "cpu", "lr": 1e-3}
    out: dict[str, Any] = {"n_train": len(task.train_y)}
    for n in (steps, 2 * steps):
        t = _clock()
        finetune_model(model, data=task, steps=n, **kw)
        out[f"run_{n}_steps"] = _since(t)
    short, long_ = out[f"run_{steps}_steps"], out[f"run_{2 * steps}_steps"]
    out["step"] = {k: (long_[k] - short[k]) / steps for k in short}
    out["fixed"] = {k: short[k] - steps * out["step"][k] for k in short}
    t = _clock()
    res = finetune_model(model, data=task, steps=1000, freeze=True, **(kw | {"warmup": 100}))
    out["probe_run_1000_steps"] = _since(t) | {"train_time_s": res["train_time_s"],
                                               "trainable_params": res["trainable_params"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=("c9", "c10"), default=None)
    ap.add_argument("--steps", type=int, default=10, help="timed steps of each loop")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from normlab.train.machine import cpu_model

    out: dict[str, Any] = {"cpu": cpu_model(), "threads": torch.get_num_threads(),
                           "torch": torch.__version__, "python": platform.python_version()}
    if args.only in (None, "c10"):
        out["pretrain_step_6x64"] = pretrain_step(64, 2, 6, 64, 16, 4 * args.steps)
        out["finetune_step_6x64"] = finetune_step(args.steps)
        out["finetune_runs_6x64"] = finetune_runs(args.steps)
    if args.only in (None, "c9"):
        out["pretrain_step_6x1024"] = pretrain_step(1024, 16, 6, 256, 4, max(2, args.steps // 5),
                                                    warmup=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
