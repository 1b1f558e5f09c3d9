"""The shared training loop (`normlab.train.loop`) on a toy kind of training: one weight per
member, fitted by clipped gradient steps in pure Python floats, so every number is exact. The
loop's cadences (evaluation, logging, checkpoints, kept weights), a member that diverges alone, a
stop and its resume, failures, signals and members that have nothing left to train; runs, groups
and fine-tuning on it are tested in tests/train/test_train.py, tests/train/test_batched.py and
tests/finetune/test_finetune.py."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, field
from typing import Any

import pytest

from normlab.config import TrainConfig, parse_config
from normlab.train.loop import Member, TrainLoop, checkpoint_due, eval_due, log_due


@dataclass(kw_only=True)
class Toy(Member):
    name: str
    w: float = 0.0
    grad: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)
    nan_at: int | None = None  # the step whose loss is NaN
    fail_at: int | None = None  # the step whose gradient raises


def toy(name: str, nan_at: int | None = None, fail_at: int | None = None,
        **settings: Any) -> Toy:
    tc = parse_config(TrainConfig, {"steps": 7, "lr": 0.05, "warmup": 2, "eval_every": 3,
                                    "log_every": 2, "checkpoint_every": 3,
                                    "block_stats_every": 0, "grad_clip": 1.0} | settings)
    return Toy(tc=tc, name=name, nan_at=nan_at, fail_at=fail_at)


class ToyLoop(TrainLoop):
    tokens_per_step = 8

    def __init__(self, members: list[Toy]) -> None:
        super().__init__(members)
        self.events: list[tuple] = []
        self.saved: dict[str, tuple[int, float, float]] = {}

    def gradients(self, lrs, stats_due):
        losses, norms = [], []
        for m in self.active:
            if m.fail_at == m.step + 1:
                raise OSError("disk full")
            x = float(m.step % 5) + 1.0
            m.grad = 2.0 * (m.w * x - 2.0) * x
            losses.append(math.nan if m.nan_at == m.step + 1 else (m.w * x - 2.0) ** 2)
            norms.append(abs(m.grad))
        return losses, norms

    def update(self, rows, lrs):
        assert len(rows) == len(self.active) == len(lrs)
        for m, lr in zip(self.active, lrs, strict=True):
            g = m.grad
            if m.tc.grad_clip is not None and abs(g) > m.tc.grad_clip:
                g *= m.tc.grad_clip / abs(g)
            m.w -= lr * g

    def evaluate(self, due):
        return [{"val_loss": (m.w * 3.0 - 2.0) ** 2, "extra": m.step} if d else None
                for m, d in zip(self.active, due, strict=True)]

    def write(self, m, record):
        m.records.append({k: v for k, v in record.items() if k not in ("time_s", "tokens_per_s")})

    def checkpoint(self, row):
        m = self.active[row]
        if m.name == "broken" and m.step == 3:
            raise OSError("no space")
        self.saved[m.name] = (m.step, m.w, m.best_val)
        self.events.append(("checkpoint", m.name, m.step))

    def keep_weights(self, row):
        self.events.append(("kept", self.active[row].name, self.active[row].step))

    def finish(self, m, outcome, reason=None, **extra):
        self.events.append(("end", m.name, outcome, m.step, reason))


def alone(name: str, **settings: Any) -> Toy:
    m = toy(name, **settings)
    ToyLoop([m]).run()
    return m


def test_the_cadences():
    tc = toy("a").tc
    assert [s for s in range(1, 8) if eval_due(tc, s)] == [3, 6, 7]
    assert [s for s in range(1, 8) if checkpoint_due(tc, s)] == [3, 6, 7]
    assert [s for s in range(1, 8) if log_due(tc, s, {})] == [2, 4, 6, 7]
    assert log_due(tc, 5, {"val_loss": 1.0}) and not log_due(tc, 5, {})
    stats = toy("b", block_stats_every=5).tc
    assert [s for s in range(1, 8) if log_due(stats, s, {})] == [2, 4, 5, 6, 7]


def test_members_train_together_as_alone_with_their_own_cadences():
    b = toy("b", steps=4, lr=0.2, log_every=1, eval_every=0, checkpoint_every=0,
            keep_checkpoints=True, grad_clip=None)
    a_kept = toy("a", keep_checkpoints=True)
    loop = ToyLoop([a_kept, b])
    loop.run()
    assert (a_kept.w, a_kept.records) == ((ref := alone("a")).w, ref.records)
    assert (b.w, b.records) == ((ref := alone("b", steps=4, lr=0.2, log_every=1, eval_every=0,
                                                checkpoint_every=0, grad_clip=None)).w,
                                ref.records)
    assert [r["step"] for r in a_kept.records] == [2, 3, 4, 6, 7]  # logged, or evaluated
    assert [r["step"] for r in a_kept.records if "val_loss" in r] == [3, 6, 7]
    assert [r["step"] for r in b.records] == [1, 2, 3, 4]
    assert [r["step"] for r in b.records if "val_loss" in r] == [4]  # eval_every 0: the last
    assert loop.events == [  # kept weights at a periodic checkpoint only, never at the last
        ("checkpoint", "a", 3), ("kept", "a", 3), ("checkpoint", "b", 4), ("end", "b",
                                                                           "completed", 4, None),
        ("checkpoint", "a", 6), ("kept", "a", 6), ("checkpoint", "a", 7),
        ("end", "a", "completed", 7, None)]
    record = a_kept.records[1]  # step 3: the step's record, then the evaluation
    assert list(record) == ["step", "train_loss", "lr", "grad_norm", "val_loss", "extra"]
    assert a_kept.best_val == min(r["val_loss"] for r in a_kept.records if "val_loss" in r)
    assert a_kept.val_step == 7 and a_kept.final["val_loss"] == a_kept.records[-1]["val_loss"]
    assert a_kept.final["train_loss"] == a_kept.records[-1]["train_loss"]
    assert a_kept.outcome == b.outcome == "completed"


def test_a_diverged_member_stops_before_its_update_and_the_others_go_on():
    a, b = toy("a"), toy("b", nan_at=4)
    loop = ToyLoop([a, b])
    loop.run()
    assert (a.w, a.records) == ((ref := alone("a")).w, ref.records)
    assert b.outcome == "diverged" and b.step == 4
    assert b.records[-1]["diverged"] == "nonfinite_loss" and math.isnan(b.final["train_loss"])
    three = toy("b")
    ToyLoop([three]).run(interrupt_at=3)
    assert b.w == three.w  # no update at the diverged step
    assert ("end", "b", "diverged", 4, "nonfinite_loss") in loop.events


def test_a_stop_checkpoints_and_a_resume_continues_exactly():
    a, b = toy("a"), toy("b", lr=0.1)
    loop = ToyLoop([a, b])
    loop.run(interrupt_at=4)
    assert loop.events[-4:] == [("checkpoint", "a", 4), ("end", "a", "interrupted", 4,
                                                          "requested"),
                                ("checkpoint", "b", 4), ("end", "b", "interrupted", 4,
                                                          "requested")]
    resumed = []
    for m in (a, b):  # from what the checkpoint saved
        step, w, best = loop.saved[m.name]
        resumed.append(Toy(tc=m.tc, name=m.name, step=step, start=step, w=w, best_val=best))
    ToyLoop(resumed).run()
    for m, settings in zip(resumed, ({}, {"lr": 0.1}), strict=True):
        ref = alone(m.name, **settings)
        assert m.w == ref.w and m.outcome == "completed"
        assert m.records == [r for r in ref.records if r["step"] > 4]


def test_a_failure_ends_the_members_still_training_and_keeps_an_ended_ones_end():
    a, b, c = toy("a", steps=3), toy("broken"), toy("c")
    loop = ToyLoop([a, b, c])
    loop.run()  # step 3: a ends (its row first), then b's checkpoint raises
    assert [m.outcome for m in (a, b, c)] == ["completed", "failed", "failed"]
    assert ("end", "broken", "failed", 3, "OSError") in loop.events
    assert ("end", "c", "failed", 3, "OSError") in loop.events
    d = toy("d", fail_at=2)
    loop = ToyLoop([d])
    loop.records_failures = False  # (fine-tuning's: an error is the caller's)
    with pytest.raises(OSError, match="disk full"):
        loop.run()


class SignalledLoop(ToyLoop):
    def gradients(self, lrs, stats_due):
        out = super().gradients(lrs, stats_due)
        if self.active[0].step == 1:
            signal.raise_signal(signal.SIGINT)  # as Ctrl-C during step 2
        return out


def test_a_signal_stops_every_member_after_the_step():
    a, b = toy("a"), toy("b")
    loop = SignalledLoop([a, b])
    loop.run()
    assert [(m.outcome, m.step) for m in (a, b)] == [("interrupted", 2)] * 2
    assert ("checkpoint", "a", 2) in loop.events
    assert ("end", "b", "interrupted", 2, "signal") in loop.events
    loop = SignalledLoop([toy("c")])
    loop.stops_on_signal = False  # (fine-tuning's: a signal acts as it does anywhere)
    # Python's own Ctrl-C handler, whatever this process had (a pytest-xdist worker ignores
    # SIGINT, leaving it to the controller)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run()
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_member_with_no_step_left_ends_at_once():
    done = Toy(tc=toy("a").tc, name="done", step=7, start=7, w=0.5)
    loop = ToyLoop([done, toy("b")])
    loop.run()
    assert loop.events[:2] == [("checkpoint", "done", 7), ("end", "done", "completed", 7, None)]
    assert done.records == [] and done.w == 0.5


def test_the_three_kinds_of_training_share_the_loop():
    from normlab.finetune.loop import _FinetuneLoop
    from normlab.train.group import _GroupLoop
    from normlab.train.trainer import RunLoop, _SingleLoop

    assert issubclass(_SingleLoop, RunLoop) and issubclass(_GroupLoop, RunLoop)
    assert issubclass(RunLoop, TrainLoop) and issubclass(_FinetuneLoop, TrainLoop)
    for kind in (_SingleLoop, _GroupLoop, _FinetuneLoop):  # the loop itself is never rewritten
        for name in ("run", "train_step", "after_step", "drop", "end"):
            assert getattr(kind, name) is getattr(TrainLoop, name), (kind, name)
