"""docs/probes.md's lists of measures from the table of probe metrics (`normlab.probe.metrics`):
one list per probe, and one of the measures only real checkpoints have.

    python scripts/probe_docs.py           # rewrite the lists of measures in docs/probes.md
    python scripts/probe_docs.py --check   # exit 1 when docs/probes.md is not what this writes

Each list sits between a begin and an end comment naming its group; the prose around them is
the page's own and is left as it is.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

import doc_writer

from normlab.probe import metrics
from normlab.probe.metrics import PER_BLOCK, REAL, SERIES, SUMMARY, Metric

DOC = Path(__file__).resolve().parents[1] / "docs" / "probes.md"
_PER_WORDS = {PER_BLOCK: "block", SUMMARY: "model", SERIES: "step"}
_SPAN = re.compile(r"(<!-- measures of `(?P<group>[\w-]+)`: written by `python "
                   r"scripts/probe_docs\.py` -->\n).*?(<!-- end of the measures of "
                   r"`(?P=group)` -->)", re.S)


def doc_groups() -> dict[str, list[Metric]]:
    """The metrics of each list in docs/probes.md: one per probe, and `real` for the ones only
    real checkpoints have."""
    groups: dict[str, list[Metric]] = {p: [] for p in metrics.PROBES}
    groups[REAL] = []
    for m in metrics.METRICS:
        groups[m.probe if m.compute is not None else REAL].append(m)
    return groups


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def measures_table(rows: Sequence[Metric]) -> str:
    """The markdown table of `rows`: key, per, unit, what it needs, on real checkpoints, and
    its definition (with the `_std` and `_per_batch` keys that come with it)."""
    lines = ["| key | per | unit | needs | real checkpoints | definition |",
             "|---|---|---|---|---|---|"]
    for m in rows:
        needs = ", ".join(f"`{i}`" for i in m.inputs) if m.needs == "metrics" else m.needs
        doc = m.doc
        if m.spread:
            doc += f"; with `{m.name}_std`, its standard deviation over batches"
        if m.per_batch:
            doc += f"; `{m.name}_per_batch` holds each batch's row"
        lines.append(f"| `{m.name}` | {_PER_WORDS[m.per]} | {_cell(m.unit)} | {needs} | "
                     f"{'yes' if m.real else ''} | {_cell(doc)} |")
    return "\n".join(lines) + "\n"


def render(text: str | None = None) -> str:
    """docs/probes.md (or `text`) with every list of measures written from METRICS. Each list
    sits between a begin and an end comment naming its group (a probe, or `real`); a group
    without its list, or a list of no group, is an error."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    groups = doc_groups()
    found = [m.group("group") for m in _SPAN.finditer(text)]
    missing = [g for g in groups if g not in found]
    unknown = [g for g in found if g not in groups]
    if missing or unknown:
        raise ValueError(
            (f"docs/probes.md has no list of the measures of {', '.join(missing)}: add a "
             "section with the begin and end comments of its list (as the others have)"
             if missing else "") +
            (f"docs/probes.md lists measures of {', '.join(unknown)}, which no row of "
             "METRICS has" if unknown else ""))
    return _SPAN.sub(lambda s: s.group(1) + measures_table(groups[s.group("group")])
                     + s.group(3), text)


def main(argv: list[str] | None = None) -> int:
    return doc_writer.main(argv, prog="python scripts/probe_docs.py",
                           description="write docs/probes.md's lists of measures from the "
                                       "table of probe metrics",
                           default=DOC, render=render)


if __name__ == "__main__":
    sys.exit(main())
