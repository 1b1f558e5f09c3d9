"""Named tap points and the capture API (TransformerLens-style hook points).

Every sublayer has five taps, the same for every placement:
`blocks.{i}.{attn|mlp}.stream_in` (stream entering the sublayer), `.branch_in` (what the sublayer
F reads: the normalized and scaled stream), `.branch_raw` (F's output), `.branch_added` (what is
actually added to the stream, after an output norm or gate), `.stream_out` (stream leaving the
sublayer, after any post-add norm); plus `final.input` and `final.out` around the final norm.
Norms carry three more (`normlab.nn.norms`): `{norm}.input`, `{norm}.scale` (the per-token factor
1/std or 1/rms, [..., 1]) and `{norm}.out`, e.g. `blocks.{i}.attn.in_norm.scale`,
`final.norm.scale`; attention carries `blocks.{i}.attn.fn.{q,k,v}` ([B, H, T, head_dim], after any
QKV norm and RoPE) and `blocks.{i}.attn.fn.pattern` (softmax probabilities [B, H, T, T]).
A tap is an identity module: with no hook attached it only costs a module call; the norm and
attention taps are not even called unless hooked (`active`), and the values only they need (the
explicit scale, the attention pattern) are computed only then. A forward hook that returns a
tensor replaces the value (interventions such as the merge test use this on `branch_in`).

`input` was named `in` before (a Python keyword, reachable only through `getattr`); the former
name is still read wherever names are looked up (`select_taps`, `capture`, `hooked`, a capture's
or cache's keys): `final.in` means `final.input` (`current_name`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

Hook = Callable[..., object]


class Tap(nn.Module):
    """Identity module whose module path is the tap's name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def active(tap: nn.Module) -> bool:
    """Whether any hook is attached to `tap` (what a forward checks before computing a value
    that only a tap needs)."""
    return bool(tap._forward_hooks or tap._forward_pre_hooks)


def fire(tap: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`tap(x)` when the tap is hooked, else `x` without a module call."""
    return tap(x) if tap._forward_hooks or tap._forward_pre_hooks else x


FORMER_NAMES = {"in": "input"}  # a tap's former last name component -> its name now
_GLOB_CHARS = re.compile(r"[*?\[]")  # what makes a pattern a glob for fnmatch


def current_name(name: str) -> str:
    """A tap name (or glob) with a former last component replaced: `final.in` -> `final.input`,
    `blocks.*.in_norm.in` -> `blocks.*.in_norm.input`, a cache's gradient `final.in_grad` ->
    `final.input_grad`; other names are returned as they are."""
    head, dot, last = name.rpartition(".")
    stem = last.removesuffix("_grad")
    return head + dot + FORMER_NAMES.get(stem, stem) + last[len(stem):]


@dataclass
class Capture(Mapping[str, torch.Tensor]):
    """Activations (and, after backward, gradients) recorded at the selected taps: a read-only
    mapping of the activations by tap name (`keys()`, `items()`, `in`, `len`)."""

    activations: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.activations[current_name(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.activations)

    def __len__(self) -> int:
        return len(self.activations)


def tap_names(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, Tap)]


def select_taps(model: nn.Module, patterns: str | Sequence[str]) -> list[str]:
    """Tap names matching any of the glob patterns (`*` for all, `blocks.*.mlp.stream_out`)."""
    pats = [current_name(p) for p in ([patterns] if isinstance(patterns, str) else patterns)]
    names = tap_names(model)
    # a name without a glob character matches itself alone: a set lookup, where a probe that
    # lists every block's taps by name would otherwise glob-match each against each
    exact = {p for p in pats if not _GLOB_CHARS.search(p)}
    globs = [p for p in pats if p not in exact]
    chosen = [n for n in names if n in exact or any(fnmatch.fnmatchcase(n, p) for p in globs)]
    known = set(names)
    unmatched = [p for p in pats if (p not in known if p in exact
                                     else not any(fnmatch.fnmatchcase(n, p) for n in names))]
    if unmatched:
        raise ValueError(
            f"no tap matches {unmatched}; taps are named like {names[:4]} ... {names[-2:]}"
        )
    return chosen


@contextmanager
def capture(
    model: nn.Module, names: str | Sequence[str] = "*", *, grads: bool = False,
    detach: bool = True,
) -> Iterator[Capture]:
    """Record activations at the selected taps during forwards run inside the block.

    With `grads=True`, each captured activation also records its gradient when a backward pass
    runs. `detach=False` keeps the graph (for probes that differentiate through activations).
    """
    cap = Capture()
    modules = dict(model.named_modules())
    handles = []
    for name in select_taps(model, names):
        def hook(_m, _inp, out, name=name):
            cap.activations[name] = out.detach() if detach else out
            if grads and out.requires_grad:
                out.register_hook(lambda g, name=name: cap.grads.__setitem__(name, g.detach()))
        handles.append(modules[name].register_forward_hook(hook))
    try:
        yield cap
    finally:
        for h in handles:
            h.remove()


@contextmanager
def hooked(model: nn.Module, forward: Mapping[str, Hook] | None = None,
           pre: Mapping[str, Hook] | None = None) -> Iterator[None]:
    """Register forward hooks (`forward`) and forward pre-hooks (`pre`) on modules by name;
    all are removed on exit, also after an exception. Several hooks per module: pass a list."""
    handles = []
    try:
        for table, register in ((forward, "register_forward_hook"),
                                (pre, "register_forward_pre_hook")):
            for name, fns in (table or {}).items():
                name = current_name(name)
                try:
                    module = model.get_submodule(name)
                except AttributeError:
                    raise KeyError(f"no module named {name!r} in the model") from None
                for fn in fns if isinstance(fns, (list, tuple)) else [fns]:
                    handles.append(getattr(module, register)(fn))
        yield
    finally:
        for h in handles:
            h.remove()
