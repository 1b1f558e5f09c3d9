"""The claims of docs/reference.md as experiments, one module per claim.

Each module opens with its `Claim` spec (`normlab.study.claims.spec`): the source's words and
setting, the ladder it is traced along, and each prediction with its role, rule and the origin
of its numbers; then `measure(ctx)`. This registry is the one list of claims: the study's claim
order, the families each claim trains and the claim table of docs/study.md are derived from it.
A claim with sizes of its own declares them in its module (`Settings`, one value per profile);
study.json records them beside the profile's shared sizes (`profile_settings`).
Adding a claim is one module here plus its tests (docs/study.md, "Adding a claim").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, fields, replace
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
from normlab.study.profiles import Profile

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


def trained_by_claim(profile: Profile | None = None) -> dict[str, tuple[tuple[str, bool], ...]]:
    """The `(family, with warmup)` grids each claim tunes (claims that train nothing left out):
    in `profile` (`Claim.trained`), or every grid a claim may tune; a study trains the first
    grids of every selected claim's families together."""
    grids = {cid: c.trains if profile is None else c.trained(profile)
             for cid, c in REGISTRY.items()}
    return {cid: g for cid, g in grids.items() if g}


def deep_families(profile: Profile, claims: Collection[str] | None = None) -> list[str]:
    """The families a study trains at the profile's `deep_blocks`: those the selected `claims`
    (None: every claim) read there (`Claim.deep_grids`), in claim order; none in a profile
    without deep models."""
    out: list[str] = []
    if not profile.deep_blocks:
        return out
    for cid, c in REGISTRY.items():
        if c.deep_grids is not None and (claims is None or cid in claims):
            out += [f for f in c.deep_grids(profile) if f not in out]
    return out


def profile_settings(profile: Profile) -> dict[str, Any]:
    """What study.json records of a profile (`profile_settings`): its shared sizes and every
    claim's own settings in it, side by side (no two name the same setting)."""
    out = profile.to_dict()
    for c in REGISTRY.values():
        own = c.settings(profile)
        if own is not None:
            out.update(asdict(own))
    return out


def settings_owner(name: str) -> Claim | None:
    """The claim whose settings hold `name` (None: a shared size of `Profile`)."""
    for c in REGISTRY.values():
        if c.settings_class is not None and name in {f.name for f in fields(c.settings_class)}:
            return c
    return None


def with_settings(profile: Profile, **changes: Any) -> Profile:
    """`profile` with `changes` made, each to the profile's shared sizes or to the settings of
    the claim that owns it (`settings_owner`)."""
    shared = {k: v for k, v in changes.items() if settings_owner(k) is None}
    out = replace(profile, **shared)
    for c in REGISTRY.values():
        own = {k: v for k, v in changes.items() if settings_owner(k) is c}
        if own:
            out = c.with_settings(out, **own)
    return out


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
