"""Text from a trained run: `normlab sample RUN_DIR --prompt TEXT`, as nanoGPT's `sample.py`.

The run's model continues the prompt one token at a time: logits of the last position, divided by
the temperature, cut to the `top_k` most likely tokens, and drawn from a seeded generator
(temperature 0 takes the most likely token). The context is the last `max_seq_len` tokens. Text
goes in and out through the run's own tokenizer: the `tokenizer.json` in its folder (a BPE or a
tokenizer file the run trained with), else bytes. The weights are the run's latest checkpoint,
or those of a step given as `RUN@STEP` (`normlab.train.rundir.split_run_step`: the latest
checkpoint's step or one kept with `train.keep_checkpoints`); a run that is not finished is
sampled from its latest checkpoint (the command says so), one that diverged only at a step given
(its last weights are not a trained model). Only a decoder trained on text is sampled; anything
else is a `SampleError` saying why and what to do.
"""

from __future__ import annotations

from pathlib import Path

import torch

from normlab.data.tokenizer import TOKENIZER_FILE, ByteTokenizer, Tokenizer

SAMPLEABLE = ("completed", "stalled")  # finished with a trained model


class SampleError(ValueError):
    """A run folder that cannot be sampled, or settings that cannot be used."""


@torch.no_grad()
def generate(model: torch.nn.Module, idx: torch.Tensor, new_tokens: int, *,
             temperature: float = 0.8, top_k: int | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """`idx` [B, T] continued by `new_tokens` tokens: [B, T + new_tokens]."""
    was_training = model.training
    model.eval()
    context = model.cfg.max_seq_len
    try:
        for _ in range(new_tokens):
            logits = model(idx[:, -context:]).logits[:, -1, :].float()
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.size(-1):
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt.to(idx.dtype)], dim=1)
    finally:
        model.train(was_training)
    return idx


def check_settings(tokens: int, temperature: float, top_k: int | None,
                   vocab_size: int | None = None) -> None:
    """`SampleError` for settings that cannot be used (`top_k` is checked against the model's
    vocabulary when it is given)."""
    if tokens < 1:
        raise SampleError(f"--tokens {tokens}: give at least 1")
    if not temperature >= 0 or temperature == float("inf"):
        raise SampleError(f"--temperature {temperature}: give a finite number >= 0 (0: the "
                          "most likely token each time)")
    if top_k is not None and (top_k < 1 or vocab_size is not None and top_k > vocab_size):
        raise SampleError(f"--top-k {top_k}: give 1 to {vocab_size or 'the vocabulary size'} "
                          "(the run's vocabulary)")


def run_tokenizer(run_dir: Path, meta: dict | None = None) -> Tokenizer:
    """The tokenizer a run trained with: its folder's tokenizer.json, else bytes; `SampleError`
    when the run's data named no tokenizer (token files without one) or the file is gone."""
    from normlab.data import DataError
    from normlab.data.tokenizer import load_tokenizer_file

    path = run_dir / TOKENIZER_FILE
    if path.is_file():
        try:
            return load_tokenizer_file(path)
        except DataError as e:
            raise SampleError(str(e)) from None
    meta = meta or {}
    if "tokenizer" in meta and meta["tokenizer"] not in ("byte",):
        if meta["tokenizer"] is None:
            raise SampleError(f"{run_dir}: trained on token files that name no tokenizer, so "
                              "its ids cannot be turned into text; put the tokenizer.json they "
                              f"were written with into {run_dir}")
        raise SampleError(f"{path} is missing: the run trained with tokenizer "
                          f"{meta['tokenizer']!r}; put its tokenizer.json back")
    return ByteTokenizer()


def load_sampleable(given: Path | str):
    """`(run_config, model, run folder, step)` of a decoder run at `RUN` or `RUN@STEP` (step
    None: its latest checkpoint), or `SampleError` naming the problem."""
    from normlab.train import CheckpointError, RunFolderError, load_trained_model
    from normlab.train.checkpoint import checkpoint_step
    from normlab.train.rundir import find_run, read_run_folder, split_run_step

    try:  # a run's id, a unique prefix of it, or its name, under ./runs; then @STEP
        run_dir, step = split_run_step(given)
        run_dir = find_run(run_dir)
    except RunFolderError as e:
        raise SampleError(str(e)) from None
    if not run_dir.exists():
        raise SampleError(f"{run_dir}: no such run folder; `normlab runs` lists the runs")
    if not run_dir.is_dir():
        raise SampleError(f"{run_dir}: is a file; give a run folder (runs/<run_id>)")
    if not (run_dir / "config.yaml").exists():
        raise SampleError(f"{run_dir}: not a run folder (no config.yaml); give one of the "
                          "folders `normlab runs` lists")
    folder = read_run_folder(run_dir)
    if folder.damaged:
        raise SampleError(f"{run_dir}: damaged ({'; '.join(folder.problems)})")
    if folder.config is not None and folder.config.model.kind != "decoder":
        raise SampleError(f"{run_dir}: an encoder run (a classifier) has no next-token head to "
                          "sample from; train a decoder")
    if folder.config is not None and folder.config.data.task is not None:
        raise SampleError(f"{run_dir}: trained on data.task={folder.config.data.task}, not "
                          "text; its head answers the task, it does not predict bytes")
    s = folder.summary
    where = (f" at step {s['step']} of {s.get('steps_planned', '?')}"
             if s.get("step") is not None else "")
    if folder.outcome == "diverged" and step is None:
        raise SampleError(f"{run_dir}: the run is diverged{where}; its last weights are not a "
                          "trained model; give a step it kept before, as RUN@STEP")
    if folder.outcome not in SAMPLEABLE and checkpoint_step(run_dir) is None:
        raise SampleError(f"{run_dir}: the run is {folder.outcome}{where} and has no checkpoint "
                          f"yet; continue it with `normlab train --resume {run_dir}`")
    try:
        return (*load_trained_model(run_dir, step=step), run_dir, step)
    except CheckpointError as e:
        raise SampleError(str(e)) from None


def sample_run(run_dir: Path | str, prompt: str = "\n", *, tokens: int = 200,
               temperature: float = 0.8, top_k: int | None = None, seed: int = 0) -> str:
    """The text a run's model (`RUN` or `RUN@STEP`, see `load_sampleable`) writes after `prompt`
    (the continuation only), in and out through the run's tokenizer (`run_tokenizer`)."""
    return sample_with_source(run_dir, prompt, tokens=tokens, temperature=temperature,
                              top_k=top_k, seed=seed)[0]


def sample_with_source(run_dir: Path | str, prompt: str = "\n", *, tokens: int = 200,
                       temperature: float = 0.8, top_k: int | None = None, seed: int = 0
                       ) -> tuple[str, str]:
    """`sample_run`'s text, and which weights wrote it (`weights_note`: the run, the step, and
    whether the run is finished), for the command to say."""
    from normlab.train.checkpoint import weights_note
    from normlab.train.rundir import read_run_folder

    check_settings(tokens, temperature, top_k)
    if not prompt:
        raise SampleError("--prompt is empty; give some text to continue (e.g. a newline)")
    _, model, folder, step = load_sampleable(run_dir)
    check_settings(tokens, temperature, top_k, model.cfg.vocab_size)
    tokenizer = run_tokenizer(folder, read_run_folder(folder).meta)
    ids = tokenizer.encode(prompt).astype("int64")
    if not len(ids):
        raise SampleError(f"--prompt {prompt!r} has no tokens under the run's tokenizer; give "
                          "some text")
    idx = torch.from_numpy(ids)[None, :]
    gen = torch.Generator().manual_seed(seed)
    out = generate(model, idx, tokens, temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0, idx.size(1):]), weights_note(folder, step)
