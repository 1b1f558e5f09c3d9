"""The claims of docs/reference.md as experiments, one module per claim.

Each module opens with its `Claim` spec (`normlab.study.claims.spec`): the source's words and
setting, the ladder it is traced along, and each prediction with its role, rule and the origin
of its numbers; then `measure(ctx)`. This registry is the one list of claims: the study's claim
order, the families each claim trains and the claim table of docs/study.md are derived from it.
Adding a claim is one module here plus its tests (docs/study.md, "Adding a claim").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from normlab.study.claims import (
    c01_stream_growth,
    c02_angular_distance,
    c03_depth_as_width,
    c04_last_layer_gradient,
    c05_gradient_by_layer,
    c06a_warmup_common_lr,
    c06b_warmup_own_lr,
    c07_deepnet_update,
    c08_admin_sensitivity,
    c09_post_ends_better,
    c10_transfer,
    c11_final_norm,
    c12_removable_layers,
    c13_lens_norm,
    c14_khop_depth,
)
from normlab.study.claims.spec import Claim

MODULES = (c01_stream_growth, c02_angular_distance, c03_depth_as_width, c04_last_layer_gradient,
           c05_gradient_by_layer, c06a_warmup_common_lr, c06b_warmup_own_lr, c07_deepnet_update,
           c08_admin_sensitivity, c09_post_ends_better, c10_transfer, c11_final_norm,
           c12_removable_layers, c13_lens_norm, c14_khop_depth)

REGISTRY: dict[str, Claim] = {m.CLAIM.id: m.CLAIM for m in MODULES}
ALL_CLAIMS: tuple[str, ...] = tuple(REGISTRY)
# A name that stands for several claims: C6 (warmup) is asked as two questions.
CLAIM_GROUPS = {"C6": ("C6a", "C6b")}


def measures() -> dict[str, Callable[[Any], Any]]:
    """Every claim's experiment, by id."""
    return {cid: c.measure for cid, c in REGISTRY.items() if c.measure is not None}


def trained_by_claim() -> dict[str, tuple[tuple[str, bool], ...]]:
    """The `(family, with warmup)` grids each claim tunes (claims that train nothing left out);
    a study trains the first grids of every selected claim's families together."""
    return {cid: c.trains for cid, c in REGISTRY.items() if c.trains}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claim_table() -> str:
    """docs/study.md's claim table, from the specs: each claim, its source's setting and each
    prediction with its role, rule and where its numbers come from."""
    lines = ["| claim | source's setting | prediction | role | rule | origin of its numbers | "
             "off the source's setting |", "|---|---|---|---|---|---|---|"]
    for c in REGISTRY.values():
        for i, p in enumerate(c.predictions):
            head = (f"**{c.id}** {_cell(c.title)}", _cell(c.setting)) if i == 0 else ("", "")
            r = p.rule
            rule = r.kind + (f" {r.expected}" if r.expected else "") + "".join(
                f" {k} {v:g}" for k, v in (("at", r.threshold), ("low", r.low),
                                           ("high", r.high), ("margin", r.margin))
                if v is not None) + (" (per rung)" if r.kind != "failure_rate" and all(
                    v is None for v in (r.threshold, r.low, r.high, r.margin)) else "")
            role = p.role + (", scale" if p.scale else "")
            lines.append(f"| {head[0]} | {head[1]} | {_cell(p.key)} | {role} | {_cell(rule)} | "
                         f"{_cell(r.origin)} | {_cell(p.derivation) or '-'} |")
    return "\n".join(lines) + "\n"
