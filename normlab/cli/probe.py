"""`normlab probe`: the command over the probe library (registered on `normlab.cli.app.app`).

    normlab probe --placement post --blocks 12 --width 64          # one model at init
    normlab probe --placements pre,post --blocks 6,12,24 --seeds 3  # depth sweep with fits
    normlab probe --checkpoint runs/pre-L6-d256-0123abcd           # a trained run

Prints tables, writes `probe.json` (every number) and PNG figures to `--out`. Bad input exits with
status 2 and one message naming what is wrong.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.table import Table

from normlab.cli.app import SetOpt, app, finite, output_folder, positive
from normlab.cli.console import console, err_console, fail
from normlab.cli.names import check_run_found, did_you_mean
from normlab.config import (
    MAX_BLOCKS,
    PLACEMENTS,
    ConfigError,
    ModelConfig,
    byte_vocab_problem,
    load_model_config,
)
from normlab.data import DataError
from normlab.placements import USER
from normlab.probe import metrics
from normlab.probe.suite import PROBES, finite_or_none, parse_probes
from normlab.train.checkpoint import CheckpointError

PER_BLOCK_COLUMNS = metrics.per_block_columns()  # (key, header), from the table of metrics
SUMMARY_KEYS = metrics.summary_keys()
SWEEP_KEYS = metrics.sweep_columns()
MAX_ROWS = 24

def split_list(text: str | None, name: str, cast=str) -> list[Any]:
    """`"6,12,24"` -> [6, 12, 24]; errors name the option."""
    if text is None:
        return []
    out = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(cast(item))
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not a valid {cast.__name__}; give a comma "
                              f"separated list, e.g. {name} 6,12,24") from None
    return out


def load_checkpoint_model(given: Path):
    """`(run_config, model, run folder, step)` of a run given as `RUN` (its latest checkpoint,
    step None) or `RUN@STEP`, with errors that name the problem."""
    from normlab.train import RunFolderError, load_trained_model
    from normlab.train.rundir import find_run, split_run_step

    try:  # a run's id, a unique prefix of it, or its name, under ./runs; then @STEP
        run_dir, step = split_run_step(given)
        check_run_found(run_dir, "--checkpoint ")
        run_dir = find_run(run_dir)
    except RunFolderError as e:
        raise CheckpointError(f"--checkpoint {e}") from None
    if not run_dir.exists():
        raise CheckpointError(f"--checkpoint {run_dir}: no such folder")
    if not run_dir.is_dir():
        raise CheckpointError(f"--checkpoint {run_dir}: not a folder; give a run folder "
                              "(runs/<run_id>)")
    try:
        return (*load_trained_model(run_dir, step=step), run_dir, step)
    except RunFolderError as e:
        raise CheckpointError(f"--checkpoint {e}") from None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if v == 0 or 1e-2 <= abs(v) < 1e4:
            return f"{v:.4g}"
        return f"{v:.2e}"
    return str(v)


def per_block_table(result: dict[str, Any], title: str) -> Table:
    pb = result["per_block"]
    cols = [(k, h) for k, h in PER_BLOCK_COLUMNS if k in pb]
    L = result["model"]["n_blocks"]
    rows = list(range(L))
    if L > MAX_ROWS:
        rows = sorted({round(i * (L - 1) / (MAX_ROWS - 1)) for i in range(MAX_ROWS)})
        title += f" (showing {len(rows)} of {L} blocks; all in probe.json)"
    table = Table(title=title)
    table.add_column("block", justify="right")
    for _, h in cols:
        table.add_column(h, justify="right", no_wrap=True)
    for i in rows:
        cells = [str(i)]
        for k, _ in cols:
            vals = pb[k]
            cells.append(_fmt(vals[i]) if i < len(vals) else "")
        table.add_row(*cells)
    return table


def summary_table(runs: list[dict[str, Any]]) -> Table:
    if len(runs) == 1:
        s = runs[0]["result"]["summary"]
        table = Table(title="summary (+- spread over batches)")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k in SUMMARY_KEYS:
            if k in s:
                std = s.get(f"{k}_std")
                extra = f" +- {_fmt(std)}" if isinstance(std, float) and std == std else ""
                table.add_row(k, _fmt(s[k]) + extra)
        return table
    keys = [(k, h) for k, h in SWEEP_KEYS if any(k in r["result"]["summary"] for r in runs)]
    table = Table(title="summary per model (mean over batches)")
    for h in ("placement", "L", "seed", *(h for _, h in keys)):
        table.add_column(h, justify="left" if h == "placement" else "right", no_wrap=True)
    for r in runs:
        s = r["result"]["summary"]
        table.add_row(r["placement"], str(r["n_blocks"]), str(r["seed"]),
                      *[_fmt(s.get(k, float("nan"))) for k, _ in keys])
    return table


def fits_table(fits: dict[str, dict[str, dict]], by_depth: dict[str, dict]) -> Table:
    table = Table(title="against depth at init: log-log slope b of metric ~ L^b (95% intervals)")
    for h in ("placement", "metric", "slope", "t-interval", "bootstrap over seeds", "points"):
        table.add_column(h, justify="left" if h in ("placement", "metric") else "right")
    for p, per in fits.items():
        for metric, f in per.items():
            lo, hi = f["ci95_t"]
            blo, bhi = f["ci95_boot"]
            table.add_row(p, metric, _fmt(f["slope"]), f"[{_fmt(lo)}, {_fmt(hi)}]",
                          f"[{_fmt(blo)}, {_fmt(bhi)}]", str(f["n_points"]))
        g = by_depth.get(p, {}).get("growth_exponent")
        if g:
            text = ", ".join(f"L={L}: {_fmt(v['mean'])}" for L, v in g.items())
            table.add_row(p, "growth_exponent (per L)", "", "", "", text)
    return table


@app.command()
def probe(
    checkpoint: Annotated[list[Path] | None, typer.Option(
        help="a trained run folder (runs/<run_id>; or under ./runs its id, a unique prefix "
        "of it or its train.name) to probe instead of a model at init; one per command; "
        "RUN@STEP: the weights of that step (its latest checkpoint's, or one kept with "
        "train.keep_checkpoints) [default: the latest checkpoint]")] = None,
    placement: Annotated[str | None, typer.Option(help=f"one of {', '.join(PLACEMENTS)}")
                         ] = None,
    placements: Annotated[str | None, typer.Option(
        help="comma separated placements to compare, e.g. pre,post")] = None,
    blocks: Annotated[str | None, typer.Option(
        help="number of blocks L, or a comma separated list for a depth sweep (6,12,24)")] = None,
    width: Annotated[int | None, typer.Option(min=2, help="d_model")] = None,
    heads: Annotated[int | None, typer.Option(min=1, help="attention heads")] = None,
    norm: Annotated[str | None, typer.Option(help="layernorm|rmsnorm|dyt|derf|identity|batchnorm")
                    ] = None,
    kind: Annotated[str | None, typer.Option(help="decoder|encoder")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file with model fields")] = None,
    set_: SetOpt = None,
    seeds: Annotated[int, typer.Option(
        min=1, help="models per placement and depth (seeds 0..n-1)")] = 1,
    probes: Annotated[str | None, typer.Option(
        help=f"comma separated, from {','.join(PROBES)}; 'all'; default: all but skip and "
             "update")
    ] = None,
    batches: Annotated[int, typer.Option(min=1, help="held-out batches per model")] = 4,
    batch_size: Annotated[int, typer.Option(min=1, help="sequences per batch")] = 8,
    seq_len: Annotated[int | None, typer.Option(
        min=2, help="tokens per sequence (default 64, or the run's seq_len for --checkpoint)")
    ] = None,
    text: Annotated[Path | None, typer.Option(
        help="a .txt file or folder to probe on (default: the Shakespeare validation split)")
    ] = None,
    out: Annotated[Path, typer.Option(callback=output_folder,
                                      help="folder for probe.json and the figures")
                   ] = Path("probe_out"),
    perturb_eps: Annotated[float, typer.Option(
        callback=positive, help="perturbation: relative size eps")] = 0.01,
    perturb_draws: Annotated[int, typer.Option(min=1, help="perturbation: random draws")] = 2,
    update_steps: Annotated[int, typer.Option(min=1, help="update size: optimizer steps K")
                            ] = 30,
    update_lr: Annotated[float, typer.Option(
        callback=positive, help="update size: AdamW learning rate")] = 1e-3,
    update_warmup: Annotated[int, typer.Option(min=0, help="update size: linear warmup steps")
                             ] = 0,
    drop_threshold: Annotated[float, typer.Option(
        min=0, callback=finite,
        help="effective depth: a block counts if dropping it costs more (nats)")] = 0.01,
    figures: Annotated[bool, typer.Option(help="write PNG figures")] = True,
    hf: Annotated[list[str] | None, typer.Option(
        "--hf", metavar="NAME", help="a real checkpoint instead: minilm, smollm2, a local "
        "Hugging Face folder or .gguf file (repeat to compare; see normlab probe-hf)")] = None,
) -> None:
    """Probe stability and effective depth of a model. Stream, gradients, merge test, layer
    drop, logit lens, perturbation and update size, at init (depth sweeps with log-log fits) or
    on a trained run."""
    if checkpoint and len(checkpoint) > 1:  # click would keep the last one, silently
        fail(f"--checkpoint is given {len(checkpoint)} times; a probe reads one trained run: "
             "run `normlab probe --checkpoint RUN --out DIR` once per run, each with its own "
             "--out (or compare placements at init with --placements)")
    checkpoint = checkpoint[0] if checkpoint else None
    if hf:
        from normlab.cli.interop import probe_hf_cli

        model_options = {"--checkpoint": checkpoint, "--placement": placement,
                         "--placements": placements, "--blocks": blocks, "--width": width,
                         "--heads": heads, "--norm": norm, "--kind": kind, "--config": config,
                         "--set": set_, "--probes": probes}
        given = [name for name, value in model_options.items() if value]
        if given or seeds != 1:
            given += ["--seeds"] * (seeds != 1)
            fail(f"--hf probes a real checkpoint; {', '.join(given)} choose a normlab "
                        "model and do not apply to it (drop them, or drop --hf)")
        probe_hf_cli(hf, text, out, batches=batches, batch_size=batch_size,
                     seq_len=seq_len or 128, figures=figures)
        return
    try:
        spec = _resolve(checkpoint, placement, placements, blocks, width, heads, norm, kind,
                        config, set_, seeds, probes, batches, batch_size, seq_len, text)
        report = _run(spec, dict(perturb_eps=perturb_eps, perturb_draws=perturb_draws,
                                 update_steps=update_steps, update_lr=update_lr,
                                 update_warmup=update_warmup, drop_threshold=drop_threshold),
                      parts=out / "parts")
    except (ConfigError, DataError, CheckpointError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        kept = len(list((out / "parts").glob("*.json"))) if (out / "parts").is_dir() else 0
        err_console.print(f"stopped; {kept} model(s) kept in {out / 'parts'}: the same command "
                          "probes only the rest", highlight=False)
        raise typer.Exit(130) from None
    _print(report)
    _write(report, out, figures)


# --- steps of the command ------------------------------------------------------------------

def _resolve(checkpoint, placement, placements, blocks, width, heads, norm, kind, config, sets,
             seeds, probes, n_batches, batch_size, seq_len, text) -> dict[str, Any]:
    try:
        chosen = parse_probes(probes)
    except ConfigError as e:
        unknown = [p.strip() for p in (probes or "").split(",") if p.strip() not in PROBES]
        hint = did_you_mean(unknown[0], [*PROBES, "default", "all"]) if unknown else ""
        raise ConfigError(f"{e}{hint}") from None
    names = split_list(placement, "--placement") + split_list(placements, "--placements")
    names = list(dict.fromkeys(names))
    depths = split_list(blocks, "--blocks", int)
    bad = [p for p in names if p not in PLACEMENTS and p not in USER]
    if bad and not any(s.strip().startswith("model.placement_file=") for s in sets or []):
        raise ConfigError(f"placement: {', '.join(map(repr, bad))} is not a placement"
                          f"{did_you_mean(bad[0], [*PLACEMENTS, *USER])}; choose from "
                          f"{', '.join(PLACEMENTS)}, or define your own in a file given with "
                          "--set model.placement_file=FILE")
    if any(not 1 <= L <= MAX_BLOCKS for L in depths):
        raise ConfigError(f"--blocks: depths must be from 1 to {MAX_BLOCKS}")
    spec: dict[str, Any] = {"probes": chosen, "n_batches": n_batches, "batch_size": batch_size,
                            "text": str(text) if text is not None else None}
    if checkpoint is not None:
        given = [o for o, v in (("--placement(s)", names), ("--blocks", depths),
                                ("--width", width), ("--heads", heads), ("--norm", norm),
                                ("--kind", kind), ("--config", config), ("--set", sets)) if v]
        if given:
            raise ConfigError(f"--checkpoint probes the run's own model; drop {', '.join(given)}")
        if seeds != 1:
            raise ConfigError("--seeds: a checkpoint is one trained model; drop --seeds")
        from normlab.train.checkpoint import weights_note

        run_cfg, model, run_dir, step = load_checkpoint_model(checkpoint)
        err_console.print(f"probing {weights_note(run_dir, step)}", highlight=False)
        data = run_cfg.data
        if data.task is not None:
            raise ConfigError(f"--checkpoint {checkpoint}: trained on data.task={data.task}; the "
                              "probes read text, which this model's tokens are not")
        # the run's own tokenizer: the tokenizer.json in its folder (a BPE, a tokenizer file),
        # else what its config names (bytes, or a token folder's own)
        own = run_dir / "tokenizer.json"
        spec.update(target="checkpoint", checkpoint=str(checkpoint), model=model,
                    tokenizer=str(own) if own.is_file() else data.tokenizer,
                    base=run_cfg.model, seq_len=seq_len or data.seq_len,
                    source=str(text) if text is not None else data.source,
                    val_fraction=data.val_fraction, split_seed=data.split_seed,
                    run_config=run_cfg.to_dict())
    else:
        shortcuts = {"placement": names[0] if names else None,
                     "n_blocks": depths[0] if depths else None, "d_model": width,
                     "n_heads": heads, "norm": norm, "kind": kind}
        base = load_model_config(config, sets, shortcuts)
        spec.update(target="init", base=base, placements=names or [base.placement],
                    depths=depths or [base.n_blocks], seeds=list(range(seeds)),
                    seq_len=seq_len or min(64, base.max_seq_len),
                    source=str(text) if text is not None else "shakespeare",
                    val_fraction=0.1, split_seed=0)
    base: ModelConfig = spec["base"]
    vocab = byte_vocab_problem(base) if spec.get("tokenizer", "byte") == "byte" and not (
        spec["target"] == "checkpoint" and text is None) else None
    if vocab:
        raise ConfigError(vocab)
    if spec["seq_len"] < 2:
        raise ConfigError(f"--seq-len: {spec['seq_len']}; a probe needs at least 2 tokens "
                          "(raise --seq-len, or the model's max_seq_len)")
    if spec["seq_len"] > base.max_seq_len:
        raise ConfigError(f"--seq-len: {spec['seq_len']} exceeds the model's max_seq_len="
                          f"{base.max_seq_len}; lower --seq-len or --set max_seq_len=...")
    if spec["target"] == "init":  # a trained run's model exists already
        from normlab.train.memory import check_fits, estimate

        deepest = base.model_copy(update={"n_blocks": max(spec["depths"])})
        # the memory of the device the probes run on: the CPU's (a GPU's free memory says nothing)
        check_fits(estimate(deepest, batch_size, spec["seq_len"]), "cpu", "probe",
                   "lower --width, --blocks, --batch-size or --seq-len")
    return spec


def _batches(spec: dict[str, Any], kind: str, n_classes: int, split: str = "val",
             n: int | None = None):
    from normlab.probe.inputs import text_batches

    return text_batches(spec["source"], n_batches=n or spec["n_batches"],
                        batch_size=spec["batch_size"], seq_len=spec["seq_len"], seed=0,
                        val_fraction=spec["val_fraction"], split_seed=spec["split_seed"],
                        kind=kind, n_classes=n_classes, split=split,
                        tokenizer=spec.get("tokenizer", "byte"))


def _run(spec: dict[str, Any], options: dict[str, Any], parts: Path | None = None
         ) -> dict[str, Any]:
    """Probe the spec's model(s); a depth sweep writes each model's result into `parts` as it
    finishes, so a stopped sweep re-run with the same options finishes only what was left."""
    from normlab.probe.suite import probe_model
    from normlab.probe.sweep import depth_sweep

    base: ModelConfig = spec["base"]
    batches = _batches(spec, base.kind, base.n_classes)
    train = None
    if "update" in spec["probes"]:
        train = _batches(spec, base.kind, base.n_classes, split="train",
                         n=min(options["update_steps"], 16))
    t0 = time.perf_counter()
    runs = []
    if spec["target"] == "checkpoint":
        res = probe_model(spec["model"], batches, spec["probes"], train_batches=train, **options)
        runs.append({"placement": base.placement, "n_blocks": base.n_blocks, "seed": None,
                     "result": res})
    else:
        total = len(spec["placements"]) * len(spec["depths"]) * len(spec["seeds"])

        def progress(msg: str) -> None:
            if total > 1:
                err_console.print(f"probing {msg}" + ("" if ":" in msg else " ..."),
                                  highlight=False)

        inputs = {k: str(v) for k, v in spec.items() if k in (
            "source", "n_batches", "batch_size", "seq_len", "val_fraction", "split_seed")}
        sweep = depth_sweep(base, spec["placements"], spec["depths"], spec["seeds"], batches,
                            spec["probes"], progress=progress, train_batches=train,
                            parts=parts if total > 1 else None, inputs=inputs, **options)
        runs = sweep.pop("runs")
    report: dict[str, Any] = {
        "normlab_probe": 1,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
        "target": spec["target"], "checkpoint": spec.get("checkpoint"),
        "base_model": base.to_dict(), "run_config": spec.get("run_config"),
        "data": {"source": str(spec["source"]), "split": "val", "batches": spec["n_batches"],
                 "batch_size": spec["batch_size"], "seq_len": spec["seq_len"],
                 "val_fraction": spec["val_fraction"], "split_seed": spec["split_seed"]},
        "probes": list(spec["probes"]), "options": options,
        "seconds": round(time.perf_counter() - t0, 2), "runs": runs,
    }
    if spec["target"] == "init" and len(runs) > 1:
        report.update(sweep)
    return report


def _print(report: dict[str, Any]) -> None:
    runs = report["runs"]
    if len(runs) == 1:
        r = runs[0]
        m = r["result"]["model"]
        where = report["checkpoint"] or "init"
        console.print(per_block_table(
            r["result"], f"{m['placement']} ({m['kind']}), {m['n_blocks']} blocks, "
            f"d={m['d_model']}, init {m['init']}, {where}"))
    console.print(summary_table(runs))
    if len(runs) == 1 and "effective_depth" in runs[0]["result"]["summary"]:
        s = runs[0]["result"]["summary"]
        console.print(
            f"effective depth: participation ratio {_fmt(s['effective_depth'])} +- "
            f"{_fmt(s['effective_depth_std'])} of {runs[0]['n_blocks']} blocks (loss), "
            f"{_fmt(s['effective_depth_kl'])} +- {_fmt(s['effective_depth_kl_std'])} (KL); "
            f"{_fmt(s['n_costly'])} block(s) cost > {s['threshold']} nats", highlight=False)
    if report.get("fits"):
        console.print(fits_table(report["fits"], report.get("by_depth", {})))
    notes = list(dict.fromkeys(n for r in runs for n in r["result"]["notes"]))
    for n in notes:
        console.print(f"note: {n}", highlight=False)


def _write(report: dict[str, Any], out: Path, figures: bool) -> None:
    from normlab.probe.figures import write_figures

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--out {out}: cannot create the folder ({e.strerror})")
    path = out / "probe.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite_or_none(report), indent=1))
    os.replace(tmp, path)
    written = [path]
    if figures:
        written += write_figures(report["runs"], out, report.get("fits"),
                                 report.get("per_block_mean"))
    console.print(f"wrote {path} and {len(written) - 1} figure(s) to {out}/",
                         highlight=False)
