"""The training loop that single runs, stacked groups and fine-tuning share.

A `TrainLoop` trains one or more members (a run, each run of a stacked group, a fine-tuning at
one lr), each with its own step, its own `TrainConfig` (the lr schedule, clipping and the
cadences of evaluation, logging, block statistics and checkpoints) and its own records. The loop
owns what every kind of training does alike, written once here:

    stop        on SIGINT/SIGTERM or at `interrupt_at`: checkpoint, end `interrupted`
    step        each member's lr from its schedule (`lr_at`), forward and backward, then per
                member: step + 1, the step's record, the divergence check before its update
                (a diverged member ends `diverged` and leaves; the others go on), block
                statistics, then clipping and the optimizer step of the members kept
    after it    evaluation when due (`eval_due`), the record logged when due (`log_due`), a
                checkpoint when due (`checkpoint_due`: the cadence and the last step; kept
                weights with `keep_checkpoints`), the end of a member at its last step
    failure     an exception ends every member still training `failed` (failure is data)
    resume      a member starts at the step its checkpoint restored (`start`, `step`)

A kind of training subclasses `TrainLoop` and says how its members step and what it records:
`gradients` (forward and backward of every member's batch of its step: losses and gradient
norms), `update` (clipping and the optimizer step), `evaluate`, `write` (a record), `checkpoint`,
`finish` (a member's end), `show` (progress). The single run (`normlab.train.trainer`) and the
stacked group (`normlab.train.group`) share their run-folder records through
`normlab.train.trainer.RunLoop`; fine-tuning (`normlab.finetune.loop`) keeps a loss curve in
memory, evaluates once after the loop and has no checkpoints. The loop computes nothing a
member's numbers depend on but its lr, and calls the hooks in one fixed order, so a resumed run
continues its curve exactly.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from normlab.config import TrainConfig
from normlab.train.divergence import SpikeDetector, divergence_reason, nonfinite_reason
from normlab.train.schedules import lr_at


# -- cadences ------------------------------------------------------------------------------------
def eval_due(tc: TrainConfig, step: int) -> bool:
    """Whether the run evaluates after `step`: every `eval_every` steps and after the last."""
    return bool(tc.eval_every and step % tc.eval_every == 0) or step == tc.steps


# The default cadence of per-block statistics: on logged steps, at most once in this many steps.
# A statistics step costs 0.7% more than a plain step at the default shape, 13% at 24 blocks of
# width 64 and 37% of a 2.7 ms step (benchmarks/bench_logging.py, docs/performance.md); once in
# 10 steps keeps the overhead under 5% at all of them.
BLOCK_STATS_MIN_EVERY = 10


def block_stats_every(tc: TrainConfig) -> int:
    """The steps between per-block statistics (0: none): `block_stats_every` when set, else the
    smallest multiple of `log_every` that is at least `BLOCK_STATS_MIN_EVERY`."""
    if tc.block_stats_every is not None:
        return tc.block_stats_every
    return tc.log_every * -(-BLOCK_STATS_MIN_EVERY // tc.log_every)


def block_stats_due(tc: TrainConfig, step: int) -> bool:
    """Whether per-block statistics are recorded at `step` (see `block_stats_every`)."""
    every = block_stats_every(tc)
    return bool(every) and step % every == 0


def log_due(tc: TrainConfig, step: int, record: dict[str, Any]) -> bool:
    """Whether the record of `step` is logged: every `log_every` steps, at the last, and with an
    evaluation or block statistics in it."""
    return (step % tc.log_every == 0 or step == tc.steps or "val_loss" in record
            or block_stats_due(tc, step))


def checkpoint_due(tc: TrainConfig, step: int) -> bool:
    """Whether a checkpoint is written after `step`: every `checkpoint_every` steps and at the
    last (a stop writes one too)."""
    return step == tc.steps or bool(tc.checkpoint_every and step % tc.checkpoint_every == 0)


# -- stopping ------------------------------------------------------------------------------------
class StopFlag:
    """SIGINT/SIGTERM set a flag; the loop checkpoints and stops at the next step boundary."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self.signal = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _NoStop:
    """For a loop that signals do not stop (one without checkpoints): they act as usual."""

    signal = None

    def __enter__(self) -> _NoStop:
        return self

    def __exit__(self, *exc) -> None:
        return None


# -- the loop ------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Member:
    """One run the loop trains: its settings (`tc`: steps, schedule, clipping, cadences), the
    step it has done, the step it started from, its spike detector (None: only a non-finite loss
    or gradient stops it), its best validation loss, its latest numbers (`final`: the last
    train loss and evaluation), the step of its last evaluation and, once it has ended, its
    outcome."""

    tc: TrainConfig
    step: int = 0
    start: int = 0
    spike: SpikeDetector | None = None
    best_val: float = float("inf")
    final: dict[str, Any] = field(default_factory=dict)
    val_step: int | None = None
    outcome: str | None = None


class TrainLoop:
    """The loop of the module docstring over `members`; `active` are those still training, in
    the order of the rows of the step's tensors (a member that ends leaves it).

    A subclass implements `gradients` and `update` and the records it keeps (`write`, `finish`,
    and as it needs them `begin`, `evaluate`, `block_stats`, `checkpoint`, `keep_weights`,
    `show`, `keep_rows`, `close`); the class attributes say what the kind of training does."""

    stops_on_signal = True  # SIGINT/SIGTERM stop it at a step boundary (else they act as usual)
    records_failures = True  # an exception ends the members `failed` (else it propagates)
    evaluates = True  # evaluates when `eval_due` (else: never inside the loop)
    checkpoints = True  # checkpoints when `checkpoint_due` and on a stop
    tokens_per_step = 0  # of one member's step: the `tokens_per_s` of its records

    def __init__(self, members: list[Member]) -> None:
        self.members = list(members)
        self.active = list(members)
        self.t_start = time.perf_counter()

    # -- what a kind of training says ------------------------------------------------------------
    def gradients(self, lrs: list[float], stats_due: list[bool]
                  ) -> tuple[list[float], list[float]]:
        """Forward and backward of each active member's batches of its step (capturing what
        block statistics need where `stats_due`): each one's training loss and gradient norm."""
        raise NotImplementedError

    def update(self, rows: list[int], lrs: list[float]) -> None:
        """Clip and take the optimizer step of the members still active after the divergence
        checks (`rows`: their rows in the step's `gradients`; `lrs`: their learning rates), and
        free the gradients."""
        raise NotImplementedError

    def write(self, m: Member, record: dict[str, Any]) -> None:
        """Log one record of `m` (a logged step's, or the diverged step's)."""
        raise NotImplementedError

    def finish(self, m: Member, outcome: str, reason: str | None = None, **extra: Any) -> None:
        """Record the end of `m` (`outcome`, its `reason` and summary fields)."""
        raise NotImplementedError

    def divergence(self, m: Member, loss: float, grad_norm: float) -> str | None:
        """Why `m` stops as diverged at this step (before its update), or None."""
        if m.spike is None:
            return nonfinite_reason(loss, grad_norm)
        return divergence_reason(loss, grad_norm, m.spike)

    def evaluate(self, due: list[bool]) -> list[dict[str, Any] | None]:
        """The evaluation of each active member where `due`: `val_loss` first, then what else
        its records hold (`token_share`, accuracies, bits per byte)."""
        raise NotImplementedError

    def block_stats(self, row: int) -> dict[str, float]:
        """The block statistics of the step's row `row` (where they were due)."""
        return {}

    def stop_reasons(self, signalled: bool, interrupt_at: int | None) -> list[str | None]:
        """Why each active member stops before its next step (`signal`, `requested`), or None."""
        return ["signal" if signalled else "requested"
                if interrupt_at is not None and m.step >= interrupt_at else None
                for m in self.active]

    def begin(self) -> None:
        """Before the first step (the records that say the members are training)."""

    def sync_records(self, row: int) -> None:
        """Put the records of the active member of `row` on the disk (before its checkpoint:
        a resume continues from the records the checkpoint's step had)."""

    def checkpoint(self, row: int) -> None:
        """Save the active member of `row` (to continue it from its step)."""

    def keep_weights(self, row: int) -> None:
        """Keep the weights of the checkpoint just saved (`keep_checkpoints`)."""

    def end_trained(self, m: Member) -> None:
        """End a member that trained all its steps."""
        self.end(m, "completed")

    def show(self, records: list[dict[str, Any]], dt: float) -> None:
        """Progress after a step of `dt` seconds (`records`: the members' records)."""

    def keep_rows(self, rows: list[int]) -> None:
        """The members of these rows are kept (the others have ended): the step's tensors
        follow."""

    def close(self) -> None:
        """After the loop, however it ended."""

    # -- the loop --------------------------------------------------------------------------------
    def end(self, m: Member, outcome: str, reason: str | None = None, **extra: Any) -> None:
        self.finish(m, outcome, reason, **extra)
        m.outcome = outcome  # (after: a member whose end failed to be recorded ends `failed`)

    def drop(self, rows: list[int]) -> list[int]:
        """Remove these members from `active` (they have ended); returns the rows kept."""
        gone = set(rows)
        keep = [r for r in range(len(self.active)) if r not in gone]
        if rows:
            self.active = [self.active[r] for r in keep]
            if keep:
                self.keep_rows(keep)
        return keep

    def run(self, interrupt_at: int | None = None, signalled: bool = False) -> None:
        """Train every member to its last step, or until it diverges or stops (`interrupt_at`:
        each member stops at that step as on a signal; `signalled`: stop them all at once)."""
        self.begin()
        self.t_start = time.perf_counter()
        try:
            with StopFlag() if self.stops_on_signal else _NoStop() as stop:
                ended = [r for r, m in enumerate(self.active) if m.step >= m.tc.steps]
                for r in ended:  # stopped after its last checkpoint, before it was recorded
                    if self.checkpoints:
                        self.sync_records(r)
                        self.checkpoint(r)
                    self.end_trained(self.active[r])
                self.drop(ended)
                while self.active:
                    signalled = signalled or stop.signal is not None
                    reasons = self.stop_reasons(signalled, interrupt_at)
                    stopping = [r for r, reason in enumerate(reasons) if reason]
                    for r in stopping:
                        if self.checkpoints:
                            self.sync_records(r)
                            self.checkpoint(r)
                        self.end(self.active[r], "interrupted", reason=reasons[r])
                    self.drop(stopping)
                    if self.active:
                        self.train_step()
        except Exception as e:  # failure is data: every member still training records it
            if not self.records_failures:
                raise
            for m in self.active:
                if m.outcome is None:  # (one that ended this step keeps its end)
                    self.end(m, "failed", reason=type(e).__name__, message=str(e),
                             traceback=traceback.format_exc())
        finally:
            self.close()

    def train_step(self) -> None:
        """One optimizer step of every active member."""
        t0 = time.perf_counter()
        lrs = [lr_at(m.step, m.tc) for m in self.active]
        stats_due = [block_stats_due(m.tc, m.step + 1) for m in self.active]
        losses, norms = self.gradients(lrs, stats_due)
        records, diverged = [], []
        for r, (m, loss, norm, lr) in enumerate(zip(self.active, losses, norms, lrs,
                                                    strict=True)):
            m.step += 1
            record = {"step": m.step, "train_loss": loss, "lr": lr, "grad_norm": norm}
            reason = self.divergence(m, loss, norm)
            if reason is not None:  # the member stops here, before its update
                self.write(m, record | {"diverged": reason})
                m.final["train_loss"] = loss
                self.end(m, "diverged", reason=reason)
                diverged.append(r)
            else:
                if stats_due[r]:  # gradients as computed, before clipping
                    record.update(self.block_stats(r))
                records.append(record)
        keep = self.drop(diverged)
        if not keep:
            return
        self.update(keep, [lrs[r] for r in keep])
        self.after_step(records, time.perf_counter() - t0)

    def after_step(self, records: list[dict[str, Any]], dt: float) -> None:
        """Evaluation, logging, checkpoints and the end of each member after a step."""
        last = [m.step == m.tc.steps for m in self.active]
        due = [self.evaluates and eval_due(m.tc, m.step) for m in self.active]
        evaluated = self.evaluate(due) if any(due) else [None] * len(due)
        done = []
        for r, (m, record) in enumerate(zip(self.active, records, strict=True)):
            tc = m.tc
            if due[r]:
                values = evaluated[r]
                record.update(values)
                m.best_val, m.val_step = min(m.best_val, values["val_loss"]), m.step
                m.final.update(values)
            m.final["train_loss"] = record["train_loss"]
            if log_due(tc, m.step, record):
                self.write(m, record | {"time_s": dt,
                                        "tokens_per_s": self.tokens_per_step / dt})
            if self.checkpoints and checkpoint_due(tc, m.step):
                self.sync_records(r)
                self.checkpoint(r)
                if tc.keep_checkpoints and not last[r]:
                    self.keep_weights(r)
            if last[r]:
                self.end_trained(m)
                done.append(r)
        self.show(records, dt)
        self.drop(done)


def tokens_per_s(loop: TrainLoop, m: Member) -> float | None:
    """The training throughput of `m` since the loop began (None when it trained no step)."""
    done = m.step - m.start
    if not done:
        return None
    return loop.tokens_per_step * done / (time.perf_counter() - loop.t_start)

