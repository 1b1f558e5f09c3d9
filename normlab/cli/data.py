"""`normlab prepare`: tokenize a corpus into token files (`normlab.data.tokenfiles`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import app, output_folder, positive
from normlab.cli.console import err_console, fail


@app.command()
def prepare(
    source: Annotated[str, typer.Argument(
        metavar="SOURCE", help="shakespeare, a .txt/.jsonl/.parquet file, or a folder of them")],
    out: Annotated[Path, typer.Option(
        "--out", callback=output_folder, help="folder for train.bin, val.bin, meta.json and "
        "tokenizer.json")],
    tokenizer: Annotated[str, typer.Option(
        help="byte, bpe:N (trained on the training split), or a tokenizer.json / Hugging Face "
             "tokenizer folder")] = "byte",
    val_fraction: Annotated[float, typer.Option(
        max=0.5, callback=positive, help="share of the bytes held out, as whole works")
    ] = 0.1,
    split_seed: Annotated[int, typer.Option(min=0, help="seed of the choice of held-out works")
                          ] = 0,
    text_field: Annotated[str, typer.Option(
        help="the field of a .jsonl/.parquet record that holds its text")] = "text",
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """Tokenize a corpus into token files. Splits SOURCE by whole works as a run does, trains
    the tokenizer on the training works (bpe:N), and writes train.bin and val.bin in nanoGPT's
    layout with a meta.json into --out, which `data.source` then names. Resumable: run it again
    after an interruption and it continues."""
    from normlab.data import DataError
    from normlab.data.tokenfiles import prepare as run_prepare

    def say(msg: str) -> None:
        if not quiet:
            err_console.print(msg, highlight=False, markup=False)

    try:
        meta = run_prepare(source, tokenizer, out, val_fraction=val_fraction, seed=split_seed,
                           text_field=text_field, progress=not quiet, say=say)
    except DataError as e:
        fail(str(e))
    print(f"{out}: train {meta['train_tokens']} tokens, val {meta['val_tokens']} tokens, "
          f"vocabulary {meta['vocab_size']} ({meta['tokenizer_spec']}); train on it with "
          f"--set data.source={out}")
