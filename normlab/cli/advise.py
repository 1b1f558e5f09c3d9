"""`normlab advise`: placement guidance for an intended shape (`normlab.study.advise`), as tables
of its rules, what it measured and what the recorded studies found."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from normlab.cli.app import app
from normlab.cli.console import console, err_console, fail
from normlab.config import MAX_BLOCKS, ConfigError, ModelConfig, parse_config


@app.command()
def advise(
    blocks: Annotated[int, typer.Option(help="intended number of blocks", min=1,
                                        max=MAX_BLOCKS)],
    width: Annotated[int, typer.Option(help="intended d_model", min=8)],
    heads: Annotated[int | None, typer.Option(min=1, help="attention heads (default width/64)")
                     ] = None,
    finetune: Annotated[bool, typer.Option(help="you will fine-tune a Post-Norm checkpoint")
                        ] = False,
    warmup_budget: Annotated[int | None, typer.Option(min=0, help="warmup steps you can afford")
                             ] = None,
    intermediate_heads: Annotated[bool, typer.Option(help="heads read intermediate blocks")
                                  ] = False,
    check_steps: Annotated[int, typer.Option(min=1, help="steps of each stability-check run")
                           ] = 60,
    device: Annotated[str, typer.Option(
        help="where the stability check trains: auto (a CUDA GPU where there is one), cpu or "
             "cuda")] = "auto",
    measure: Annotated[bool, typer.Option(
        help="measure at this shape (a few minutes); --no-measure: say what the recorded studies "
             "(docs/results) found at this shape instead, or that they measured nothing here")
                       ] = True,
    also: Annotated[list[str] | None, typer.Option(
        "--also", help="another placement to measure beside pre and post (repeatable), e.g. "
                       "--also olmo2 --also keel: at init and in every cell of the check, "
                       "compared with the recommended one")] = None,
) -> None:
    """Placement guidance for your shape. Each rule is shown with what normlab measures
    there, or without measuring with what its recorded studies found there."""
    from normlab.study.advise import advise as run_advise
    from normlab.study.devices import study_device
    from normlab.train.memory import check_fits, estimate

    if heads is not None and width % heads:
        fail(f"--heads {heads} does not divide --width {width}")
    try:
        for name in also or []:  # a mistyped name gets its did-you-mean before anything runs
            try:
                parse_config(ModelConfig, {"placement": name})
            except ConfigError as e:
                fail(f"--also {name}: {str(e).split(chr(10), 1)[-1].strip()}")
        where = study_device(device)
        if measure:  # the init measurement builds the model at the full shape
            shape = parse_config(ModelConfig, {"n_blocks": blocks, "d_model": width,
                                               "n_heads": heads or max(1, width // 64)})
            check_fits(estimate(shape, 4, 64, training=False), "cpu", "advise",
                       "lower --width or --blocks, or use --no-measure")
        advice = run_advise(blocks, width, heads, finetune=finetune, warmup_budget=warmup_budget,
                            intermediate_heads=intermediate_heads, check_steps=check_steps,
                            measure=measure, device=where, also=tuple(also or ()),
                            progress=lambda msg: err_console.print(
                                f"measuring: {msg} ...", highlight=False))
    except ConfigError as e:
        fail(str(e))
    table = Table(title=f"rules of thumb for {blocks} blocks, width {width} (the literature's "
                        "guidance)")
    table.add_column("rule")
    table.add_column("applies")
    for r in advice.rules:
        table.add_row(r["rule"], "yes" if r["applies"] else "no")
    console.print(table)
    if advice.measured.get("stability"):
        st = Table(title="short stability check (reduced width, your depth)")
        for col in ("placement", "lr", "warmup", "outcome", "val loss"):
            st.add_column(col)
        for r in advice.measured["stability"]:
            st.add_row(r["placement"], f"{r['lr']:g}", str(r["warmup"]),
                       r["outcome"] + (f" ({r['reason']} @ {r['step']})" if r["reason"] else ""),
                       f"{r['val_loss']:.3f}" if r["val_loss"] is not None else "-")
        console.print(st)
    if advice.recorded is not None and advice.recorded.rows:
        rt = Table(title=f"recorded studies at {blocks} blocks, width {width} (docs/results)")
        for col in ("claim", "study", "verdict", "measured: estimate [95% interval], n"):
            rt.add_column(col)
        for r in advice.recorded.rows:
            needs = [f"needs: {r['needs']}"] if r["needs"] else []
            rt.add_row(f"{r['claim']} {r['title']}", r["study"], r["verdict"],
                       "\n".join([*r["numbers"], *needs]))
        console.print(rt)
    console.print(f"recommendation: {advice.recommendation}", style="bold", highlight=False)
    for reason in advice.reasons:
        console.print(f"  - {reason}", highlight=False)

