"""Bring your own data: tokenizers (`data.tokenizer`: byte, bpe:N, a tokenizer file), token files
(nanoGPT's train.bin/val.bin, read by memory map), .jsonl/.parquet documents, `normlab prepare`,
bits per byte in every evaluation, and each bad input as one clear error (exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from optional_packages import needs
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.runs import runs_table
from normlab.config import ConfigError, load_run_config
from normlab.data import DataError, TokenArray, load_run_data, load_text_data, load_works
from normlab.data.tokenfiles import prepare, read_token_folder
from normlab.data.tokenizer import ByteTokenizer, load_tokenizer_file, train_bpe
from normlab.train import read_run_config, train_run
from normlab.train.logging import read_metrics
from normlab.train.sample import sample_run

TINY = ["model.n_blocks=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.eval_every=2",
        "train.steps=2", "train.log_every=1", "train.device=cpu"]

WORDS = ("the quick brown fox jumps over the lazy dog and then the dog sleeps while the fox "
         "runs far away into the deep green forest where the old owl watches everything ")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Trained tokenizers go to a folder of the test's own."""
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A folder of six small works (about 3 kB each)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(0)
    words = WORDS.split()
    for i in range(6):
        text = " ".join(rng.choice(words, size=600)) + "\n"
        (folder / f"work{i}.txt").write_text(text)
    return folder


def cli(*args: str):
    return CliRunner().invoke(app, [*map(str, args)], terminal_width=200)


def said(result) -> str:
    return " ".join(result.output.split())


# -- run ids and the config -----------------------------------------------------------------------
def test_the_default_tokenizer_leaves_run_ids_as_they_were():
    base = load_run_config(None, [])
    assert base.run_id() == "pre-L6-d256-b018512572e8"  # tests/data/test_khop.py's recorded id
    explicit = load_run_config(None, ["data.tokenizer=byte", "data.text_field=text"])
    assert explicit.run_id() == base.run_id()
    bpe = load_run_config(None, ["data.tokenizer=bpe:512"])
    assert bpe.run_id() != base.run_id() and bpe.model.vocab_size == 512  # follows the tokenizer
    assert load_run_config(None, ["data.tokenizer=bpe:512", "model.vocab_size=512"]
                           ).run_id() == bpe.run_id()
    # a k-hop run's id, computed before data.tokenizer existed
    khop = ["data.task=khop", "model.vocab_size=8", "data.seq_len=32", "model.max_seq_len=32"]
    assert load_run_config(None, khop).run_id() == "pre-L6-d256-db28b866d3a5"


@pytest.mark.parametrize("overrides,needle", [
    (["data.tokenizer=bpe:100"], "give N from 257"),
    # (read as a tokenizer file's name, which the tokenizers package reads)
    pytest.param(["data.tokenizer=bpe:lots"], "write bpe:N", marks=needs("tokenizers")),
    (["data.tokenizer=bpe:512", "model.vocab_size=300"],
     "model.vocab_size: 300 is smaller than the 512 tokens of data.tokenizer=bpe:512"),
    (["data.task=khop", "model.vocab_size=8", "data.tokenizer=bpe:512"],
     "tokenizer: not used with task=khop"),
])
def test_tokenizer_settings_that_cannot_work_are_named(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_run_config(None, overrides)
    assert needle in str(e.value)


# -- tokenizers -----------------------------------------------------------------------------------
@needs("tokenizers")
def test_bpe_is_trained_on_the_training_split_only_deterministic_and_cached(corpus, cache):
    data = load_text_data(corpus, tokenizer="bpe:300", val_fraction=0.2)
    assert data.tokenizer.vocab_size == 300 and data.vocab_size == 300
    assert data.train.data.dtype == np.uint16 and int(data.train.data.max()) < 300
    # the ids decode back to the text, works joined by a blank line
    held_out = "\n\n".join((corpus / f"{n}.txt").read_text() for n in data.val_works)
    assert data.tokenizer.decode(data.val.data) == held_out
    assert data.val_bytes == len(held_out.encode()) and data.tokens_per_byte < 1  # merges
    assert len(list((cache / "tokenizers").glob("bpe300-*.json"))) == 1
    # the held-out works do not change it (and it is read from the cache); a training work does
    (corpus / f"{data.val_works[0]}.txt").write_text("zzzz qqqq " * 300)
    again = load_text_data(corpus, tokenizer="bpe:300", val_fraction=0.2)
    assert again.tokenizer.to_json() == data.tokenizer.to_json()
    assert len(list((cache / "tokenizers").glob("*.json"))) == 1
    (corpus / f"{data.train_works[0]}.txt").write_text("zzzz qqqq " * 300)
    changed = load_text_data(corpus, tokenizer="bpe:300", val_fraction=0.2)
    assert changed.tokenizer.to_json() != data.tokenizer.to_json()
    # deterministic: trained twice without a cache, the same merges
    works = load_works(corpus)
    assert train_bpe(works, 300, cache=cache / "a").to_json() == train_bpe(
        works, 300, cache=cache / "b").to_json()


@needs("tokenizers")
def test_a_tokenizer_file_or_folder_is_used_and_the_vocabulary_follows_it(corpus, tmp_path):
    tok = train_bpe(load_works(corpus), 320, cache=tmp_path / "c")
    folder = tmp_path / "hf_tokenizer"
    tok.save(folder)
    for spec in (folder / "tokenizer.json", folder):
        cfg = load_run_config(None, [f"data.source={corpus}", f"data.tokenizer={spec}"])
        assert cfg.model.vocab_size == 320
        data = load_run_data(cfg.data, cfg.model)
        assert data.tokenizer.to_json() == tok.to_json()
    small = load_run_config(None, [f"data.source={corpus}", f"data.tokenizer={folder}",
                                   "model.vocab_size=256"])
    with pytest.raises(DataError, match="model.vocab_size: 256 is smaller than the 320 tokens"
                                        ".*set model.vocab_size: 320"):
        load_run_data(small.data, small.model)


@needs("tokenizers")
def test_a_bpe_run_saves_its_tokenizer_and_sample_decodes_through_it(corpus, tmp_path):
    cfg = load_run_config(None, [*TINY, f"data.source={corpus}", "data.tokenizer=bpe:300"])
    s = train_run(cfg, tmp_path / "runs", progress=False)
    run = tmp_path / "runs" / s["run_id"]
    assert (run / "tokenizer.json").is_file()
    saved = load_tokenizer_file(run / "tokenizer.json")
    assert saved.vocab_size == 300
    evals = [r for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r]
    assert evals and all("val_bpb" in r for r in evals)
    data = load_run_data(cfg.data)
    assert s["val_bpb"] == pytest.approx(s["val_loss"] / math.log(2) * len(data.val)
                                         / data.val_bytes)
    assert s["unigram_entropy"] == pytest.approx(data.train.unigram_entropy)  # of BPE ids
    text = sample_run(run, "the fox", tokens=5, temperature=0.0)
    assert isinstance(text, str) and text  # 5 BPE tokens, decoded
    r = cli("sample", run, "--prompt", "the fox", "--tokens", "5", "--top-k", "299")
    assert r.exit_code == 0, r.output
    # the genre task reads bytes: a BPE run is refused by name, not fed byte ids
    r = cli("finetune", run, "--task", "genre", "--steps", "1")
    assert r.exit_code == 2 and "fine-tune a byte-level run" in said(r), r.output


def test_bits_per_byte_of_a_byte_run_is_its_loss_over_ln2(tmp_path):
    s = train_run(load_run_config(None, TINY), tmp_path, progress=False)
    assert s["val_bpb"] == pytest.approx(s["val_loss"] / math.log(2))
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    assert all("val_bpb" in r for r in rows if "val_loss" in r)


# -- token files ----------------------------------------------------------------------------------
def write_nanogpt(folder: Path, train_ids, val_ids, dtype=np.uint16) -> Path:
    """As nanoGPT's data/shakespeare/prepare.py writes them: `np.array(ids, dtype=np.uint16)`
    then `.tofile(os.path.join(os.path.dirname(__file__), 'train.bin'))`."""
    folder.mkdir(parents=True, exist_ok=True)
    np.array(train_ids, dtype=dtype).tofile(folder / "train.bin")
    np.array(val_ids, dtype=dtype).tofile(folder / "val.bin")
    return folder


def test_nanogpt_token_files_train_by_memory_map(tmp_path):
    rng = np.random.default_rng(0)
    folder = write_nanogpt(tmp_path / "nano", rng.integers(0, 65, 5000), rng.integers(0, 65, 600))
    data = read_token_folder(folder)
    assert isinstance(data.train.data, np.memmap) and data.train.data.dtype == np.uint16
    assert len(data.train) == 5000 and data.tokenizer is None and data.val_bytes is None
    x, y = data.sampler(4, 16, seed=0).batch(0)
    assert x.dtype.is_floating_point is False and int(x.max()) < 65
    cfg = load_run_config(None, [*TINY, f"data.source={folder}", "model.vocab_size=65"])
    s = train_run(cfg, tmp_path / "runs", progress=False)
    assert s["outcome"] in ("completed", "stalled") and s["step"] == 2
    assert "val_bpb" not in s  # no tokenizer, no bytes: not reported rather than made up
    assert s["unigram_entropy"] == pytest.approx(data.train.unigram_entropy)


def test_uint32_token_files_with_meta(tmp_path):
    folder = write_nanogpt(tmp_path / "big", np.arange(4000) * 20, np.arange(500) * 20,
                           dtype=np.uint32)
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 80_000}))
    cfg = load_run_config(None, [*TINY, f"data.source={folder}"])
    assert cfg.model.vocab_size == 80_000  # follows meta.json
    data = load_run_data(cfg.data, cfg.model)
    assert data.train.data.dtype == np.uint32 and int(data.train.data[-1]) == 79_980


# -- documents: .jsonl and .parquet ----------------------------------------------------------------
@needs("datasets", "pyarrow")
def test_jsonl_and_parquet_documents(tmp_path):
    rows = [{"text": f"document {i}: " + WORDS * 3, "id": i} for i in range(10)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    works = load_works(jsonl)
    assert [w.name for w in works][:2] == ["docs:1", "docs:2"] and len(works) == 10
    assert works[3].text.startswith(b"document 3: ")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": [r["text"] for r in rows]}), parquet)
    assert [w.text for w in load_works(parquet, text_field="body")] == [w.text for w in works]
    data = load_text_data(jsonl, tokenizer="byte")
    assert len(data.val_works) >= 1 and set(data.val_works).isdisjoint(data.train_works)


# -- normlab prepare ------------------------------------------------------------------------------
@needs("tokenizers")
def test_prepare_writes_what_a_run_would_build_and_resumes(corpus, tmp_path):
    out = tmp_path / "prepared"
    first = prepare(corpus, "bpe:300", out, val_fraction=0.2, progress=False, batch_works=1,
                    stop_after=2)
    assert first.get("interrupted") and not (out / "train.bin").exists()
    assert (out / "train.bin.part").exists()
    meta = prepare(corpus, "bpe:300", out, val_fraction=0.2, progress=False, batch_works=1)
    assert meta["vocab_size"] == 300 and meta["dtype"] == "uint16"
    assert not (out / "prepare.json").exists() and (out / "tokenizer.json").exists()
    direct = load_text_data(corpus, tokenizer="bpe:300", val_fraction=0.2)
    files = read_token_folder(out)
    np.testing.assert_array_equal(np.asarray(files.train.data), direct.train.data)
    np.testing.assert_array_equal(np.asarray(files.val.data), direct.val.data)
    assert files.val_bytes == direct.val_bytes and files.val_works == direct.val_works
    assert files.tokenizer.to_json() == direct.tokenizer.to_json()
    # once more: nothing to do, nothing rewritten
    stamp = (out / "train.bin").stat().st_mtime_ns
    assert prepare(corpus, "bpe:300", out, val_fraction=0.2, progress=False) == meta
    assert (out / "train.bin").stat().st_mtime_ns == stamp


@needs("tokenizers")
def test_prepare_shakespeare_bpe_then_train_and_sample_offline(tmp_path, monkeypatch):
    """The issue's own check: `normlab prepare shakespeare --tokenizer bpe:2048 --out DIR`, a
    run on DIR that logs loss per token and bits per byte, and `normlab sample` decoding it."""
    monkeypatch.chdir(tmp_path)
    r = cli("prepare", "shakespeare", "--tokenizer", "bpe:2048", "--out", "data/shakespeare_bpe",
            "--quiet")
    assert r.exit_code == 0, r.output
    assert "vocabulary 2048" in said(r)
    r = cli("train", "--set", "data.source=data/shakespeare_bpe", *(f"--set={s}" for s in TINY),
            "--root", "runs")
    assert r.exit_code == 0, r.output
    assert "val_bpb" in r.output and "val_loss" in r.output
    run = next(Path("runs").iterdir())
    assert read_run_config(run).model.vocab_size == 2048
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["val_bpb"] < summary["val_loss"] / math.log(2)  # > 1 byte per token
    r = cli("sample", run, "--prompt", "ROMEO:", "--tokens", "8")
    assert r.exit_code == 0 and r.output.startswith("ROMEO:"), r.output
    table = runs_table(Path("runs"))
    assert "val bpb" in [c.header for c in table.columns]


# -- bad input: one clear error naming the file, exit 2, nothing written ---------------------------
def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    high = write_nanogpt(tmp_path / "high", [1, 2, 300] * 40, [1, 2, 3] * 40)
    odd = write_nanogpt(tmp_path / "odd", [1] * 100, [1] * 50)
    with open(odd / "train.bin", "ab") as f:
        f.write(b"\x01")
    empty_bin = write_nanogpt(tmp_path / "emptybin", [], [1] * 50)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"text\x00\x01\x02 more")
    (tmp_path / "nofield.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n\n{"body": "c"}\n')
    (tmp_path / "bad_tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    (tmp_path / "notjson.jsonl").write_text('{"text": "ok"}\n\n{"text": "fine"}\n{"text": \n')
    return {
        "id above the vocabulary": (
            [f"data.source={high}"],
            f"{high / 'train.bin'}: token id 300 (at token 2) is at or above "
            "model.vocab_size=256"),
        "not a whole number of tokens": (
            [f"data.source={odd}"],
            f"{odd / 'train.bin'}: its size, 201 bytes, is not a whole number of uint16 tokens"),
        "empty .bin": ([f"data.source={empty_bin}"], f"{empty_bin / 'train.bin'} is empty"),
        "empty file": ([f"data.source={tmp_path / 'empty.txt'}"],
                       f"text file {tmp_path / 'empty.txt'} is empty"),
        "binary file": ([f"data.source={tmp_path / 'binary.txt'}"],
                        f"text file {tmp_path / 'binary.txt'} holds a NUL byte (at byte 4), so "
                        "it is binary, not text"),
        "JSONL line without the text field": (
            [f"data.source={tmp_path / 'nofield.jsonl'}"],
            f"JSONL file {tmp_path / 'nofield.jsonl'}, line 4: no field 'text'"),
        "JSONL line that is not JSON": (
            [f"data.source={tmp_path / 'notjson.jsonl'}"],
            f"JSONL file {tmp_path / 'notjson.jsonl'} cannot be read: JSON parse error"),
        "tokenizer file that does not parse": (
            [f"data.tokenizer={tmp_path / 'bad_tokenizer.json'}", "model.vocab_size=256"],
            f"tokenizer file {tmp_path / 'bad_tokenizer.json'} does not parse"),
    }


CASES = ["id above the vocabulary", "not a whole number of tokens", "empty .bin", "empty file",
         "binary file",
         pytest.param("JSONL line without the text field", marks=needs("datasets")),
         pytest.param("JSONL line that is not JSON", marks=needs("datasets")),
         pytest.param("tokenizer file that does not parse", marks=needs("tokenizers"))]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_error_naming_the_file_exit_2(case, tmp_path):
    sets, needle = _bad_inputs(tmp_path)[case]
    root = tmp_path / "runs"
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli("train", *(f"--set={s}" for s in [*TINY, *sets]), "--root", root)
    assert r.exit_code == 2, r.output
    assert needle in said(r), said(r)
    assert "Traceback" not in r.output
    assert not root.exists() or not any(root.iterdir())  # no run folder
    # nothing written beside, nothing removed (but the cache of what Hugging Face datasets read)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("runs", "cache")) == [
        n for n in before if n not in ("runs", "cache")]


@needs("datasets", "tokenizers")
def test_prepare_reports_bad_input_and_keeps_what_is_there(tmp_path):
    (tmp_path / "nofield.jsonl").write_text('{"text": "a"}\n{"body": "c"}\n')
    r = cli("prepare", tmp_path / "nofield.jsonl", "--out", tmp_path / "out")
    assert r.exit_code == 2 and "line 2: no field 'text'" in said(r), r.output
    other = write_nanogpt(tmp_path / "other", [1, 2, 3], [4, 5])
    r = cli("prepare", "shakespeare", "--out", other, "--quiet")
    assert r.exit_code == 2 and "already holds token files of another preparation" in said(r)
    assert np.fromfile(other / "train.bin", dtype=np.uint16).tolist() == [1, 2, 3]
    r = cli("prepare", "shakespeare", "--tokenizer", tmp_path / "nope.json", "--out",
            tmp_path / "o2")
    assert r.exit_code == 2 and "does not exist" in said(r), r.output


def test_token_arrays_keep_their_memory_map_and_dtype(tmp_path):
    folder = write_nanogpt(tmp_path / "n", np.arange(100), np.arange(50))
    data = read_token_folder(folder)
    assert isinstance(data.train, TokenArray) and repr(data.train).endswith("100 tokens, 1 works)")
    assert ByteTokenizer().decode(np.frombuffer(b"abc", dtype=np.uint8)) == "abc"


@needs("tokenizers")
def test_probes_read_a_checkpoint_s_text_through_its_own_tokenizer(corpus, tmp_path,
                                                                    monkeypatch):
    import normlab.probe.inputs as inputs

    cfg = load_run_config(None, [*TINY, f"data.source={corpus}", "data.tokenizer=bpe:300"])
    run = tmp_path / "runs" / train_run(cfg, tmp_path / "runs", progress=False)["run_id"]
    seen = []
    real = inputs.text_batches
    monkeypatch.setattr(inputs, "text_batches",
                        lambda *a, **k: seen.append(k["tokenizer"]) or real(*a, **k))
    out = tmp_path / "probe"
    r = cli("probe", "--checkpoint", run, "--out", out, "--batches", "1", "--batch-size", "2")
    assert r.exit_code == 0, r.output
    assert seen and all(t == str(run / "tokenizer.json") for t in seen)
    batches = real(corpus, tokenizer=seen[0], n_batches=1, batch_size=2, seq_len=16)
    assert int(batches[0][0].max()) >= 256  # BPE ids, not bytes


def test_the_bpe_example_trains_pre_and_post_on_a_bpe_vocabulary():
    from normlab.sweep.spec import plan_sweep

    path = Path(__file__).parents[2] / "examples" / "sweeps" / "bpe_pre_post.yaml"
    plan = plan_sweep(path)
    configs = [run.config for run in plan.runs]
    assert sorted(c.model.placement for c in configs) == ["post", "pre"]
    for c in configs:
        assert c.data.tokenizer == "bpe:2048" and c.model.vocab_size == 2048
        assert c.data.source == "shakespeare" and "example" in c.train.tags
