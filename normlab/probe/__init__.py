"""Probes: measure stability and effective depth, at init or on trained checkpoints.

Probes observe, never modify: they read the model's tap points through hooks that are removed on
exit, compute gradients with `torch.autograd.grad`, and restore the train/eval flags. See
`docs/probes.md` for the definition of every metric.

    from normlab.probe import probe_model, text_batches
    result = probe_model(model, text_batches(n_batches=4))
"""

from normlab.probe.depth import effective_depth, n_costly, participation_ratio
from normlab.probe.fits import loglog_fit, mean_ci, t_quantile, welch_ci
from normlab.probe.grads import grad_stats, stream_and_grad_stats
from normlab.probe.hooks import eval_mode, hooked, hooks_left
from normlab.probe.inputs import synthetic_labels, text_batches
from normlab.probe.interventions import layer_drop, merge_test
from normlab.probe.lens import logit_lens
from normlab.probe.measures import angular_distance, kl_divergence, mean_token_norm
from normlab.probe.sensitivity import perturbation_sensitivity, update_size
from normlab.probe.stream import growth_exponent, stream_stats
from normlab.probe.suite import DEFAULT_PROBES, PROBES, parse_probes, probe_model
from normlab.probe.sweep import depth_sweep

__all__ = [
    "DEFAULT_PROBES", "PROBES", "angular_distance", "depth_sweep", "effective_depth",
    "eval_mode", "grad_stats", "growth_exponent", "hooked", "hooks_left", "kl_divergence",
    "layer_drop", "logit_lens", "loglog_fit", "mean_ci", "mean_token_norm", "merge_test",
    "n_costly", "parse_probes", "participation_ratio", "perturbation_sensitivity", "probe_model",
    "stream_and_grad_stats", "stream_stats", "synthetic_labels", "t_quantile", "text_batches",
    "update_size", "welch_ci",
]
