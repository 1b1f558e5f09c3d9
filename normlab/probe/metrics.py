"""The probe metrics: one row per number a probe returns, and everything else reads this table.

    METRICS                     the rows, in the order tables and docs list them
    metric("ang_prev").label    'angular distance to the previous block (fraction of pi)'
    place("loss_std")           'summary': where a result key goes (an unknown key is an error)

A row says what a metric is called in results (`name`), whether it has one value per block, per
model or per optimizer step (`per`), which `--probes` name computes it (`probe`), the function
that computes it and what that function reads (`compute`, `needs`), how the probe of real
checkpoints gets it (`real`), its unit, its figure label, its name in the report, its CLI
column, and its definition for docs/probes.md. Read by the probe suite (which probes exist and
run, where each key of a result goes), the figures (labels, captions, log axes), the CLI
(columns), the report (names), the real-checkpoint probe (normlab.interop.probe_hf) and
`scripts/probe_docs.py`, which writes docs/probes.md's lists of measures from it.

Adding a metric is one function and one row (docs/design.md, "Adding a probe metric"). The
functions are named by module and name and imported when first called, so that reading the table
(the report does, for its labels) imports no torch.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Where a metric's values go in a result (`normlab.probe.suite.probe_model`): one value per
# block (the merge test's per pair t = (t, t+1), one shorter), one per model, one per step.
PER_BLOCK, SUMMARY, SERIES = "per_block", "summary", "series"
PER_BATCH = "per_batch"  # `<name>_per_batch` of a metric with `per_batch=True`

NORMLAB, REAL = "normlab", "real"

# What a metric's function reads. A probe function (every kind but "metrics") takes one
# `normlab.probe.suite.ProbeRun` (the model, the batches, the options; notes to add to) and
# returns `{name: value}` for every row that names it; it runs once per `probe_model` call,
# however many rows name it. A "metrics" function takes the values of the metrics `inputs`
# names, in that order, and returns its value.
NEEDS = {
    "stream": "forward passes, the stream read at the taps",
    "gradients": "one forward and backward pass of the model's loss per batch",
    "interventions": "one forward pass per block (or pair of blocks) changed by hooks",
    "weights": "forward passes with randomly perturbed weights",
    "training": "a copy of the model trained for a few steps (not among the default probes)",
    "metrics": "other metrics of the same result",
}


@dataclass(frozen=True)
class Fn:
    """A function named by `module:name`, imported when first called."""

    path: str

    @property
    def name(self) -> str:
        return self.path.rpartition(":")[2]

    def resolve(self) -> Callable[..., Any]:
        module, _, name = self.path.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class Metric:
    """One probe metric (see the module doc)."""

    name: str                   # its key in results
    per: str                    # PER_BLOCK, SUMMARY or SERIES
    probe: str                  # the `--probes` name it comes with
    needs: str                  # what `compute` reads: a key of NEEDS
    doc: str                    # its definition, markdown (docs/probes.md)
    compute: Callable[..., Any] | None = None  # normlab models' probe; None: real checkpoints only
    inputs: tuple[str, ...] = ()  # needs="metrics": the metrics `compute(*values)` reads
    # How `normlab.interop.probe_hf` gets it from a real checkpoint (None: it does not): for a
    # layer-drop cost `f(full, skipped) -> float | None` (None: not for this model), for a
    # metric of metrics the function of `inputs`, else the function that returns it.
    real: Callable[..., Any] | None = None
    unit: str = ""
    label: str = ""             # figures: the axis label, with its unit (default: the name)
    caption: str = ""           # figures: what the per-block figure shows, as a caption starts
    log_scale: bool = False     # figures: a log y axis when every value is positive
    short: str = ""             # the report's name for it (default: the name with spaces)
    column: str = ""            # CLI: its column in the per-block table or the sweep's summary
    in_summary: bool = False    # CLI: listed in one model's summary table
    spread: bool = False        # the result also holds `<name>_std`, the std over batches
    per_batch: bool = False     # the result also holds `<name>_per_batch`, every batch's row
    matrix: bool = False        # per block, a row with one value per block (figures: a heatmap)

    @property
    def models(self) -> tuple[str, ...]:
        """Which probes produce it: normlab's (`probe_model`), real checkpoints' or both."""
        return tuple(m for m, f in ((NORMLAB, self.compute), (REAL, self.real)) if f)


# --- functions of other metrics ------------------------------------------------------------

def first(values: Sequence[float]) -> float:
    return values[0]


def last(values: Sequence[float]) -> float:
    return values[-1]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def last_over_first(values: Sequence[float]) -> float:
    return values[-1] / values[0] if values[0] > 0 else math.inf


def max_over_min(values: Sequence[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else math.inf


# --- the table -----------------------------------------------------------------------------

_SUITE = "normlab.probe.suite"
_HF = "normlab.interop.probe_hf"
STREAM = Fn(f"{_SUITE}:stream_probe")  # the stream and gradient probes share one pass
MERGE, DROP = Fn(f"{_SUITE}:merge_probe"), Fn(f"{_SUITE}:drop_probe")
LENS, PERTURB = Fn(f"{_SUITE}:lens_probe"), Fn(f"{_SUITE}:perturb_probe")
SKIP = Fn(f"{_SUITE}:skip_probe")
UPDATE = Fn(f"{_SUITE}:update_probe")
HF_STREAM = Fn("normlab.probe.stream:stream_stats")  # what probe_hf reads a real model with
HF_NORMS = Fn(f"{_HF}:stream_norms")
HF_DROP = Fn(f"{_HF}:drop_scan")
HF_GROWTH = Fn("normlab.probe.stream:growth_exponent")  # of `norm` without position 0

_IN_STREAM = dict(probe="stream", needs="stream", compute=STREAM)
_IN_GRADS = dict(probe="grads", needs="gradients", compute=STREAM)
_IN_MERGE = dict(probe="merge", needs="interventions", compute=MERGE, unit="nats",
                 per_batch=True)
_IN_DROP = dict(probe="drop", needs="interventions", compute=DROP)
_IN_SKIP = dict(probe="skip", needs="interventions", compute=SKIP)
_CSORDAS = "Csordás, Manning and Potts 2025, arXiv 2505.13898"
_IN_LENS = dict(probe="lens", needs="stream", compute=LENS, unit="nats")
_IN_PERTURB = dict(probe="perturb", needs="weights", compute=PERTURB)
_IN_UPDATE = dict(probe="update", needs="training", compute=UPDATE)
_OWN_LOSS = ("the model's own loss (next-token cross-entropy for a decoder, class cross-entropy "
             "for an encoder)")

METRICS: tuple[Metric, ...] = (
    # -- per block: the stream (C1, C2)
    Metric("norm", PER_BLOCK, **_IN_STREAM, real=HF_NORMS, unit="L2 norm",
           label="mean token norm after the block", short="stream norm", column="norm",
           caption="The mean token norm of the residual stream after each block", log_scale=True,
           doc="mean over tokens of `‖x_{l+1}‖`; on real checkpoints over positions 1..T-1 "
               "(position 0 is `norm_first`)"),
    Metric("norm_attn", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="L2 norm",
           label="mean token norm after the attention sublayer", log_scale=True,
           doc="mean over tokens of the stream's norm after block `l`'s attention sublayer"),
    Metric("rel_update", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="ratio",
           label="relative update (norm of the change / stream norm)", column="rel upd",
           log_scale=True, doc="mean over tokens of `‖x_{l+1} - x_l‖ / ‖x_l‖`"),
    Metric("cos_prev", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="cosine",
           label="cosine similarity to the previous block",
           doc="per token `cos(x_l, x_{l+1})`, averaged over tokens"),
    Metric("ang_prev", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="fraction of π",
           label="angular distance to the previous block (fraction of pi)",
           short="angular distance to the previous block", column="ang prev",
           caption="The angular distance between the streams of consecutive blocks",
           doc="per token the angular distance `arccos(cos(x_l, x_{l+1}))/π ∈ [0, 1]`, averaged "
               "over tokens"),
    Metric("cos_last", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="cosine",
           label="cosine similarity to the last block",
           doc="per token `cos(x_{l+1}, x_L)` with the last block's output `x_L`, averaged over "
               "tokens"),
    Metric("ang_last", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="fraction of π",
           label="angular distance to the last block (fraction of pi)", column="ang last",
           doc="the angular distance between `x_{l+1}` and `x_L`, averaged over tokens (0 at the "
               "last block)"),
    Metric("branch_attn", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="ratio",
           label="attention branch norm / stream norm", log_scale=True,
           doc="mean over tokens of `‖attention branch as added‖ / ‖stream entering the "
               "sublayer‖` (taps `branch_added` and `stream_in`: after any output norm or gate, "
               "before any skip scale)"),
    Metric("branch_mlp", PER_BLOCK, **_IN_STREAM, real=HF_STREAM, unit="ratio",
           label="MLP branch norm / stream norm", column="mlp/x", log_scale=True,
           doc="the same for the MLP sublayer"),
    Metric("dual_norm", PER_BLOCK, **_IN_STREAM, unit="L2 norm",
           label="second-stream norm", log_scale=True,
           doc="ResiDual and SiameseNorm only: mean token norm of the second stream `d` after "
               "block `l`"),
    # -- per block: gradients (C4, C5)
    Metric("attn_grad", PER_BLOCK, **_IN_GRADS, unit="L2 norm",
           label="attention weights gradient norm", column="attn g", log_scale=True,
           caption="The gradient norm of each block's attention weights",
           doc="Frobenius norm of the gradient of all parameters of block `l`'s attention "
               "sublayer: its weights and biases plus its norms, gate and skip weights"),
    Metric("mlp_grad", PER_BLOCK, **_IN_GRADS, unit="L2 norm",
           label="MLP weights gradient norm", column="mlp g", log_scale=True,
           caption="The gradient norm of each block's MLP weights",
           doc="the same for the MLP sublayer"),
    Metric("stream_grad", PER_BLOCK, **_IN_GRADS, unit="L2 norm",
           label="stream gradient norm", column="x grad", log_scale=True,
           doc="Frobenius norm over the batch of `∂loss/∂x_{l+1}`"),
    # -- per pair of blocks: the merge test (C3)
    Metric("merge_kl", PER_BLOCK, **_IN_MERGE,
           label="KL divergence of the merged model from the original (nats)",
           short="merge KL", column="merge KL", log_scale=True,
           caption="Merge test: the KL divergence of the output distribution when block t+1 runs "
                   "on block t's input instead of its own",
           doc="`KL(p_original ‖ p_merged)` of the output distribution, mean over positions "
               "(decoder) or sequences (encoder); index `t` is the pair `(t, t+1)`"),
    Metric("merge_dloss", PER_BLOCK, **_IN_MERGE, label="loss change when merged (nats)",
           column="merge dL",
           caption="Merge test: the loss change when block t+1 runs on block t's input",
           doc="loss(merged) − loss(original)"),
    # -- per block: layer drop (C3, C12)
    Metric("drop_dloss", PER_BLOCK, **_IN_DROP, real=Fn(f"{_HF}:dropped_loss_increase"),
           unit="nats", label="loss increase when skipped (nats)",
           short="loss increase when skipped", column="drop dL", per_batch=True,
           caption="Layer drop: the loss increase when each block is skipped",
           doc="loss(block `l` skipped) − loss(original); on real checkpoints with an LM head, "
               "their own loss (next-token, or masked-token for a masked LM)"),
    Metric("drop_kl", PER_BLOCK, **_IN_DROP, real=Fn(f"{_HF}:dropped_kl"), unit="nats",
           label="KL divergence with the block skipped from the original (nats)",
           short="KL when skipped", column="drop KL", log_scale=True, per_batch=True,
           caption="Layer drop: the KL divergence of the output distribution when each block is "
                   "skipped",
           doc="`KL(p_original ‖ p_dropped)` of the output distribution"),
    # -- per block: skip effects (Csordás et al. 2025; normlab.probe.interventions)
    Metric("rel_contribution", PER_BLOCK, **_IN_SKIP, unit="ratio",
           label="block contribution / stream norm", column="contrib", log_scale=True,
           caption="The norm of each block's contribution relative to the stream it reads",
           doc="mean over tokens of `‖c_l‖ / ‖x_l‖`, with `c_l` block `l`'s contribution (its "
               "attention and MLP branches as added, summed; taps `branch_added`): "
               f"{_CSORDAS}, Fig. 2a's `‖a_l + m_l‖ / ‖h_l‖`; equal to `rel_update` wherever "
               "the stream is the sum of the contributions (pre-norm)"),
    Metric("skip_effect", PER_BLOCK, **_IN_SKIP, unit="ratio", matrix=True,
           label="relative change of the block's contribution",
           caption="Skip effect: the largest relative change of each block's contribution "
                   "(columns) when a block (rows) is skipped",
           doc="row `i`, block `i` skipped (as in `drop`): for each block `j`, the largest over "
               "tokens and batches of `‖c'_j − c_j‖ / max(‖c_j‖, 1e-6)`, the relative change of "
               "its contribution; 0 for `j < i`, 1 at `j = i` (its contribution removed) "
               f"({_CSORDAS}, Fig. 3)"),
    Metric("skip_effect_later", PER_BLOCK, **_IN_SKIP, unit="ratio",
           label="largest relative change of a later block's contribution when skipped",
           column="skip later", log_scale=True,
           caption="Skip effect: the largest relative change of a later block's contribution "
                   "when each block is skipped",
           doc="`max_{j > i} skip_effect[i][j]`: how much the blocks after block `i` change "
               "when it is skipped (NaN for the last block, which has none)"),
    Metric("skip_output", PER_BLOCK, **_IN_SKIP, unit="L2 norm",
           label="largest output change when skipped (L2 of probabilities)", column="skip out",
           caption="Skip effect: the largest change of the output distribution when each block "
                   "is skipped",
           doc="the largest over tokens and batches of `‖p' − p‖`, the L2 norm of the change of "
               "the output distribution (softmax over the vocabulary, or over an encoder's "
               f"classes) when block `i` is skipped ({_CSORDAS})"),
    # -- per block: logit lens (C13, C11)
    Metric("lens_normed", PER_BLOCK, **_IN_LENS, column="lens norm",
           label="logit-lens loss through a norm (nats/byte)",
           caption="Logit lens: the loss of the LM head read at each block's stream through the "
                   "final norm",
           doc="next-token loss of `head(FinalNorm(x_{l+1}))`: the model's final norm "
               "(`final.norm`); when the placement has none (post, deepnorm, admin, b2t, rezero, "
               "...) a fresh LayerNorm without affine parameters, and `lens_norm` (and a `note:` "
               "line) says which"),
    Metric("lens_raw", PER_BLOCK, **_IN_LENS, column="lens raw",
           label="logit-lens loss without a norm (nats/byte)",
           caption="Logit lens: the loss of the LM head read at each block's stream, without a "
                   "norm",
           doc="next-token loss of `head(x_{l+1})`, no norm at the extraction point"),
    Metric("lens_free", PER_BLOCK, **_IN_LENS, column="lens free",
           label="logit-lens loss through a norm without parameters (nats/byte)",
           caption="Logit lens: the loss of the LM head read at each block's stream through a "
                   "norm without parameters",
           doc="next-token loss of `head(Norm(x_{l+1}))`, `Norm` without parameters on the "
               "stream's own statistics (RMSNorm for `norm: rmsnorm`, else LayerNorm; gain 1, "
               "bias 0): a norm at the extraction point with nothing trained in it (C13)"),
    # -- per block, real checkpoints only
    Metric("norm_first", PER_BLOCK, "stream", "stream", real=HF_NORMS, unit="L2 norm",
           column="pos 0",
           doc="mean norm of the token at position 0 after block `l`, apart from `norm`: "
               "pre-norm LLMs park an attention sink there"),
    Metric("norm_median", PER_BLOCK, "stream", "stream", real=HF_NORMS, unit="L2 norm",
           column="median", doc="median token norm after block `l` over positions 1..T-1"),
    Metric("norm_all", PER_BLOCK, "stream", "stream", real=HF_NORMS, unit="L2 norm",
           doc="mean token norm after block `l` over every position, position 0 included"),
    Metric("drop_hidden_cos", PER_BLOCK, "drop", "interventions",
           real=Fn(f"{_HF}:dropped_hidden_cos"), unit="1 − cosine",
           short="hidden-state change when skipped (1 - cos)", column="drop 1-cos h",
           doc="mean over tokens of 1 − cos of the final hidden state with and without block "
               "`l`"),
    Metric("drop_hidden_ang", PER_BLOCK, "drop", "interventions",
           real=Fn(f"{_HF}:dropped_hidden_ang"), unit="fraction of π",
           doc="the angular distance between the final hidden states with and without block "
               "`l`, averaged over tokens"),
    Metric("drop_pooled_cos", PER_BLOCK, "drop", "interventions",
           real=Fn(f"{_HF}:dropped_pooled_cos"), unit="1 − cosine", column="drop 1-cos pooled",
           doc="encoders without an LM head (sentence embedders): 1 − cos of the mean-pooled "
               "sentence embedding with and without block `l`"),
    # -- per model
    Metric("loss", SUMMARY, **_IN_GRADS, real=HF_DROP, unit="nats", column="loss",
           in_summary=True, spread=True,
           doc=f"{_OWN_LOSS} on the batches; on real checkpoints with an LM head, the loss of "
               "the layer-drop scan's full model"),
    Metric("embed_norm", SUMMARY, **_IN_STREAM, real=HF_STREAM, unit="L2 norm",
           short="embedding norm", in_summary=True, spread=True,
           doc="mean over tokens of `‖x_0‖`, the embedding output"),
    Metric("last_norm", SUMMARY, "stream", "metrics", compute=last, inputs=("norm",),
           unit="L2 norm", label="stream norm after the last block", column="x_L norm",
           in_summary=True, doc="`‖x_L‖`, the stream after the last block (before the final norm)"),
    Metric("final_norm", SUMMARY, **_IN_STREAM, real=HF_STREAM, unit="L2 norm",
           short="final norm", in_summary=True, spread=True,
           doc="mean over tokens of `‖final.out‖`, what the head reads"),
    Metric("growth_exponent", SUMMARY, **_IN_STREAM, real=HF_GROWTH, unit="exponent",
           column="growth exp", in_summary=True,
           doc="least-squares slope of `log norm[l]` against `log(l+1)`, `l+1 = 1..L`: the "
               "stream norm grows like `l^exponent` (0 for post; Xiong et al. Lemma 2 gives 0.5 "
               "for pre at Xavier init); on real checkpoints of `norm` without position 0"),
    Metric("growth_exponent_all_positions", SUMMARY, "stream", "stream", real=HF_STREAM,
           unit="exponent", doc="`growth_exponent` of the mean over every position (`norm_all`)"),
    Metric("norm_first_block", SUMMARY, "stream", "metrics", real=first, inputs=("norm",),
           unit="L2 norm", short="norm after the first block", doc="`norm[0]`"),
    Metric("norm_last_block", SUMMARY, "stream", "metrics", real=last, inputs=("norm",),
           unit="L2 norm", short="norm after the last block", doc="`norm[L-1]`"),
    Metric("norm_growth", SUMMARY, "stream", "metrics", real=last_over_first, inputs=("norm",),
           unit="ratio", short="norm growth (last / first)", doc="`norm[L-1] / norm[0]`"),
    Metric("norm_max_over_min", SUMMARY, "stream", "metrics", real=max_over_min,
           inputs=("norm",), unit="ratio", short="norm max / min",
           doc="the largest `norm[l]` over the smallest"),
    Metric("mean_ang_prev", SUMMARY, "stream", "metrics", compute=mean, real=mean,
           inputs=("ang_prev",), unit="fraction of π",
           short="mean angular distance to the previous block", column="ang prev",
           in_summary=True, doc="mean of `ang_prev` over blocks"),
    Metric("last_fc_out_grad", SUMMARY, **_IN_GRADS, unit="L2 norm",
           label="gradient norm of the last MLP output weight", column="last fc_out g",
           in_summary=True, spread=True,
           doc="Frobenius norm of the gradient of `blocks.{L-1}.mlp.fn.fc_out.weight`, the last "
               "MLP output weight (Xiong et al. 2020, Theorem 1)"),
    Metric("embed_grad", SUMMARY, **_IN_GRADS, unit="L2 norm", spread=True,
           doc="Frobenius norm of the gradient of the embeddings"),
    Metric("head_grad", SUMMARY, **_IN_GRADS, unit="L2 norm", spread=True,
           doc="the same for the head's own weight (absent when it is tied to the embedding)"),
    Metric("total_grad", SUMMARY, **_IN_GRADS, unit="L2 norm", label="total gradient norm",
           in_summary=True, spread=True, doc="the same for all parameters"),
    Metric("threshold", SUMMARY, **_IN_DROP, unit="nats",
           doc="the `--drop-threshold` `n_costly` counts with"),
    Metric("kl_threshold", SUMMARY, **_IN_DROP, unit="nats",
           doc="the threshold `n_costly_kl` counts with (0.01)"),
    Metric("effective_depth", SUMMARY, **_IN_DROP, unit="blocks",
           label="effective depth (participation ratio of loss increases, blocks)",
           short="effective depth", column="eff depth", in_summary=True, spread=True,
           doc="mean over batches of the participation ratio `(Σ_t c_t)² / Σ_t c_t²` of the "
               "batch's drop costs `c_t = max(0, drop_dloss[t])`, in `[1, L]` (0 if no block "
               "costs anything)"),
    Metric("n_costly", SUMMARY, **_IN_DROP, unit="blocks", in_summary=True, spread=True,
           doc="mean over batches of the number of blocks whose removal costs more than "
               "`threshold`"),
    Metric("effective_depth_kl", SUMMARY, **_IN_DROP, unit="blocks",
           label="effective depth (participation ratio of KLs, blocks)",
           short="effective depth (KL)", column="eff depth KL", in_summary=True, spread=True,
           doc="the same from `drop_kl` (needs no labels, never negative)"),
    Metric("n_costly_kl", SUMMARY, **_IN_DROP, unit="blocks", in_summary=True, spread=True,
           doc="the same from `drop_kl`, with `kl_threshold`"),
    Metric("lens_norm", SUMMARY, **{**_IN_LENS, "unit": "text"},
           doc="which norm `lens_normed` applies, in words"),
    Metric("model_loss", SUMMARY, **_IN_LENS,
           doc="the model's loss, for reference (equal to `lens_normed[L-1]` when the model "
               "has a final norm)"),
    Metric("perturb_change", SUMMARY, **_IN_PERTURB, unit="squared L2 norm",
           label="output change under weight perturbation", column="perturb", in_summary=True,
           spread=True,
           doc="`E ‖f(x; w + δ) − f(x; w)‖²`, mean over tokens, draws and batches"),
    Metric("perturb_relative", SUMMARY, **_IN_PERTURB, unit="ratio", in_summary=True,
           doc="`perturb_change / E ‖f(x; w)‖²`"),
    Metric("perturb_eps", SUMMARY, **_IN_PERTURB, unit="relative",
           doc="the `--perturb-eps` used"),
    Metric("perturb_draws", SUMMARY, **_IN_PERTURB, unit="draws",
           doc="the `--perturb-draws` used"),
    Metric("update_size_final", SUMMARY, "update", "metrics", compute=last,
           inputs=("update_size",), unit="L2 norm", label="output change after the update steps",
           column="update", in_summary=True, doc="`update_size[K]`"),
    Metric("update_lr", SUMMARY, **_IN_UPDATE, unit="learning rate",
           doc="the `--update-lr` used"),
    Metric("update_warmup", SUMMARY, **_IN_UPDATE, unit="steps",
           doc="the `--update-warmup` used"),
    Metric("update_steps", SUMMARY, **_IN_UPDATE, unit="steps",
           doc="the `--update-steps` `K` used"),
    # -- per optimizer step (C7)
    Metric("update_size", SERIES, **_IN_UPDATE, unit="L2 norm",
           doc="mean over tokens of `‖f(x; θ_k) − f(x; θ_0)‖` on a fixed held-out batch, "
               "`k = 0..K`"),
    Metric("update_loss", SERIES, **_IN_UPDATE, unit="nats",
           doc="training loss at step `k` (before the step)"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


class UnknownMetric(LookupError):
    """A result key with no row in METRICS."""


def metric(name: str) -> Metric:
    try:
        return BY_NAME[name]
    except KeyError:
        raise UnknownMetric(f"{name!r} is not a probe metric: give it a row in METRICS "
                            "(normlab/probe/metrics.py)") from None


def place(key: str) -> str:
    """Where a key of a probe's raw result goes: PER_BLOCK, SUMMARY, SERIES or PER_BATCH (a
    metric's `_per_batch` rows); `<name>_std` is a summary. A key no row names is an error."""
    if key in BY_NAME:
        return BY_NAME[key].per
    base = BY_NAME.get(key.removesuffix("_std"))
    if key.endswith("_std") and base is not None and base.spread:
        return SUMMARY
    base = BY_NAME.get(key.removesuffix("_per_batch"))
    if key.endswith("_per_batch") and base is not None and base.per_batch:
        return PER_BATCH
    raise UnknownMetric(f"probe result key {key!r} has no row in METRICS "
                        "(normlab/probe/metrics.py): add one (its place, label, doc)")


def _normlab() -> list[Metric]:
    return [m for m in METRICS if m.compute is not None]


PROBES: tuple[str, ...] = tuple(dict.fromkeys(m.probe for m in _normlab()))
# Run only when asked for (`--probes skip`, `all`): `skip` runs one forward per block and batch,
# as `drop` does, and holds every block's contribution. A probe that trains a copy of the model
# (`update`) is left out of the defaults by its `needs`.
OPT_IN_PROBES: tuple[str, ...] = ("skip",)
DEFAULT_PROBES: tuple[str, ...] = tuple(
    p for p in PROBES if p not in OPT_IN_PROBES
    and not any(m.probe == p and m.needs == "training" for m in METRICS))


def probe_functions(probes: Iterable[str]) -> list[Callable[..., Any]]:
    """The functions that run the model for `probes`, each once, in the order of PROBES."""
    chosen = set(probes)
    out: list[Callable[..., Any]] = []
    for m in _normlab():
        if m.probe in chosen and m.needs != "metrics" and m.compute not in out:
            out.append(m.compute)
    return out


def of_metrics(model: str) -> list[Metric]:
    """The metrics computed from others, for `model` (NORMLAB or REAL), in table order."""
    return [m for m in METRICS if m.needs == "metrics" and (
        m.compute if model == NORMLAB else m.real) is not None]


def layer_drop_costs() -> list[Metric]:
    """The real-checkpoint layer-drop measures: `real(full, skipped)` per skipped block."""
    return [m for m in METRICS if m.probe == "drop" and m.per == PER_BLOCK and m.real]


# --- what the figures, the CLI and the report read -----------------------------------------

def figure_labels() -> dict[str, str]:
    return {m.name: m.label for m in METRICS if m.label}


def figure_captions() -> dict[str, str]:
    return {m.name: m.caption for m in METRICS if m.caption}


def log_scale() -> set[str]:
    return {m.name for m in METRICS if m.log_scale}


def matrices() -> set[str]:
    """The per-block metrics whose value per block is a row over blocks."""
    return {m.name for m in METRICS if m.matrix}


def per_block_columns() -> tuple[tuple[str, str], ...]:
    """(name, header) of the CLI's per-block table for normlab models, in table order."""
    return tuple((m.name, m.column) for m in _normlab() if m.per == PER_BLOCK and m.column)


def summary_keys() -> tuple[str, ...]:
    """The metrics of the CLI's summary table of one model."""
    return tuple(m.name for m in METRICS if m.in_summary)


def sweep_columns() -> tuple[tuple[str, str], ...]:
    """(name, header) of the CLI's summary table of a sweep, one row per model."""
    return tuple((m.name, m.column) for m in _normlab() if m.per == SUMMARY and m.column)


def column(name: str) -> str:
    """A metric's CLI header."""
    return metric(name).column or name


def report_labels() -> dict[str, str]:
    """The report's names of the metrics that have one, and of their spread (`<name>_std`)."""
    out = {m.name: m.short for m in METRICS if m.short}
    out |= {f"{m.name}_std": f"{m.short}, std" for m in METRICS if m.short and m.spread}
    return out
