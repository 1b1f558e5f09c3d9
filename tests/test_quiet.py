"""Third-party chatter stays out of normlab's output and the study's log: matplotlib's
`tight_layout` warning on a crowded figure, transformers' GGUF de-quantizing progress bar."""

from __future__ import annotations

import subprocess
import sys

from optional_packages import needs
from subprocess_env import subprocess_env

CROWDED = """
from normlab.report.figures import Curve, loss_curves_svg
label = "pre, " + "lr 0.001, warmup 10, " * 12
curves = [Curve(f"r{i}", f"{label}{i}", [(1, 3.0), (2, 2.5)], [(2, 2.6)]) for i in range(12)]
assert loss_curves_svg(curves)
"""


def test_a_crowded_figure_draws_without_the_tight_layout_warning(tmp_path):
    env = subprocess_env(MPLBACKEND="Agg")
    r = subprocess.run([sys.executable, "-c", CROWDED], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Tight layout" not in r.stderr and "Warning" not in r.stderr, r.stderr


@needs("transformers")
def test_the_gguf_loader_draws_no_progress_bar(capfd):
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from normlab.interop.checkpoints import quiet_gguf_progress

    shown = gguf_utils.tqdm
    with quiet_gguf_progress():
        # the call transformers makes while it converts a GGUF file's tensors
        for _ in gguf_utils.tqdm(range(5), desc="Converting and de-quantizing GGUF tensors..."):
            pass
    assert gguf_utils.tqdm is shown  # restored after the load
    captured = capfd.readouterr()
    assert "de-quantizing" not in captured.err + captured.out
