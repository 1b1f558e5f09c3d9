"""A run's config as every listing shows it: `normlab runs` (`normlab.cli.runs`), a sweep's table
(`normlab.sweep.summarize`) and the report's runs table (`normlab.report.runs`). Each reads a run
folder's config resolved as the plan resolves it (`described_config`), flattened to
`section.field` keys, and shows the fields in which the listed runs differ among the runs they
apply to (`applies`: the one rule of which setting a run uses, e.g. `data.khop_*` only with
`data.task: khop`); a setting that does not apply to a run is null for it (`applied`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from normlab.config import KHOP_FIELDS, TEXT_FIELDS, ConfigError, ModelConfig, parse_config
from normlab.train.rundir import RunFolder

# Mappings shown as one value, not field by field: a user placement's definition would otherwise
# give a listing a column per norm switch; its digest tells two definitions apart.
_WHOLE = frozenset({"model.placement_def"})


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as flat `section.field` keys (lists become tuples; a user placement's
    definition one short digest)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if key in _WHOLE and isinstance(v, dict):
            blob = json.dumps(v, sort_keys=True, default=str).encode()
            out[key] = "def-" + hashlib.sha256(blob).hexdigest()[:8]
        elif isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def varying_paths(configs: list[dict[str, Any]]) -> list[str]:
    """The config paths (flat `section.field` keys) whose value differs between runs, sorted."""
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


# Settings a run uses only under a condition on its other settings (normlab.config states each:
# "only used with task=khop", "applies to mlp=gelu only", "(encoder only)", ...): path -> test
# of the run's flat config. The placement's own constants (deepnorm_alpha, mix_switch, ...) are
# already None where unused (`normlab.nn.plan.resolved_settings`).
_APPLIES_WHEN: dict[str, Any] = {
    **{f"data.{k}": lambda c: c.get("data.task") == "khop" for k in KHOP_FIELDS},
    **{f"data.{k}": lambda c: c.get("data.task") is None for k in TEXT_FIELDS},
    "model.gelu_approx": lambda c: c.get("model.mlp", "gelu") == "gelu",
    "model.rope_base": lambda c: c.get("model.positions") == "rope",
    "model.n_classes": lambda c: c.get("model.kind") == "encoder",
    "model.pooling": lambda c: c.get("model.kind") == "encoder",
    "model.block_placements": lambda c: c.get("model.placement") == "custom",
    "model.dyt_alpha": lambda c: "dyt" in (c.get("model.norm"), c.get("model.out_norm")),
    "model.deepnorm_other_blocks": lambda c: str(c.get("model.deepnorm_arch")).startswith(
        "encdec"),
}


def applies(path: str, config: dict[str, Any]) -> bool:
    """Whether the setting `path` (a flat `section.field` key) is used by the run whose flat
    config is `config`: `data.khop_*` only with `data.task: khop`, the text fields (`source`,
    `tokenizer`, ...) only without a task, `gelu_approx` only with `mlp: gelu`, `rope_base` only
    with rope, `n_classes` and `pooling` only in an encoder, `block_placements` only with
    `placement: custom`, `dyt_alpha` only with a DyT norm, `deepnorm_other_blocks` only with an
    encoder-decoder DeepNorm; every other setting always."""
    test = _APPLIES_WHEN.get(path)
    return test is None or bool(test(config))


def applied(config: dict[str, Any]) -> dict[str, Any]:
    """A flat config with the settings that do not apply to its run (`applies`) as None."""
    return {k: v if applies(k, config) else None for k, v in config.items()}


def differing_paths(configs: list[dict[str, Any]]) -> list[str]:
    """The config paths whose value differs between the runs they apply to (`applies`), sorted:
    the settings a listing shows. One k-hop run among text runs adds `data.task`, not
    `data.khop_*`: those differ only between k-hop runs."""
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys
            if len({repr(c.get(k)) for c in configs if applies(k, c)}) > 1]


def label_paths(configs: list[dict[str, Any]]) -> list[str]:
    """`train.name` and `train.tags` when some run has them: shown whether or not they vary."""
    return [p for p in ("train.name", "train.tags") if any(c.get(p) for c in configs)]


def described_config(folder: RunFolder) -> dict[str, Any]:
    """A run's config as listings show it: resolved by the plan (`resolved_run_fields`) when
    this normlab accepts it; otherwise the YAML as written (an older or newer run), its model
    section resolved when that part is valid on its own."""
    from normlab.nn.plan import resolved_model_fields, resolved_run_fields

    trained_in = folder.meta.get("precision") or folder.summary.get("precision")
    if folder.config is not None:
        return with_resolved_precision(resolved_run_fields(folder.config), trained_in)
    model = folder.raw_config.get("model")
    try:
        resolved = resolved_model_fields(parse_config(ModelConfig, model))
    except ConfigError:
        return with_resolved_precision(folder.raw_config, trained_in)
    return with_resolved_precision(folder.raw_config | {"model": resolved}, trained_in)


def with_resolved_precision(config: dict[str, Any], resolved: str | None) -> dict[str, Any]:
    """`train.precision: auto` shown as what the run resolved it to, `fp32 (auto)`, when the run
    recorded that (config.yaml's meta, summary.json); the config unchanged otherwise."""
    train = config.get("train")
    if resolved and isinstance(train, dict) and train.get("precision") == "auto":
        return config | {"train": train | {"precision": f"{resolved} (auto)"}}
    return config

