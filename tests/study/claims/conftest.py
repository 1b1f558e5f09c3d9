"""The claim tests' figures: recorded, not drawn (`stub_figures`, tests/conftest.py), unless a test
is marked `draws`."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def figure_calls(stub_figures):
    """What each claim would draw: its ladder, bar, curve and per-block figures, in one list."""
    import normlab.probe.figures
    import normlab.study.figures
    from normlab.study.claims import ladder

    calls = stub_figures(ladder, ["plot_ladder"])
    calls = stub_figures(normlab.study.figures, ["plot_bars", "plot_curves"], calls)
    return stub_figures(normlab.probe.figures, ["plot_per_block"], calls)
