"""A run's config as every listing shows it: `normlab runs` (`normlab.cli.runs`), a sweep's table
(`normlab.sweep.summarize`) and the report's runs table (`normlab.report.runs`). Each reads a run
folder's config resolved as the plan resolves it (`described_config`), flattened to
`section.field` keys, and shows the fields in which the listed runs differ.
"""

from __future__ import annotations

from typing import Any

from normlab.config import ConfigError, ModelConfig, parse_config
from normlab.train.rundir import RunFolder


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as flat `section.field` keys (lists become tuples)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def varying_paths(configs: list[dict[str, Any]]) -> list[str]:
    """The config paths (flat `section.field` keys) whose value differs between runs, sorted."""
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


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

