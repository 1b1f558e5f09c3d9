"""`normlab plan`: the resolved per-block plan of a model, as formulas (`normlab.nn.plan`), and
with `--time` a steady training step's time (`normlab.train.perf`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from normlab.cli.app import SetOpt, app
from normlab.cli.console import console, fail
from normlab.config import MAX_BLOCKS, PLACEMENTS, ConfigError, load_model_config


@app.command()
def plan(
    placement: Annotated[str | None, typer.Option(
        help=f"one of {', '.join(PLACEMENTS)}, or one of your own (--placements)")] = None,
    placements_file: Annotated[Path | None, typer.Option(
        "--placements", help="YAML file of placements of your own, `placements: {name: "
        "definition}` (model.placement_file)")] = None,
    blocks: Annotated[int | None, typer.Option(min=1, max=MAX_BLOCKS, help="number of blocks L")
                      ] = None,
    norm: Annotated[str | None, typer.Option(help="layernorm|rmsnorm|dyt|derf|identity|batchnorm")
                    ] = None,
    kind: Annotated[str | None, typer.Option(help="decoder|encoder")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file with model fields")] = None,
    set_: SetOpt = None,
    time_step: Annotated[bool, typer.Option(
        "--time", help="also time a steady forward+backward of this model (after warm-up "
        "steps), in the precision of the config's train.precision (or --set train.precision=)")
    ] = False,
) -> None:
    """Print the resolved per-block plan. Each sublayer's formula, with its norms and
    constants; for a placement of your own, also where it is defined."""
    from normlab.nn.plan import build_plan

    try:
        if time_step:  # timed in the run config's train.precision (or --set train.precision=)
            from normlab.train.precision import asked_precision

            asked, set_ = asked_precision(config, set_)
        cfg = load_model_config(config, set_, {
            "placement": placement, "n_blocks": blocks, "norm": norm, "kind": kind,
            "placement_file": None if placements_file is None else str(placements_file)})
    except ConfigError as e:
        fail(str(e))
    if time_step:  # refused before anything is built, as `normlab train` refuses a run
        from normlab.train.memory import check_fits, estimate

        try:
            check_fits(estimate(cfg, 8, min(128, cfg.max_seq_len), training=False,
                                bytes_per_activation=2 if asked != "fp32" else 4),
                       "cpu", "plan --time",
                       "lower --blocks, d_model or d_ff (--set), or leave out --time to see "
                       "the plan alone")
        except ConfigError as e:
            fail(str(e))
    console.print(build_plan(cfg).describe(), markup=False, highlight=False, soft_wrap=True)
    if time_step:
        from normlab.train.perf import steady_step_report
        from normlab.train.precision import timing_precision

        precision, notes = timing_precision(asked, cfg)  # said before the timing starts
        for note in notes:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
        console.print(steady_step_report(cfg, precision=precision), markup=False,
                      highlight=False, soft_wrap=True)
