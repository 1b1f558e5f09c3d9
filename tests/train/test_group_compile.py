"""A stacked group honours `train.compile`: its forward and loss are compiled, shared by the
group (a member that differs in it trains in another group), and the compiled group's losses are
the eager group's."""

import pytest
import torch

from normlab.config import load_run_config
from normlab.nn.stacked import StackedTransformer
from normlab.sweep.grouping import GroupTask, plan_tasks
from normlab.sweep.spec import PlannedRun
from normlab.train.group import GroupError, check_group, run_unstackable_reason, train_group
from normlab.train.logging import read_metrics

TINY = ["model.n_blocks=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.log_every=1",
        "train.eval_every=0", "train.steps=3", "train.checkpoint_every=0", "train.device=cpu"]


def configs(*sets):
    return [load_run_config(None, [*TINY, f"train.lr={lr}", *sets]) for lr in (1e-3, 3e-3)]


def test_compile_is_shared_by_a_group():
    compiled = configs("train.compile=true")
    assert run_unstackable_reason(compiled[0]) is None
    with pytest.raises(GroupError, match="must share"):
        check_group([compiled[0], configs()[1]])
    runs = [PlannedRun(i, {}, c) for i, c in enumerate([*compiled, *configs()])]
    tasks, _ = plan_tasks(runs, "stacked", workers=1)
    assert [len(t.members) for t in tasks if isinstance(t, GroupTask)] == [2, 2]


def test_a_compiled_group_trains_as_the_eager_group(tmp_path, monkeypatch):
    compiled_modules = []
    real = torch.compile

    def spy(module, *args, **kwargs):
        compiled_modules.append(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    losses = {}
    for compiled in (False, True):
        cfgs = configs(f"train.compile={compiled}")
        summaries = train_group(cfgs, tmp_path / str(compiled))
        assert all(s["outcome"] == "stalled" for s in summaries.values()), summaries
        losses[compiled] = [r["train_loss"] for c in cfgs for r in
                            read_metrics(tmp_path / str(compiled) / c.run_id() / "metrics.jsonl")
                            if "train_loss" in r]
    assert [type(m) for m in compiled_modules] == [StackedTransformer]  # the compiled group's
    assert len(losses[True]) == 6
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
