"""Attaching probe hooks safely: every hook is removed and the train/eval flags restored on exit.

Probes observe, never modify (docs/design.md, principle 4): they read tap points through hooks
(a hook that returns a tensor replaces the value for that forward only, which is how the
interventions work), compute gradients with `torch.autograd.grad` (parameters' `.grad` stay as
they were), and run in eval mode (dropout off), restoring every module's flag afterwards.
`hooked` lives with the taps (`normlab.nn.taps`), where the model's own `run_with_hooks` uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from normlab.nn.taps import Hook, hooked

__all__ = ["Hook", "eval_mode", "hooked", "hooks_left"]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run with every module in eval mode; restore each module's own flag afterwards."""
    # `object.__setattr__` is what `nn.Module.__setattr__` does for a plain flag, minus its
    # checks: for a 1000-block model (23k modules) that is the difference of a few percent of a
    # forward+backward.
    training = [m for m in model.modules() if m.training]
    for m in training:
        object.__setattr__(m, "training", False)
    try:
        yield model
    finally:
        for m in training:
            object.__setattr__(m, "training", True)


def hooks_left(model: nn.Module) -> list[str]:
    """Names of modules that still carry forward or backward hooks (for tests: should be [])."""
    left = []
    for name, m in model.named_modules():
        if (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None)):
            left.append(name or "<model>")
    return left
