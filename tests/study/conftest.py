"""Fixtures that the study's test files share."""

from __future__ import annotations

import pytest

# -- the experiments on real (tiny) runs ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    """Pre and post runs of 5 blocks (3 interior), 2 seeds, trained a few steps."""
    from pretrained_pairs import pretrained_pairs

    return pretrained_pairs(tmp_path_factory.mktemp("runs"), blocks=5, steps=6)
