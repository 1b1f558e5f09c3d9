"""`normlab probe-hf`: probe real checkpoints (registered on `normlab.cli.app.app`).

    normlab probe-hf --hf minilm --hf smollm2 --out probe_hf     # both, plus comparison.png
    normlab probe-hf --hf ./my-gpt2-folder --text notes.txt --seq-len 64

Prints a per-block table per model, writes `<name>.json` and `<name>.png` per model, and
`comparison.png` when several models are given. Bad input exits with status 2 and one message
(a missing package: the install command). Runs offline: `HF_HUB_OFFLINE=1` and
`TRANSFORMERS_OFFLINE=1` are set for the process unless already set.

`normlab probe --hf NAME` can reuse `probe_hf_cli(...)` below with its own options.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from normlab.cli.app import app, output_folder
from normlab.cli.console import console, err_console, fail

MAX_ROWS = 32


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if v == 0 or 1e-3 <= abs(v) < 1e5 else f"{v:.2e}"
    return str(v)


def result_table(res: dict[str, Any]) -> Table:
    from normlab.probe.metrics import column

    m, pb, drop = res["model"], res["per_block"], res.get("drop") or {}
    L = m["n_blocks"]
    title = (f"{res['checkpoint']['name']}: {m['architecture']} ({m['placement']}-{m['norm']}, "
             f"{L} blocks, d={m['d_model']}), {res['n_tokens']} tokens")
    table = Table(title=title)
    cols = [("block", None), ("depth", None)] + [(column(k), k) for k in (
        "norm", "norm_median", "norm_first", "ang_prev", "rel_update")]
    for h, _ in cols:
        table.add_column(h, justify="right", no_wrap=True)
    drop_cols = [(column(k), k) for k in ("drop_dloss", "drop_kl", "drop_hidden_cos",
                                          "drop_pooled_cos") if k in drop]
    for h, _ in drop_cols:
        table.add_column(h, justify="right", no_wrap=True)
    where = {b: j for j, b in enumerate(drop.get("drop_blocks", []))}
    rows = range(L) if L <= MAX_ROWS else sorted(
        {round(i * (L - 1) / (MAX_ROWS - 1)) for i in range(MAX_ROWS)})
    for i in rows:
        cells = [str(i), f"{(i + 1) / L:.2f}"] + [_fmt(pb[k][i]) for _, k in cols[2:]]
        cells += [_fmt(drop[k][where[i]]) if i in where else "" for _, k in drop_cols]
        table.add_row(*cells)
    return table


def summary_line(res: dict[str, Any]) -> str:
    s = res["summary"]
    parts = [f"embedding norm {_fmt(s['embed_norm'])}",
             f"block norms {_fmt(s['norm_first_block'])} -> {_fmt(s['norm_last_block'])} "
             f"(x{_fmt(s['norm_growth'])}, max/min {_fmt(s['norm_max_over_min'])})",
             f"growth exponent {_fmt(s['growth_exponent'])}",
             f"mean angular distance {_fmt(s['mean_ang_prev'])}"]
    if s.get("loss") is not None and s["loss"] == s["loss"]:
        parts.append(f"loss {_fmt(s['loss'])} ({res['data']['objective']})")
    secs = res["seconds"]
    parts.append("seconds " + ", ".join(f"{k} {v}" for k, v in secs.items()))
    return f"{res['checkpoint']['name']}: " + "; ".join(parts)


def parse_blocks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    from normlab.config import ConfigError

    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--drop-blocks: {text!r}; give block indices like 0,15,29") from None


def finished(out: Path, name: str, data: dict[str, Any], drop: bool,
             drop_blocks: list[int] | None) -> dict[str, Any] | None:
    """The result a previous run wrote to `out/<name>.json` with the same text, batches, seed
    and layer-drop settings, or None (none there, another setting, or unreadable)."""
    import json

    try:
        res = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    same = isinstance(res, dict) and all(
        res.get("data", {}).get(k) == v for k, v in data.items())
    dropped = res.get("drop") if isinstance(res, dict) else None
    if not drop:
        same_drop = not dropped
    else:
        wanted = list(drop_blocks) if drop_blocks is not None else list(
            range(res.get("model", {}).get("n_blocks", -1)))
        same_drop = bool(dropped) and list(dropped.get("drop_blocks", [])) == wanted
    return res if same and same_drop else None


def probe_hf_cli(names: list[str], text: Path | None, out: Path, *, batches: int = 2,
                 batch_size: int = 4, seq_len: int = 128, drop: bool = True,
                 drop_blocks: str | None = None, seed: int = 0, figures: bool = True
                 ) -> list[dict[str, Any]]:
    """Probe each checkpoint, print its table, write its files; a comparison figure when there
    are several. User errors exit with status 2 and one message."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from normlab.config import ConfigError
    from normlab.data import DataError
    from normlab.interop.errors import InteropError, MissingDependency
    from normlab.interop.probe_hf import run_hf_probe

    if not names:
        fail("--hf: give a checkpoint: minilm, smollm2, or a local folder / .gguf file")
    from normlab.interop.checkpoints import resolve_checkpoint

    results = []
    try:
        blocks = parse_blocks(drop_blocks)
        data = {"text": str(text) if text is not None else "shakespeare (validation works)",
                "n_batches": batches, "batch_size": batch_size, "seq_len": seq_len,
                "seed": seed}
        for i, name in enumerate(names, 1):
            done = finished(out, resolve_checkpoint(name).name, data, drop, blocks)
            if done is not None:  # a re-run: this model's probe with these settings is there
                err_console.print(f"[{i}/{len(names)}] {name}: reusing "
                                  f"{out / (done['checkpoint']['name'] + '.json')}",
                                  highlight=False)
                res = done
            else:
                err_console.print(f"[{i}/{len(names)}] probing {name} ...", highlight=False)
                res = run_hf_probe(name, text, out, n_batches=batches, batch_size=batch_size,
                                   seq_len=seq_len, drop=drop, drop_blocks=blocks, seed=seed,
                                   figures=figures)
            console.print(result_table(res))
            console.print(summary_line(res), highlight=False)
            results.append(res)
    except KeyboardInterrupt:
        kept = ", ".join(str(out / f"{r['checkpoint']['name']}.json") for r in results)
        err_console.print(f"interrupted: {len(results)} of {len(names)} model(s) finished"
                          + (f" and kept ({kept})" if kept else "") + "; run the same command "
                          "again to probe the rest (finished models are reused)",
                          highlight=False)
        raise typer.Exit(130) from None
    except (InteropError, MissingDependency, DataError, ConfigError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"--out {out}: {e}")
    written = [out / f"{r['checkpoint']['name']}.json" for r in results]
    if figures and len(results) > 1:
        from normlab.interop.figures import comparison_figure

        written.append(comparison_figure(results, out / "comparison.png"))
    console.print(f"wrote {', '.join(str(p) for p in written)} (and per-model figures)"
                      if figures else f"wrote {', '.join(str(p) for p in written)}",
                      highlight=False)
    return results


@app.command("probe-hf")
def probe_hf(
    hf: Annotated[list[str], typer.Option(
        "--hf", metavar="NAME", help="checkpoint: minilm, smollm2, a local model folder or a "
        ".gguf file (repeat to compare)")],
    text: Annotated[Path | None, typer.Option(
        help="a .txt file or folder to probe on (default: Shakespeare validation works)")
    ] = None,
    out: Annotated[Path, typer.Option(callback=output_folder,
                                      help="folder for the JSON results and figures")
                   ] = Path("probe_hf"),
    batches: Annotated[int, typer.Option(min=1, help="batches of text windows")] = 2,
    batch_size: Annotated[int, typer.Option(min=1, help="windows per batch")] = 4,
    seq_len: Annotated[int, typer.Option(min=2, help="tokens per window (the model's tokenizer)")
                       ] = 128,
    drop: Annotated[bool, typer.Option(help="layer drop: skip each block in turn")] = True,
    drop_blocks: Annotated[str | None, typer.Option(
        help="only drop these blocks, e.g. 0,15,29 (default: every block)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="masked-LM masking seed")] = 0,
    figures: Annotated[bool, typer.Option(help="write PNG figures")] = True,
) -> None:
    """Probe real checkpoints (Hugging Face, GGUF) offline. With their own tokenizers: stream
    norm by depth, angular distance between consecutive blocks, layer drop (claim C12)."""
    probe_hf_cli(hf, text, out, batches=batches, batch_size=batch_size, seq_len=seq_len,
                 drop=drop, drop_blocks=drop_blocks, seed=seed, figures=figures)
