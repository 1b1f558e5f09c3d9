"""`normlab finetune RUN_DIR`: the command over :mod:`normlab.finetune` (registered on
`normlab.cli.app.app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from normlab.cli.app import app, positive
from normlab.cli.console import console, err_console, fail
from normlab.cli.names import check_run_found
from normlab.config import ConfigError
from normlab.data.corpus import DataError
from normlab.data.genre import genre_task, naive_bayes_baseline
from normlab.finetune import FinetuneError, finetune
from normlab.train.checkpoint import CheckpointError


@app.command("finetune")
def finetune_command(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN_DIR", help="a trained run folder (runs/<run_id>), or under ./runs its "
                                "id, a unique prefix of it or its train.name")],
    task: Annotated[str, typer.Option(help="genre (3 classes) or play (36 classes)")] = "genre",
    steps: Annotated[int, typer.Option(min=1, help="optimizer steps")] = 200,
    lr: Annotated[float, typer.Option(callback=positive, help="peak AdamW learning rate")
                  ] = 3e-4,
    batch_size: Annotated[int, typer.Option(min=1, help="passages per step")] = 32,
    warmup: Annotated[int, typer.Option(min=0, help="linear warmup steps (then cosine decay)")
                      ] = 20,
    seed: Annotated[int, typer.Option(min=0, help="head init and batch order")] = 0,
    freeze: Annotated[bool, typer.Option(help="train only the linear head (a probe)")] = False,
    pooling: Annotated[str, typer.Option(help="mean over positions, or the last position")
                       ] = "mean",
    from_init: Annotated[bool, typer.Option(
        help="the run's architecture at init instead of its checkpoint (no pretraining)")
    ] = False,
    passage_bytes: Annotated[int, typer.Option(min=2, help="bytes per passage")] = 256,
    test_max: Annotated[int | None, typer.Option(
        min=1, help="evaluate on at most this many evenly spaced test passages (default: all)")
    ] = None,
    device: Annotated[str, typer.Option(help="auto|cpu|cuda|mps")] = "auto",
    baseline: Annotated[bool, typer.Option(help="also print the n-gram naive Bayes baseline")
                        ] = True,
) -> None:
    """Fine-tune a trained run on a Shakespeare task. The genre (or play-id) task: prints the
    test accuracy next to a character-trigram naive Bayes baseline; results are cached in the
    run."""
    check_run_found(run_dir)
    try:
        if device not in ("auto", "cpu", "cuda", "mps"):
            raise FinetuneError(f"--device: one of auto, cpu, cuda, mps, got {device!r}")
        result = finetune(run_dir, task, steps=steps, lr=lr, batch_size=batch_size,
                          warmup=warmup, seed=seed, pooling=pooling, freeze=freeze,
                          from_init=from_init, passage_bytes=passage_bytes,
                          test_max=test_max, device=device,
                          progress=lambda msg: err_console.print(f"fine-tuning: {msg}",
                                                                 highlight=False))
        nb = (naive_bayes_baseline(genre_task(task, passage_bytes=passage_bytes),
                                   test_max=test_max) if baseline else None)
    except (FinetuneError, ConfigError, DataError, CheckpointError) as e:
        fail(str(e))

    m = result["model"]
    what = "at init" if result["from_init"] else f"step {result['checkpoint_step']}"
    table = Table(title=f"{task} task: {m['placement']} L{m['n_blocks']} d{m['d_model']} "
                        f"({what}), {steps} steps, lr {lr:g}"
                        f"{', head only' if freeze else ''}")
    for col in ("model", "test acc", "train acc", "balanced", "test loss"):
        table.add_column(col, justify="left" if col == "model" else "right")

    def pct(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else "-"

    table.add_row("fine-tuned" + (" (cached)" if result["cached"] else ""),
                  pct(result["test_accuracy"]), pct(result["train_accuracy"]),
                  pct(result["balanced_test_accuracy"]), pct(result["test_loss"]))
    if nb is not None:
        table.add_row(nb["model"], pct(nb["test_accuracy"]), pct(nb["train_accuracy"]),
                      pct(float(np.mean(list(nb["per_class_test_accuracy"].values())))), "-")
    table.add_row("chance / majority", pct(result["chance"]), "", pct(result["majority"]), "")
    console.print(table)
    if result["outcome"] != "completed":
        console.print(f"outcome: {result['outcome']} after {result['steps_done']} steps",
                          highlight=False)
    console.print(f"result: {result['path']} ({result['time_s']:.1f} s to compute)",
                      highlight=False)
