"""The side-by-side figure of real checkpoints (claim C12): one line per model against relative
depth `(l+1)/L`, so models of different depths share an axis.

Panels: stream norm (mean token norm after each block, log scale; dashed: the median token, which
ignores the few massive first-token activations of LLMs; the marker at depth 0 is the embedding
output), angular distance between consecutive blocks, the loss increase when each block is
skipped (models with an LM head), and the change of the final hidden state when each block is
skipped (every model).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter

from normlab.sweep.plotting import (
    legend_outside,
    new_figure,
    plain_log_ticks,
    save_figure,
    styles_for,
)


def _label(res: dict[str, Any]) -> str:
    m = res["model"]
    return (f"{res['checkpoint']['name']} ({m['placement']}-{m['norm']}, "
            f"{m['n_blocks']} blocks, d={m['d_model']})")


def comparison_figure(results: Sequence[dict[str, Any]], path: Path, title: str | None = None
                      ) -> Path:
    """Write the 2x2 comparison of `run_hf_probe` results to `path` (.svg or .png); each model
    in the style of its placement."""
    fig = new_figure(13, 11)
    axes = fig.subplots(2, 2)
    ax_norm, ax_ang, ax_loss, ax_hid = axes.flat
    no_head = []
    styles = styles_for([f"{r['model']['placement']} {k}" for k, r in enumerate(results)])
    for k, res in enumerate(results):
        st = styles[f"{res['model']['placement']} {k}"]
        c, mk = st.color, st.marker
        x = res["relative_depth"]
        pb = res["per_block"]
        label = _label(res)
        ax_norm.plot([0.0, *x], [res["summary"]["embed_norm"], *pb["norm"]], "-", marker=mk, ms=4,
                     color=c, label=f"{label}: mean token")
        ax_norm.plot(x, pb["norm_median"], "--", color=c, alpha=0.7, label="median token")
        ax_ang.plot(x, pb["ang_prev"], "-", marker=mk, ms=4, color=c, label=label)
        drop = res.get("drop") or {}
        if drop:
            L = res["model"]["n_blocks"]
            dx = [(i + 1) / L for i in drop["drop_blocks"]]
            # blocks chosen with --drop-blocks: markers only, nothing was measured in between
            line = "-" if len(dx) == L else "none"
            if "drop_dloss" in drop:
                what = "masked-token" if res["model"]["objective"] == "masked_lm" else "next-token"
                ax_loss.plot(dx, drop["drop_dloss"], linestyle=line, marker=mk, ms=4, color=c,
                             label=f"{label}: {what} loss")
            else:
                no_head.append(res["checkpoint"]["name"])
            ax_hid.plot(dx, drop["drop_hidden_cos"], linestyle=line, marker=mk, ms=4, color=c,
                        label=label)
            if "drop_pooled_cos" in drop:
                ax_hid.plot(dx, drop["drop_pooled_cos"], linestyle=":" if line == "-" else "none",
                            marker="x", ms=4, color=c, alpha=0.8,
                            label=f"{res['checkpoint']['name']}: mean-pooled embedding")
    ax_norm.set_yscale("log")
    plain_log_ticks(ax_norm.yaxis)
    ax_norm.set_title("stream norm after each block")
    ax_norm.set_ylabel("token norm (L2)")
    ax_ang.set_title("angular distance between consecutive blocks")
    ax_ang.set_ylabel("angle to the previous block (fraction of pi)")
    ax_ang.set_ylim(bottom=0)
    ax_loss.set_title("layer drop: loss increase when the block is skipped")
    ax_loss.set_ylabel("skipped - original (nats)")
    ax_loss.set_yscale("symlog", linthresh=0.1)
    ax_loss.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 1, 0.1: not 10^0
    for name in no_head:
        ax_loss.plot([], [], " ", label=f"{name}: no LM head in the checkpoint (see right)")
    ax_hid.set_title("layer drop: change of the final hidden state")
    ax_hid.set_ylabel("1 - cosine similarity to the full model's final state")
    ax_hid.set_ylim(bottom=0)
    for ax in axes.flat:
        ax.set_xlabel("relative depth: (block + 1) / blocks, block 0 = first")
        ax.set_xlim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        legend_outside(ax, below=True, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    names = "; ".join(_label(r) for r in results)
    caption = ("Real checkpoints side by side against relative depth (block + 1) / blocks, "
               "block 0 the first: the stream norm "
               "after each block (log scale; solid: mean token, dashed: median token, the "
               "marker at depth 0 is the embedding output), the angular distance between "
               "consecutive blocks, the loss increase in nats when each block is skipped "
               "(models with an LM head) and the change of the final hidden state when it is "
               f"skipped (blocks chosen with --drop-blocks: markers only, unjoined). One "
               f"forward pass per model on the same text: no seeds, no band. "
               f"Models: {names}.")
    alt = f"Four line charts comparing {names} block by block."
    return save_figure(fig, path, alt=alt, caption=caption)
