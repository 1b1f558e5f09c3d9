"""Probes: measure stability and effective depth, at init or on trained checkpoints.

Probes observe, never modify: they read the model's tap points through hooks that are removed on
exit, compute gradients with `torch.autograd.grad`, and restore the train/eval flags. See
`docs/probes.md` for the definition of every metric, and `normlab.probe.metrics` for the table
they are listed in.

    from normlab.probe import probe_model, text_batches
    result = probe_model(model, text_batches(n_batches=4))

The names below are imported from their modules when first used, so that reading the table of
metrics (the report does, for its labels) imports no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normlab.probe.depth import effective_depth, n_costly, participation_ratio
    from normlab.probe.fits import loglog_fit, mean_ci, t_quantile, welch_ci
    from normlab.probe.grads import grad_stats, stream_and_grad_stats
    from normlab.probe.hooks import eval_mode, hooked, hooks_left
    from normlab.probe.inputs import on_device, synthetic_labels, text_batches
    from normlab.probe.interventions import layer_drop, merge_test, skip_effect
    from normlab.probe.lens import logit_lens
    from normlab.probe.measures import angular_distance, kl_divergence, mean_token_norm
    from normlab.probe.sensitivity import perturbation_sensitivity, update_size
    from normlab.probe.stream import growth_exponent, stream_stats
    from normlab.probe.suite import DEFAULT_PROBES, PROBES, parse_probes, probe_model
    from normlab.probe.sweep import depth_sweep

_FROM = {
    "depth": ("effective_depth", "n_costly", "participation_ratio"),
    "fits": ("loglog_fit", "mean_ci", "t_quantile", "welch_ci"),
    "grads": ("grad_stats", "stream_and_grad_stats"),
    "hooks": ("eval_mode", "hooked", "hooks_left"),
    "inputs": ("on_device", "synthetic_labels", "text_batches"),
    "interventions": ("layer_drop", "merge_test", "skip_effect"),
    "lens": ("logit_lens",),
    "measures": ("angular_distance", "kl_divergence", "mean_token_norm"),
    "sensitivity": ("perturbation_sensitivity", "update_size"),
    "stream": ("growth_exponent", "stream_stats"),
    "suite": ("DEFAULT_PROBES", "PROBES", "parse_probes", "probe_model"),
    "sweep": ("depth_sweep",),
}
_MODULE_OF = {name: module for module, names in _FROM.items() for name in names}

__all__ = [
    "DEFAULT_PROBES", "PROBES", "angular_distance", "depth_sweep", "effective_depth",
    "eval_mode", "grad_stats", "growth_exponent", "hooked", "hooks_left", "kl_divergence",
    "layer_drop", "logit_lens", "loglog_fit", "mean_ci", "mean_token_norm", "merge_test",
    "n_costly", "on_device", "parse_probes", "participation_ratio", "perturbation_sensitivity",
    "probe_model", "skip_effect", "stream_and_grad_stats", "stream_stats", "synthetic_labels",
    "t_quantile", "text_batches", "update_size", "welch_ci",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
