"""A small sweep on a GPU: 2 placements x 2 learning rates with `train.device` set to the GPU, on
2 local workers. Under `engine: auto` the runs of one shape train stacked on a GPU (the case
stacking was made for), every run is recorded as trained there, and a second invocation finds
them finished and trains nothing."""

from __future__ import annotations

import yaml
from gpu_helpers import DEVICE, needs_gpu

from normlab.sweep import collect, plan_sweep, run_sweep

pytestmark = needs_gpu

SPEC = f"""
name: gpu-sweep
base:
  model: {{n_blocks: 2, d_model: 64, n_heads: 4, max_seq_len: 64}}
  data: {{seq_len: 64}}
  train: {{steps: 12, batch_size: 8, eval_batches: 2, eval_every: 6, log_every: 1,
          checkpoint_every: 6, device: {DEVICE}}}
axes:
  model.placement: [pre, post]
  train.lr: [1e-3, 3e-3]
"""


def test_a_sweep_trains_on_the_gpu_stacked(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    plan = plan_sweep(spec)
    assert len(plan.runs) == 4
    result = run_sweep(plan, tmp_path / "sweep", workers=2, progress=False)
    assert result.ok and set(result.outcomes) == set(plan.run_ids)
    assert set(result.outcomes.values()) <= {"stalled", "completed"}
    for run_id in plan.run_ids:
        s = result.summaries[run_id]
        assert s["step"] == 12
        if DEVICE == "cuda":  # (on the CPU, `auto` stacks only where it measured that it pays)
            assert (s.get("engine"), s.get("group_size")) == ("stacked", 2), s
        meta = yaml.safe_load((tmp_path / "sweep" / run_id / "config.yaml").read_text())["meta"]
        assert meta["device"].startswith(DEVICE)
    table = collect(tmp_path / "sweep")
    assert len(table.rows) == 4 and table.axes == ["model.placement", "train.lr"]
    again = run_sweep(plan, tmp_path / "sweep", workers=2, progress=False)
    assert again.skipped == 4 and again.outcomes == result.outcomes
