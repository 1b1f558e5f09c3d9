"""`normlab finetune RUN_DIR`: the command over :mod:`normlab.finetune` (registered on
`normlab.cli.app.app`). Its options and ``--config FILE.yaml`` build the `FinetuneConfig`; the
defaults are the config's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from normlab.cli.app import app, positive
from normlab.cli.console import console, err_console, fail
from normlab.cli.names import check_run_found
from normlab.config import ConfigError, load_yaml
from normlab.data.corpus import DataError
from normlab.data.genre import genre_task, naive_bayes_baseline
from normlab.finetune import FinetuneConfig, FinetuneError, finetune
from normlab.train.checkpoint import CheckpointError


def _default(name: str) -> str:
    """The help text's note of a setting's default: `FinetuneConfig`'s, its one home."""
    value = FinetuneConfig.model_fields[name].default
    return f"  [default: {str(value).lower() if isinstance(value, bool) else value}]"


@app.command("finetune")
def finetune_command(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN_DIR", help="a trained run folder (runs/<run_id>), or under ./runs its "
                                "id, a unique prefix of it or its train.name")],
    config: Annotated[Path | None, typer.Option(
        "--config", metavar="FILE.yaml", help="fine-tuning settings: a YAML mapping of "
        "FinetuneConfig fields (docs/finetune.md); the options below that are given override "
        "it")] = None,
    task: Annotated[str | None, typer.Option(
        help="genre (3 classes) or play (36 classes)" + _default("task"))] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="optimizer steps" + _default("steps"))
                     ] = None,
    lr: Annotated[float | None, typer.Option(
        callback=positive, help="peak AdamW learning rate" + _default("lr"))] = None,
    batch_size: Annotated[int | None, typer.Option(
        min=1, help="passages per step" + _default("batch_size"))] = None,
    warmup: Annotated[int | None, typer.Option(
        min=0, help="linear warmup steps (then cosine decay)" + _default("warmup"))] = None,
    seed: Annotated[int | None, typer.Option(
        min=0, help="head init and batch order" + _default("seed"))] = None,
    freeze: Annotated[bool | None, typer.Option(
        help="train only the linear head (a probe)" + _default("freeze"))] = None,
    pooling: Annotated[str | None, typer.Option(
        help="mean over positions, or the last position" + _default("pooling"))] = None,
    from_init: Annotated[bool, typer.Option(
        help="the run's architecture at init instead of its checkpoint (no pretraining)")
    ] = False,
    passage_bytes: Annotated[int | None, typer.Option(
        min=2, help="bytes per passage" + _default("passage_bytes"))] = None,
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
    given = {"task": task, "steps": steps, "lr": lr, "batch_size": batch_size,
             "warmup": warmup, "seed": seed, "freeze": freeze, "pooling": pooling,
             "passage_bytes": passage_bytes, "test_max": test_max}
    try:
        if device not in ("auto", "cpu", "cuda", "mps"):
            raise FinetuneError(f"--device: one of auto, cpu, cuda, mps, got {device!r}")
        settings = load_yaml(config) if config is not None else {}
        cfg = FinetuneConfig.parse(
            settings | {k: v for k, v in given.items() if v is not None})
        result = finetune(run_dir, cfg, from_init=from_init, device=device,
                          progress=lambda msg: err_console.print(f"fine-tuning: {msg}",
                                                                 highlight=False))
        nb = (naive_bayes_baseline(genre_task(cfg.task, passage_bytes=cfg.passage_bytes,
                                              gap=cfg.gap, val_fraction=cfg.val_fraction),
                                   test_max=cfg.test_max) if baseline else None)
    except (FinetuneError, ConfigError, DataError, CheckpointError) as e:
        fail(str(e))

    m = result["model"]
    what = "at init" if result["from_init"] else f"step {result['checkpoint_step']}"
    table = Table(title=f"{cfg.task} task: {m['placement']} L{m['n_blocks']} d{m['d_model']} "
                        f"({what}), {cfg.steps} steps, lr {cfg.lr:g}"
                        f"{', head only' if cfg.freeze else ''}")
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
