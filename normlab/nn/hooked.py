"""TransformerLens-style entry points on top of the taps (`normlab.nn.taps`):

    logits, cache = model.run_with_cache(tokens, names_filter="blocks.*.mlp.stream_out")
    cache["blocks.3.mlp.stream_out"]          # [B, T, d]; also cache["mlp.stream_out", 3]
    cache.stack("mlp.stream_out")             # [n_blocks, B, T, d]
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.2.attn.branch_in", fn)])

They behave as TransformerLens's methods of the same names (Nanda and Bloom, TransformerLens,
github.com/TransformerLensOrg/TransformerLens): `names_filter` is None (every tap), a name or glob,
a list of them, or a callable `name -> bool`; a hook function is called as `fn(tensor, hook=hook)`
with `hook.name` the tap's name and may return a tensor that replaces the value; every hook is
removed when the call returns, also after an exception. The names are normlab's tap names, the
same for every placement (see `normlab.nn.taps`), not TransformerLens's `hook_resid_post`.
The cache also decomposes the residual stream (`accumulated_resid`, `decompose_resid`,
`apply_ln_to_stack`, `logit_attrs`; see `normlab.nn.analysis` and docs/analysis.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from normlab.nn.analysis import ResidualAnalysis
from normlab.nn.taps import capture, current_name, hooked, select_taps, tap_names

NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
HookFn = Callable[..., torch.Tensor | None]
ReturnType = Literal["logits", "loss", "both"] | None

_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def filter_taps(model: nn.Module, names_filter: NamesFilter) -> list[str]:
    """The tap names `names_filter` selects: all for None, names or globs (`select_taps`), or
    those a callable accepts. Selecting nothing is an error that lists the taps."""
    if names_filter is None:
        return tap_names(model)
    if callable(names_filter):
        names = [n for n in tap_names(model) if names_filter(n)]
        if not names:
            raise ValueError(f"names_filter accepts no tap; taps are named like "
                             f"{tap_names(model)[:4]} ...")
        return names
    return select_taps(model, names_filter)


@dataclass(frozen=True)
class HookPoint:
    """What a hook function gets as `hook`: the tap's name (TransformerLens passes its
    HookPoint, whose `.name` and `.layer()` mean the same)."""

    name: str

    def layer(self) -> int | None:
        """The block index of the tap; None for taps outside the blocks (`final.input`)."""
        m = _BLOCK.fullmatch(self.name)
        return int(m.group(1)) if m else None


class ActivationCache(ResidualAnalysis, Mapping[str, torch.Tensor]):
    """Recorded activations by tap name (gradients, with `incl_bwd`, as `NAME_grad`): a read-only
    mapping (`keys()`, `items()`, `in`, `len`) that also takes `cache[name, block]` for
    `blocks.{block}.{name}` and stacks a per-block name across blocks with `stack`. With the
    model that filled it (`run_with_cache` passes it), it also has the residual-stream analysis
    of `normlab.nn.analysis`: `accumulated_resid`, `decompose_resid`, `apply_ln_to_stack`,
    `logit_attrs`, `logit_bias`."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], n_blocks: int,
                 model: nn.Module | None = None) -> None:
        self._tensors = dict(tensors)
        self.n_blocks = n_blocks
        self.model = model

    def __getitem__(self, key: str | tuple[str, int]) -> torch.Tensor:
        if isinstance(key, tuple):
            name, block = key
            key = f"blocks.{block % self.n_blocks}.{name}"
        key = current_name(key)
        try:
            return self._tensors[key]
        except KeyError:
            raise KeyError(f"{key!r} is not in the cache; it holds {self._summary()}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return f"ActivationCache({self._summary()})"

    def _summary(self) -> str:
        names = list(self._tensors)
        return f"{len(names)} tensors: " + ", ".join(names[:6]) + (" ..." if len(names) > 6
                                                                   else "")

    def stack(self, name: str) -> torch.Tensor:
        """The per-block tensors `blocks.{i}.{name}` for every block i, stacked in block order:
        [n_blocks, ...]. Every block must be in the cache (select them all with names_filter,
        e.g. `blocks.*.mlp.stream_out`)."""
        name = current_name(name)
        found = {int(m.group(1)): t for key, t in self._tensors.items()
                 if (m := _BLOCK.fullmatch(key)) and m.group(2) == name}
        if len(found) != self.n_blocks:
            have = sorted({m.group(2) for key in self._tensors if (m := _BLOCK.fullmatch(key))})
            if not found:
                raise KeyError(f"no block has {name!r} in the cache; per-block names in it: "
                               f"{have}")
            raise KeyError(f"{name!r} is cached for blocks {sorted(found)} of {self.n_blocks}; "
                           f"run_with_cache with names_filter='blocks.*.{name}' to stack them")
        return torch.stack([found[i] for i in range(self.n_blocks)])


def _output(out: Any, return_type: ReturnType) -> Any:
    if return_type is None:
        return None
    if return_type == "logits":
        return out.logits
    if return_type == "both":
        return out
    if return_type == "loss":
        if out.loss is None:
            raise ValueError("return_type='loss' needs targets (the model's second argument)")
        return out.loss
    raise ValueError(f"return_type: {return_type!r}; use 'logits', 'loss', 'both' or None")


class HookedMixin:
    """`run_with_cache`, `run_with_hooks` and `hooks` for a model with taps (`NormTransformer`).
    Positional and keyword arguments go to the model's forward (`idx`, `targets`, ...)."""

    def run_with_cache(self, *args: Any, names_filter: NamesFilter = None,
                       incl_bwd: bool = False, return_type: ReturnType = "logits",
                       **kwargs: Any) -> tuple[Any, ActivationCache]:
        """Run the model and record the activations at the taps `names_filter` selects; returns
        (the output that `return_type` asks for, the cache). The cached tensors are detached.
        `incl_bwd=True` also runs `loss.backward()` (pass targets) and caches each activation's
        gradient as `NAME_grad`; parameters' `.grad` accumulate as in any backward."""
        with capture(self, filter_taps(self, names_filter), grads=incl_bwd) as cap:
            out = self(*args, **kwargs)
            if incl_bwd:
                if out.loss is None:
                    raise ValueError("incl_bwd=True needs a loss to differentiate: pass targets")
                out.loss.backward()
        tensors = dict(cap.activations)
        tensors.update((f"{name}_grad", g) for name, g in cap.grads.items())
        return _output(out, return_type), ActivationCache(tensors, len(self.blocks), model=self)

    def run_with_hooks(self, *args: Any, fwd_hooks: Sequence[tuple[NamesFilter, HookFn]] = (),
                       return_type: ReturnType = "logits", **kwargs: Any) -> Any:
        """Run the model with `fwd_hooks` attached: pairs (tap name, glob or callable filter,
        hook function). Each function is called as `fn(tensor, hook=HookPoint)` when the tap's
        value is computed; a tensor it returns replaces the value. Several hooks on one tap run
        in list order, each seeing the previous one's result."""
        with self.hooks(fwd_hooks):
            return _output(self(*args, **kwargs), return_type)

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[NamesFilter, HookFn]] = ()) -> Iterator[Any]:
        """`run_with_hooks`'s hooks as a context: attached inside, removed on exit (for a
        backward pass or several forwards under the same hooks)."""
        table: dict[str, list] = {}
        for names, fn in fwd_hooks:
            if not callable(fn):
                raise TypeError(f"fwd_hooks: the hook for {names!r} is not callable")
            for name in filter_taps(self, names):
                table.setdefault(name, []).append(_torch_hook(fn, HookPoint(name)))
        with hooked(self, forward=table):
            yield self


def _torch_hook(fn: HookFn, point: HookPoint):
    def hook(_module, _inputs, output):
        return fn(output, hook=point)  # None keeps the value; a tensor replaces it
    return hook
