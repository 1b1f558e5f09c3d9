"""Probe a real checkpoint with its own tokenizer: stream norm by depth, angular distance between
consecutive blocks, layer drop (claim C12 of docs/reference.md section 2).

    from normlab.interop import run_hf_probe
    result = run_hf_probe("smollm2", out_dir="probe_hf")   # or "minilm", or a local folder

Text: passages of the Shakespeare validation split (the works `normlab.data.load_text_data`
holds out), or of a user's `.txt` file or folder, tokenized by the checkpoint's own tokenizer
into `n_batches x batch_size` windows of exactly `seq_len` tokens (the tokenizer's own special
tokens included, e.g. BERT's [CLS] ... [SEP]), so no padding is needed. Windows start at line
starts spread evenly over the text: the same windows on every call.

Measured, per block `l` (output `x_{l+1}`), through normlab's tap names (`adapters.HFTapModel`);
each number is a row of the table of probe metrics (`normlab.probe.metrics`, its `real` field):

- `normlab.probe.stream_stats`: `ang_prev` (`arccos(cos(x_l, x_{l+1}))/pi`), `rel_update`,
  `ang_last`, ...;
- `stream_norms`: `norm`, the mean token norm after the block over positions 1..T-1, and
  `growth_exponent` fitted to it; position 0 apart (`norm_first`), the median token
  (`norm_median`) and the mean over all positions (`norm_all`, `growth_exponent_all_positions`):
  pre-norm LLMs put a "massive activation" (an attention sink) on the first token, which
  dominates a mean over all positions;
- layer drop (`adapters.skip_blocks`), each block skipped in turn:
  `drop_dloss` the increase of the model's own loss: next-token cross-entropy for a causal LM,
  masked-token cross-entropy for a masked LM (15% of the non-special tokens of each window
  replaced by the mask token, fixed by `seed`); `drop_kl` KL(original || dropped) of the
  output distributions; and for every model the change of the final hidden state,
  `drop_hidden_cos` (mean over tokens of 1 - cos) and `drop_hidden_ang` (angular distance), plus
  for an encoder without an LM head (a sentence embedder) `drop_pooled_cos`, 1 - cos of the
  mean-pooled sentence embedding.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from normlab.interop.adapters import HFTapModel, skip_blocks
from normlab.interop.checkpoints import LoadedCheckpoint, load_checkpoint
from normlab.interop.errors import InteropError
from normlab.probe.measures import angular_distance, kl_divergence, token_cosine, token_norms
from normlab.probe.metrics import PER_BLOCK, REAL, SUMMARY, layer_drop_costs, of_metrics, place
from normlab.probe.suite import finite_or_none
from normlab.train.logging import write_json_atomic

Batch = tuple[torch.Tensor, torch.Tensor]
CHARS_PER_TOKEN = 6  # a generous first guess of how much text one window needs


# --- text --------------------------------------------------------------------------------------

def load_passages(text: str | Path | None = None) -> list[str]:
    """The texts to probe on: the Shakespeare validation works (default), or every work of a
    user's `.txt` file or folder. Errors are `normlab.data.DataError`s naming the path."""
    from normlab.data import DataError, load_text_data, load_works

    if text is None or str(text) == "shakespeare":
        data = load_text_data("shakespeare")
        raw = data.val.data
        return [bytes(raw[s.start:s.end]).decode("utf-8", errors="replace")
                for s in data.val.spans]
    if not Path(text).exists():
        raise DataError(f"text {text}: no such file or folder")
    return [w.text.decode("utf-8", errors="replace") for w in load_works(text)]


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(prefix, suffix): the ids the tokenizer adds around a text by default ([CLS] / [SEP],
    a BOS token, or nothing), found by encoding a sample with and without them."""
    sample = "the quick brown fox"
    with_sp = list(tokenizer(sample)["input_ids"])
    plain = list(tokenizer(sample, add_special_tokens=False)["input_ids"])
    for start in range(len(with_sp) - len(plain) + 1):
        if with_sp[start:start + len(plain)] == plain:
            return with_sp[:start], with_sp[start + len(plain):]
    return [], []


def token_windows(tokenizer: Any, passages: Sequence[str], n: int, seq_len: int) -> torch.Tensor:
    """`[n, seq_len]` token ids: `n` windows that start at line starts spread evenly over the
    passages, each the tokenizer's special prefix + text tokens + special suffix."""
    prefix, suffix = special_tokens(tokenizer)
    body = seq_len - len(prefix) - len(suffix)
    if body < 2:
        raise InteropError(f"seq_len {seq_len} leaves no room for text next to the "
                           f"tokenizer's {len(prefix) + len(suffix)} special tokens")
    joined = "\n".join(passages)
    if len(joined) < 16:
        raise InteropError("the text is too short to probe on")
    windows = []
    for k in range(n):
        start = (k * len(joined)) // n
        nl = joined.find("\n", start)
        start = nl + 1 if 0 <= nl < len(joined) - 1 else start
        ids: list[int] = []
        need = body * CHARS_PER_TOKEN
        while True:
            chunk = joined[start:start + need]
            ids = list(tokenizer(chunk, add_special_tokens=False)["input_ids"])
            if len(ids) > body or start + need >= len(joined):
                break
            need *= 2
        if len(ids) < body:  # the end of the text: take the window that ends there
            tail = list(tokenizer(joined[-body * CHARS_PER_TOKEN * 4:],
                                  add_special_tokens=False)["input_ids"])
            ids = tail[-body:]
            if len(ids) < body:
                raise InteropError(f"the text has fewer than {body} tokens; lower --seq-len")
        windows.append(prefix + ids[:body] + suffix)
    return torch.tensor(windows, dtype=torch.long)


def make_batches(model: Any, tokenizer: Any, passages: Sequence[str], *, n_batches: int = 2,
                 batch_size: int = 4, seq_len: int = 128, mask_prob: float = 0.15,
                 seed: int = 0) -> list[Batch]:
    """`(idx, targets)` batches for `model`'s objective. Causal LM: targets are the next tokens
    (-100 at the last position). Masked LM: `mask_prob` of the non-special tokens are replaced
    by the mask token, targets hold the originals there and -100 elsewhere. No head: targets
    are all -100 (only hidden-state changes are measured)."""
    from normlab.interop.adapters import objective_of

    if n_batches < 1 or batch_size < 1:
        raise InteropError("n_batches and batch_size must be at least 1")
    ids = token_windows(tokenizer, passages, n_batches * batch_size, seq_len)
    objective = objective_of(model)
    targets = torch.full_like(ids, -100)
    if objective == "causal_lm":
        targets[:, :-1] = ids[:, 1:]
    elif objective == "masked_lm":
        mask_id = getattr(tokenizer, "mask_token_id", None)
        if mask_id is None:
            raise InteropError("a masked LM needs a tokenizer with a mask token")
        prefix, suffix = special_tokens(tokenizer)
        gen = torch.Generator().manual_seed(seed)
        pick = torch.rand(ids.shape, generator=gen) < mask_prob
        pick[:, :len(prefix)] = False
        if suffix:
            pick[:, ids.shape[1] - len(suffix):] = False
        pick[:, len(prefix)] |= ~pick.any(1)  # at least one masked token per window
        targets[pick] = ids[pick]
        ids = ids.masked_fill(pick, mask_id)
    return list(zip(ids.split(batch_size), targets.split(batch_size), strict=True))


# --- measurements ------------------------------------------------------------------------------

def stream_norms(hidden: torch.Tensor) -> dict[str, float]:
    """Token norms of one stream `[B, T, d]`, position 0 apart from the rest.

    `norm`: mean token norm over positions 1..T-1 (the stream mean); `norm_first`: the mean at
    position 0; `norm_median`: the median over positions 1..T-1; `norm_all`: the mean over every
    position. Position 0 is set apart because pre-norm LLMs park an "attention sink" there: in
    SmolLM2 its norm jumps to about 23,500 at block 11 against about 140 for the other tokens,
    which alone would put a step in a mean over all positions.
    """
    if hidden.dim() != 3 or hidden.shape[1] < 2:
        raise InteropError(f"stream_norms needs a [batch, positions >= 2, width] stream, got "
                           f"shape {tuple(hidden.shape)}")
    n = token_norms(hidden)
    rest = n[:, 1:]
    return {"norm": rest.mean().item(), "norm_first": n[:, 0].mean().item(),
            "norm_median": rest.median().item(), "norm_all": n.mean().item()}


@torch.no_grad()
def position_norms(wrapper: HFTapModel, batches: Sequence[Batch]) -> dict[str, list[float]]:
    """`stream_norms` of the stream after each block, averaged over batches: per block
    `norm` (positions >= 1), `norm_first` (position 0), `norm_median`, `norm_all`."""
    from normlab.probe.hooks import eval_mode, hooked

    L = wrapper.cfg.n_blocks
    rows: list[list[dict[str, float]]] = []
    for idx, _ in batches:
        got: list[dict[str, float]] = [{}] * L

        def keep(i: int, got=got):
            def hook(_m, _inp, x) -> None:
                got[i] = stream_norms(x)
            return hook

        with eval_mode(wrapper), hooked(wrapper, {f"blocks.{i}.mlp.stream_out": keep(i)
                                                  for i in range(L)}):
            wrapper.stream(idx)
        rows.append(got)
    return {k: torch.tensor([[g[k] for g in got] for got in rows], dtype=torch.float64)
            .mean(0).tolist() for k in rows[0][0]}


def _final_and_logits(wrapper: HFTapModel, idx: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    from normlab.nn.taps import capture

    if wrapper.objective == "none":
        return wrapper.stream(idx), None
    with capture(wrapper, "final.out") as cap:
        logits = wrapper(idx).logits
    return cap["final.out"], logits


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=-100).item()


@dataclass
class Outputs:
    """What a layer-drop cost compares: the final hidden state (`final.out`, `[B, T, d]`), the
    logits (None: the checkpoint has no LM head) and the model's loss on the batch's targets."""

    hidden: torch.Tensor
    logits: torch.Tensor | None
    targets: torch.Tensor

    @cached_property
    def loss(self) -> float:
        return _loss(self.logits, self.targets) if self.logits is not None else math.nan


# The layer-drop costs, `f(full, skipped) -> float`, or None where one does not apply to the
# model; each is the `real` function of its row in normlab.probe.metrics.

def dropped_loss_increase(full: Outputs, skipped: Outputs) -> float | None:
    return None if full.logits is None else skipped.loss - full.loss


def dropped_kl(full: Outputs, skipped: Outputs) -> float | None:
    return None if full.logits is None else kl_divergence(full.logits, skipped.logits)


def dropped_hidden_cos(full: Outputs, skipped: Outputs) -> float:
    return 1.0 - token_cosine(full.hidden, skipped.hidden).mean().item()


def dropped_hidden_ang(full: Outputs, skipped: Outputs) -> float:
    return angular_distance(full.hidden, skipped.hidden)


def dropped_pooled_cos(full: Outputs, skipped: Outputs) -> float | None:
    """Models without an LM head (sentence embedders): the change of the mean-pooled stream."""
    if full.logits is not None:
        return None
    return 1.0 - token_cosine(full.hidden.mean(1), skipped.hidden.mean(1)).mean().item()


@torch.no_grad()
def drop_scan(wrapper: HFTapModel, batches: Sequence[Batch],
              blocks: Sequence[int] | None = None) -> dict[str, Any]:
    """Layer drop on a Hugging Face model: each block in `blocks` (default all) skipped in
    turn; the per-block costs described in the module doc (the real-checkpoint layer-drop rows
    of normlab.probe.metrics), averaged over batches, with `drop_blocks` the indices measured."""
    from normlab.probe.hooks import eval_mode

    L = wrapper.cfg.n_blocks
    chosen = list(range(L)) if blocks is None else sorted(set(blocks))
    costs = layer_drop_costs()
    rows: dict[str, list[list[float]]] = {m.name: [] for m in costs}
    base_losses = []
    with eval_mode(wrapper):
        for idx, targets in batches:
            full = Outputs(*_final_and_logits(wrapper, idx), targets)
            base_losses.append(full.loss)
            row: dict[str, list[float]] = {k: [] for k in rows}
            for t in chosen:
                with skip_blocks(wrapper.hf, [t]):
                    skipped = Outputs(*_final_and_logits(wrapper, idx), targets)
                for m in costs:
                    value = m.real(full, skipped)
                    if value is not None:
                        row[m.name].append(value)
            for k in rows:
                rows[k].append(row[k])
    out: dict[str, Any] = {"drop_blocks": chosen,
                           "loss": float(torch.tensor(base_losses).mean())}
    for k, v in rows.items():
        if v and v[0]:
            out[k] = torch.tensor(v, dtype=torch.float64).mean(0).tolist()
    return out


def probe_hf_model(hf_model: Any, batches: Sequence[Batch], *, drop: bool = True,
                   drop_blocks: Sequence[int] | None = None) -> dict[str, Any]:
    """Every measurement of the module doc on a loaded transformers model."""
    from normlab.probe.stream import growth_exponent, stream_stats

    wrapper = hf_model if isinstance(hf_model, HFTapModel) else HFTapModel(hf_model)
    t0 = time.perf_counter()
    stream = stream_stats(wrapper, batches)
    per_block: dict[str, list[float]] = {k: v for k, v in stream.items()
                                         if place(k) == PER_BLOCK}
    per_block |= position_norms(wrapper, batches)  # `norm` now leaves position 0 out
    summary = {k: v for k, v in stream.items() if place(k) == SUMMARY}
    summary["growth_exponent_all_positions"] = summary.get("growth_exponent")
    summary["growth_exponent"] = growth_exponent(per_block["norm"])
    timing = {"stream": time.perf_counter() - t0}
    drop_res: dict[str, Any] = {}
    if drop:
        t1 = time.perf_counter()
        drop_res = drop_scan(wrapper, batches, drop_blocks)
        timing["drop"] = time.perf_counter() - t1
        summary["loss"] = drop_res.pop("loss")
    L = wrapper.cfg.n_blocks
    for m in of_metrics(REAL):  # the norm's growth, the mean angular distance, ...
        summary[m.name] = m.real(*(per_block[k] for k in m.inputs))
    return {"model": wrapper.cfg.to_dict(),
            "relative_depth": [(i + 1) / L for i in range(L)],
            "per_block": per_block, "drop": drop_res, "summary": summary,
            "n_tokens": int(sum(b[0].numel() for b in batches)),
            "seconds": {k: round(v, 2) for k, v in timing.items()}}


# --- the whole run -----------------------------------------------------------------------------

def run_hf_probe(name_or_path: str | Path, text: str | Path | None = None,
                 out_dir: str | Path | None = None, *, n_batches: int = 2, batch_size: int = 4,
                 seq_len: int = 128, drop: bool = True, drop_blocks: Sequence[int] | None = None,
                 seed: int = 0, figures: bool = True, loaded: LoadedCheckpoint | None = None
                 ) -> dict[str, Any]:
    """Load `name_or_path` (`minilm`, `smollm2`, or a local folder / .gguf file) offline, probe
    it on `text` (default: Shakespeare validation works), and return every number; with
    `out_dir`, also write `<name>.json` (and `<name>.png` with `figures`) there.
    `loaded` skips loading (a `LoadedCheckpoint` already in memory)."""
    t0 = time.perf_counter()
    ck = loaded if loaded is not None else load_checkpoint(name_or_path)
    load_s = time.perf_counter() - t0
    passages = load_passages(text)
    batches = make_batches(ck.model, ck.tokenizer, passages, n_batches=n_batches,
                           batch_size=batch_size, seq_len=seq_len, seed=seed)
    res = probe_hf_model(ck.model, batches, drop=drop, drop_blocks=drop_blocks)
    res["checkpoint"] = ck.spec.to_dict()
    res["data"] = {"text": str(text) if text is not None else "shakespeare (validation works)",
                   "n_batches": n_batches, "batch_size": batch_size, "seq_len": seq_len,
                   "seed": seed, "objective": res["model"]["objective"]}
    res["seconds"] |= {"load": round(load_s, 2), **{f"load_{k}": round(v, 2)
                                                    for k, v in ck.seconds.items()}}
    res["env"] = environment()
    if out_dir is not None:
        write_result(res, Path(out_dir), figures)
    return res


def environment() -> dict[str, Any]:
    import transformers

    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads()}


def write_result(res: dict[str, Any], out: Path, figures: bool = True) -> list[Path]:
    """`<out>/<name>.json` (atomically) and, with `figures`, `<out>/<name>.png`."""
    out.mkdir(parents=True, exist_ok=True)
    name = res["checkpoint"]["name"]
    path = out / f"{name}.json"
    write_json_atomic(path, finite_or_none(res))
    written = [path]
    if figures:
        from normlab.interop.figures import comparison_figure

        written.append(comparison_figure([res], out / f"{name}.png"))
    return written
