"""`normlab sample`: text from a trained run (`normlab.train.sample`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import app, finite
from normlab.cli.console import err_console, fail
from normlab.cli.names import check_run_found


@app.command()
def sample(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN[@STEP]", help="a run folder (runs/<run_id>), or under ./runs its id, a "
        "unique prefix of it or its train.name; @STEP: the weights of that step (its latest "
        "checkpoint's, or one kept with train.keep_checkpoints) [default: the latest "
        "checkpoint, of a run not finished too]")],
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
    printed, then (on stderr) which weights wrote it."""
    from normlab.train.rundir import RunFolderError, split_run_step
    from normlab.train.sample import SampleError, sample_with_source

    try:
        check_run_found(split_run_step(run_dir)[0])
    except RunFolderError as e:
        fail(str(e))
    try:
        text, source = sample_with_source(run_dir, prompt, tokens=tokens,
                                          temperature=temperature, top_k=top_k, seed=seed)
    except SampleError as e:
        fail(str(e))
    sys.stdout.write(prompt + text + ("" if text.endswith("\n") else "\n"))
    sys.stdout.flush()  # the text first, then where it came from
    err_console.print(f"sampled from {source}", highlight=False)
