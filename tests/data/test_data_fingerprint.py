"""A run records the fingerprint of the data it read (config.yaml's `meta.data_fingerprint`: each
file's size, modification time and, up to 64 MiB, content sha256) and a run folder used again on
changed data is refused, naming the file, with the folder left as it was: never `already
completed` with the old numbers. A file touched without a change is the same data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from optional_packages import needs
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config
from normlab.data import fingerprint, load_text_data
from normlab.data.tokenfiles import prepare
from normlab.sweep.executors import run_one
from normlab.train import RunFolderError, train_run
from normlab.train.group import train_group
from normlab.train.trainer import DataChangedError

pytestmark = pytest.mark.filterwarnings("ignore:only one work")

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.steps=2", "train.eval_batches=1",
        "train.device=cpu"]
TEXT = "the quick brown fox jumps over the lazy dog while the old owl watches\n" * 20


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))


def config(source, *extra: str):
    return load_run_config(None, [*TINY, f"data.source={source}", *extra])


def folder_state(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run folder and its bytes (the lock file aside)."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def recorded(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["meta"]["data_fingerprint"]


def edit(path: Path, text: str) -> None:
    """Write `text` into `path` and move its modification time on (as a later edit would)."""
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def corpus(tmp_path: Path, n: int = 4) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(n):
        (folder / f"work{i}.txt").write_text(f"work {i}: " + TEXT)
    return folder


@pytest.fixture
def text_run(tmp_path, monkeypatch):
    """A finished run on `notes.txt` (named relative to the working folder, as a user gives it)."""
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text(TEXT)
    cfg = config("notes.txt")
    summary = train_run(cfg, "runs", progress=False)
    assert summary["outcome"] in ("completed", "stalled")
    return cfg, tmp_path / "runs" / cfg.run_id(), summary


def test_a_text_run_records_its_file_and_a_changed_file_is_refused(text_run):
    cfg, run_dir, summary = text_run
    entry = recorded(run_dir)["notes.txt"]
    assert entry["size"] == len(TEXT) and isinstance(entry["mtime_ns"], int)
    assert len(entry["sha256"]) == 64
    assert train_run(cfg, "runs", progress=False) == summary  # same data: the result, skipped
    before = folder_state(run_dir)
    edit(Path("notes.txt"), TEXT + "a new line\n")
    with pytest.raises(DataChangedError) as info:
        train_run(cfg, "runs", progress=False)
    message = str(info.value)
    assert f"runs/{cfg.run_id()}: holds a result" in message and "notes.txt changed" in message
    assert "move the folder away" in message and "another --root" in message
    assert folder_state(run_dir) == before  # nothing written, nothing lost


def test_the_cli_refuses_changed_data_with_exit_2_and_keeps_the_folder(text_run):
    cfg, run_dir, _ = text_run
    before = folder_state(run_dir)
    edit(Path("notes.txt"), TEXT.replace("fox", "cat"))  # the same size, other content
    result = CliRunner().invoke(app, ["train", "--root", "runs", "--quiet",
                                      *[a for s in TINY + ["data.source=notes.txt"]
                                        for a in ("--set", s)]], terminal_width=300)
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "notes.txt changed (the same size, other content" in said
    assert "already" not in said and "Traceback" not in said
    assert issubclass(DataChangedError, RunFolderError)  # what the CLI says with exit 2
    assert folder_state(run_dir) == before


def test_a_file_touched_without_a_change_is_the_same_data(text_run):
    cfg, run_dir, summary = text_run
    path = Path("notes.txt")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    path.write_text(TEXT)  # rewritten with the same bytes
    assert path.stat().st_mtime_ns != recorded(run_dir)["notes.txt"]["mtime_ns"]
    assert train_run(cfg, "runs", progress=False) == summary


def test_a_file_added_to_a_folder_source_is_refused(tmp_path):
    folder = corpus(tmp_path)
    cfg = config(folder)
    train_run(cfg, tmp_path / "runs", progress=False)
    run_dir = tmp_path / "runs" / cfg.run_id()
    assert sorted(recorded(run_dir)) == [f"{folder.as_posix()}/work{i}.txt" for i in range(4)]
    before = folder_state(run_dir)
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.txt").write_text("more text " * 50)
    with pytest.raises(DataChangedError, match=r"corpus/sub/extra\.txt is new"):
        train_run(cfg, tmp_path / "runs", progress=False)
    (folder / "sub" / "extra.txt").unlink()
    (folder / "work2.txt").unlink()
    with pytest.raises(DataChangedError, match=r"corpus/work2\.txt is gone"):
        train_run(cfg, tmp_path / "runs", progress=False)
    assert folder_state(run_dir) == before


def test_a_resume_on_changed_data_is_refused(tmp_path):
    folder = corpus(tmp_path)
    cfg = config(folder, "train.steps=4", "train.checkpoint_every=1")
    first = train_run(cfg, tmp_path / "runs", progress=False, interrupt_at=1)
    assert first["outcome"] == "interrupted"
    run_dir = tmp_path / "runs" / cfg.run_id()
    before = folder_state(run_dir)
    edit(folder / "work1.txt", "rewritten " + TEXT)
    with pytest.raises(DataChangedError, match=r"started on other data.*work1\.txt changed"):
        train_run(cfg, tmp_path / "runs", progress=False)
    assert folder_state(run_dir) == before
    edit(folder / "work1.txt", f"work 1: {TEXT}")  # put back as it was: the resume continues
    assert train_run(cfg, tmp_path / "runs", progress=False)["step"] == 4


def test_token_files_are_fingerprinted(tmp_path):
    tokens = tmp_path / "tokens"
    prepare(corpus(tmp_path), "byte", tokens, progress=False)
    cfg = config(tokens)
    train_run(cfg, tmp_path / "runs", progress=False)
    run_dir = tmp_path / "runs" / cfg.run_id()
    assert {Path(k).name for k in recorded(run_dir)} == {"train.bin", "val.bin", "meta.json"}
    before = folder_state(run_dir)
    raw = bytearray((tokens / "train.bin").read_bytes())
    raw[10] = (raw[10] + 1) % 128
    (tokens / "train.bin").write_bytes(bytes(raw))
    with pytest.raises(DataChangedError, match=r"tokens/train\.bin changed"):
        train_run(cfg, tmp_path / "runs", progress=False)
    assert folder_state(run_dir) == before


@needs("datasets")
def test_a_changed_jsonl_file_is_refused(tmp_path):
    docs = tmp_path / "docs.jsonl"
    rows = [{"text": f"document {i}: " + TEXT} for i in range(4)]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(docs)
    train_run(cfg, tmp_path / "runs", progress=False)
    docs.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"text": "one more"}]))
    with pytest.raises(DataChangedError, match=r"docs\.jsonl changed"):
        train_run(cfg, tmp_path / "runs", progress=False)


def test_a_stacked_group_and_a_sweep_worker_refuse_without_writing(tmp_path):
    folder = corpus(tmp_path)
    cfgs = [config(folder, f"train.lr={lr}") for lr in (1e-3, 3e-3)]
    root = tmp_path / "runs"
    first = train_group(cfgs, root)
    before = {c.run_id(): folder_state(root / c.run_id()) for c in cfgs}
    edit(folder / "work0.txt", "changed " + TEXT)
    again = train_group(cfgs, root)
    for cfg in cfgs:
        s = again[cfg.run_id()]
        assert s["outcome"] == "failed" and s["reason"] == "DataChangedError"
        assert "work0.txt changed" in s["message"] and "val_loss" not in s  # no old numbers
        assert first[cfg.run_id()]["outcome"] != "failed"
    summary, _ = run_one(cfgs[0].to_dict(), str(root))  # what a sweep's worker does
    assert summary["outcome"] == "failed" and "work0.txt changed" in summary["message"]
    assert {c.run_id(): folder_state(root / c.run_id()) for c in cfgs} == before


def test_a_folder_recorded_without_a_fingerprint_stays_usable(text_run):
    cfg, run_dir, summary = text_run
    config_yaml = run_dir / "config.yaml"
    data = yaml.safe_load(config_yaml.read_text())
    assert "data_fingerprint" in data["meta"]
    del data["meta"]["data_fingerprint"]  # as runs recorded before fingerprints were
    config_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    edit(Path("notes.txt"), TEXT + "more\n")
    assert train_run(cfg, "runs", progress=False) == summary  # nothing to check against


def test_large_files_compare_by_size_and_time(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint, "HASH_UP_TO", 100)
    path = tmp_path / "big.txt"
    path.write_text(TEXT)
    old = fingerprint.source_fingerprint(str(path))
    assert set(old[str(path)]) == {"size", "mtime_ns"}  # no hash above the limit
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (found,) = fingerprint.changes(old, fingerprint.source_fingerprint(str(path)))
    assert "was modified" in found and "by size and time" in found
    assert fingerprint.changes(old, old) == []
    assert fingerprint.changes(None, old) == []  # nothing recorded: nothing to say


def test_the_shipped_corpus_is_fingerprinted_once_per_process(monkeypatch):
    first = load_text_data("shakespeare").fingerprint
    assert len(first) == 42 and all(k.startswith("shakespeare/") for k in first)
    assert all(len(e["sha256"]) == 64 for e in first.values())

    def no_reading(path):
        raise AssertionError(f"{path} fingerprinted again")

    monkeypatch.setattr(fingerprint, "file_entry", no_reading)
    assert load_text_data("shakespeare").fingerprint == first
