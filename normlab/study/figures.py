"""Study figures not covered by the probe figures: loss curves of runs (mean over seeds with a
min-max band), bar charts of means with 95% intervals, and the theory claims' ladders, in the
placement styles of `normlab.sweep.plotting` (Agg canvas, no pyplot; the format follows the
file suffix, .svg or .png)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from normlab.study.verdict import base_subject
from normlab.sweep.plotting import (
    legend_outside,
    mean_band,
    new_figure,
    save_figure,
    seeds_text,
    styles_for,
)
from normlab.train.logging import read_metrics

LOSS_UNIT = "nats/byte"  # byte-level models: cross-entropy per byte


def _points(rows: Sequence[Mapping], key: str) -> dict[int, float]:
    return {r["step"]: float(r[key]) for r in rows
            if isinstance(r.get(key), int | float) and math.isfinite(r[key])
            and isinstance(r.get("step"), int)}


def _aligned(per_run: list[dict[int, float]]) -> tuple[list[int], list[list[float]]]:
    """Steps logged by any run, and each run's values at those steps (NaN where it has none, e.g.
    after it diverged)."""
    steps = sorted({s for pts in per_run for s in pts})
    return steps, [[pts.get(s, math.nan) for s in steps] for pts in per_run]


def plot_curves(runs_root: Path, runs: Mapping[str, str | Sequence[str]], path: Path,
                title: str = "") -> Path | None:
    """Training loss of each `label -> run_id` (or `label -> [run_id per seed]`: the mean over
    the seeds with a min-max band); validation points as hollow markers, an x where a run
    diverged."""
    fig = new_figure(8.2, 4.2)
    ax = fig.subplots()
    styles = styles_for(list(runs))
    counts, drawn = [], []
    on_axes: dict[str, list[float]] = {}
    for k, (label, ids) in enumerate(runs.items()):
        ids = [ids] if isinstance(ids, str) else list(ids)
        rows = [read_metrics(runs_root / run_id / "metrics.jsonl") for run_id in ids]
        steps, train = _aligned([_points(r, "train_loss") for r in rows])
        if not steps:
            continue
        st = styles[label]
        counts.append(mean_band(ax, steps, train, st, label, order=k, drawn=on_axes))
        vsteps, val = _aligned([_points(r, "val_loss") for r in rows])
        if vsteps:
            means = [sum(v) / len(v) for v in zip(*val, strict=True)]
            ax.plot(vsteps, means, linestyle="none", marker=st.marker, markersize=7,
                    markerfacecolor="white", markeredgecolor=st.color, zorder=10)
        for r in rows:
            div = [m for m in r if m.get("diverged")]
            if div:
                last = [m for m in r if isinstance(m.get("train_loss"), float)
                        and math.isfinite(m["train_loss"])]
                if last:
                    ax.plot(last[-1]["step"], last[-1]["train_loss"], "x", color=st.color,
                            markersize=9, markeredgewidth=2, zorder=11)
        drawn.append(label)
    if not drawn:
        return None
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss ({LOSS_UNIT})")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    legend_outside(ax)
    fig.tight_layout()
    caption = (f"Training loss against step{' (' + title + ')' if title else ''}, one line per "
               f"setting ({'; '.join(drawn)}); {seeds_text(counts)}. Hollow markers: validation "
               "loss at the evaluation steps (mean over the seeds); x: the last finite loss of a "
               "run that diverged.")
    alt = f"Line chart: training loss in {LOSS_UNIT} against step for {'; '.join(drawn)}."
    return save_figure(fig, path, alt=alt, caption=caption)


def _with_unit(ylabel: str) -> str:
    return f"{ylabel} ({LOSS_UNIT})" if "loss" in ylabel and "(" not in ylabel else ylabel


def plot_bars(values: Mapping[str, Mapping], path: Path, ylabel: str, title: str = ""
              ) -> Path | None:
    """`label -> {"mean", "ci95": [lo, hi], "n"}` as bars with 95% interval whiskers, coloured by
    the placement each label names."""
    labels = [k for k, v in values.items() if math.isfinite(v.get("mean", math.nan))]
    if not labels:
        return None
    means = [values[k]["mean"] for k in labels]

    def bound(k: str, i: int, m: float) -> float:
        ci = values[k].get("ci95") or [m, m]
        return ci[i] if isinstance(ci[i], int | float) and math.isfinite(ci[i]) else m

    err = [[max(0.0, m - bound(k, 0, m)) for k, m in zip(labels, means, strict=True)],
           [max(0.0, bound(k, 1, m) - m) for k, m in zip(labels, means, strict=True)]]
    styles = styles_for(labels)
    fig = new_figure(max(4.2, 1.2 * len(labels) + 1.6), 3.9)
    ax = fig.subplots()
    for i, k in enumerate(labels):
        st = styles[k]
        ax.bar(i, means[i], yerr=[[err[0][i]], [err[1][i]]], capsize=4,
               color="white" if st.hollow else st.color, edgecolor=st.color, linewidth=1.5,
               hatch="//" if st.hollow else None)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    low = min(m - e for m, e in zip(means, err[0], strict=True))
    ax.set_ylim(bottom=max(0.0, low - 0.2 * (max(means) - low + 0.1)))
    ax.set_ylabel(_with_unit(ylabel), fontsize=9)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    ns = sorted({values[k].get("n") for k in labels if isinstance(values[k].get("n"), int)})
    n_text = f" over {'/'.join(map(str, ns))} seeds" if ns else ""
    caption = (f"{_with_unit(ylabel)[:1].upper() + _with_unit(ylabel)[1:]}: bar = mean{n_text}, "
               f"whisker = 95% t-interval{'; ' + title if title else ''}.")
    alt = f"Bar chart of {ylabel} for {'; '.join(labels)}."
    return save_figure(fig, path, alt=alt, caption=caption)


VERDICT_COLORS = {"supported": "#009E73", "not supported": "#D55E00", "inconclusive": "#777777"}


def plot_ladder(rows: Sequence[Mapping[str, Any]], path: Path, quantities: Mapping[str, str],
                title: str = "") -> Path | None:
    """A theory claim's ladder: one panel per prediction, the measured value with its 95%
    interval on each rung (source setting first, normlab's block last), each point coloured by
    its verdict and, behind it, the band or threshold that rung's own prediction tested it
    against (`expected_shape` of its `expected`): a prediction can change from rung to rung
    (C1's FFN-only source rung predicts d/2 +- d/4, the others 0.5-1.5 or the mechanism's
    1 +- 0.5), so one band drawn across every rung would contradict the verdicts."""
    subjects = [s for s in quantities if any(base_subject(p["subject"]) == s for r in rows
                                             for p in r["predictions"])]
    if not rows or not subjects:
        return None
    n = len(rows)
    fig = new_figure(max(5.5, 0.75 * n + 2.5), 2.1 * len(subjects) + 1.2)
    axes = fig.subplots(len(subjects), 1, squeeze=False, sharex=True)[:, 0]
    for ax, subject in zip(axes, subjects, strict=True):
        expected: list[str] = []
        for i, row in enumerate(rows):
            pred = next((p for p in row["predictions"]
                         if base_subject(p["subject"]) == subject), None)
            expected.append(pred["effect"]["expected"] if pred else "")
            if pred is None:
                continue
            e = pred["effect"]
            est, lo, hi = e["estimate"], e["ci_low"], e["ci_high"]
            if not all(isinstance(v, int | float) and math.isfinite(v) for v in (est, lo, hi)):
                continue
            color = VERDICT_COLORS.get(pred["verdict"], "#777777")
            ax.errorbar(i, est, yerr=[[est - lo], [hi - est]], fmt="o", color=color, capsize=4,
                        markersize=6, markerfacecolor="white" if row["calibration"] else color)
        _shade_expected(ax, expected)
        ax.set_ylabel(quantities[subject], fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    axes[-1].set_xticks(range(n), [r["rung"] for r in rows], rotation=25, ha="right",
                        fontsize=8)
    cal = sum(1 for r in rows if r["calibration"])
    for ax in axes:
        ax.axvspan(-0.5, cal - 0.5, color="#E69F00", alpha=0.08, linewidth=0)
        ax.set_xlim(-0.5, n - 0.5)
    if title:
        axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    caption = ("Each panel is one prediction; points are the mean over seeds with the 95% "
               "t-interval, green supported, orange not supported, grey inconclusive; hollow "
               "points and the tinted region are the source's own setting (the calibration); "
               "the grey band or dashed line behind each rung is what that rung's prediction "
               "expects (its 'expected' in the ladder table). Rungs left to right change one "
               "thing each toward normlab's block.")
    alt = f"Ladder of {', '.join(subjects)} from the source's setting to normlab's block."
    return save_figure(fig, path, alt=alt, caption=caption)


_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf"


def expected_shape(expected: str) -> tuple[str, float, float] | None:
    """A prediction's `expected` (`normlab.study.verdict`: "in [a, b]", "> t", "< t", ...) as
    ("band", a, b) or (the comparison, t, t); None for a text that names no number."""
    band = re.fullmatch(rf"\s*in \[({_NUMBER}), ({_NUMBER})\]\s*", expected)
    if band:
        return "band", float(band.group(1)), float(band.group(2))
    one = re.fullmatch(rf"\s*(>=|<=|>|<)\s*({_NUMBER})\s*", expected)
    if one:
        return one.group(1), float(one.group(2)), float(one.group(2))
    return None


def _shade_expected(ax, expected: Sequence[str]) -> None:
    """Behind each rung i, the band (`in [a, b]`) of `expected[i]` shaded, or its threshold
    (`> t`) drawn as a dashed line; neighbouring rungs that expect the same are one span."""
    panel = ax.figure.axes.index(ax)  # gids are ids in the report's page: unique per figure
    i = 0
    while i < len(expected):
        j = i
        while j + 1 < len(expected) and expected[j + 1] == expected[i]:
            j += 1
        shape = expected_shape(expected[i])
        if shape is not None:
            kind, a, b = shape
            if kind == "band":
                ax.fill_between([i - 0.5, j + 0.5], a, b, color="#999999", alpha=0.2,
                                linewidth=0, gid=f"expected-{panel}-{i}")
            else:
                ax.hlines(a, i - 0.5, j + 0.5, color="#555555", linewidth=1, linestyle="--",
                          gid=f"expected-{panel}-{i}")
        i = j + 1
