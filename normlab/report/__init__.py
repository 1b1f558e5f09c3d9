"""Reports: one self-contained HTML file of a study's verdicts or of a folder of runs/sweeps.

    render("study/quick")          # -> study/quick/report.html
    render("runs", out="r.html")   # runs table, loss curves by placement, stability maps
"""

from normlab.report.html import build_html, render
from normlab.report.study import ReportError

__all__ = ["ReportError", "build_html", "render"]
