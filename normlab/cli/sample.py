"""`normlab sample`: text from a trained run (`normlab.train.sample`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import app, finite
from normlab.cli.console import fail
from normlab.cli.names import check_run_found


@app.command()
def sample(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN_DIR", help="a finished run folder (runs/<run_id>), or under ./runs its "
                                "id, a unique prefix of it or its train.name")],
    prompt: Annotated[str, typer.Option(help="text the model continues",
                                        show_default="a newline")] = "\n",
    tokens: Annotated[int, typer.Option(min=1, help="tokens to generate (bytes for a "
                                                    "byte-level run)")] = 200,
    temperature: Annotated[float, typer.Option(
        min=0, callback=finite, help="softmax temperature; 0: the most likely token each time")
    ] = 0.8,
    top_k: Annotated[int | None, typer.Option(
        min=1, help="draw from the K most likely tokens only [default: all]")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of the draws")] = 0,
) -> None:
    """Generate text from a trained run. The run's model continues the prompt (as nanoGPT's
    sample.py), through the run's own tokenizer; the prompt and its continuation are
    printed."""
    from normlab.train.sample import SampleError, sample_run

    check_run_found(run_dir)
    try:
        text = sample_run(run_dir, prompt, tokens=tokens, temperature=temperature, top_k=top_k,
                          seed=seed)
    except SampleError as e:
        fail(str(e))
    sys.stdout.write(prompt + text + ("" if text.endswith("\n") else "\n"))
