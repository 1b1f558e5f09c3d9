"""The wall times the docs quote for cheap commands, measured here and recorded with the date and
the machine they were measured on.

    python scripts/doc_timings.py                  # run every command, record, rewrite the docs
    python scripts/doc_timings.py --only khop_example prepare_bpe
    python scripts/doc_timings.py --check          # exit 1 where a doc's figure is not the record

Each command of `COMMANDS` runs `--repeats` times (default 2), each in a fresh temporary folder
with a fresh `NORMLAB_CACHE` (so a BPE is trained and nothing earlier is reused: the time a first
run takes), offline, one after another. The fastest wall time is the one quoted (other work on a
shared machine only ever slows a command down; one run of examples/pre.yaml took 161 s beside
other work and 14 s alone); it goes to docs/timings.json with every repeat's time, the date,
the commit, the CPU model and core count (`lscpu`'s model name, `os.cpu_count()`) and the load
average before each repeat. A doc quotes a recorded time between two markers,

    <!-- time:NAME -->2.8 s (measured 2026-12-05 on 2 cores of Intel(R) Xeon(R) Processor)
    <!-- /time -->   (on one line in the doc)

and this script writes the text between the markers from the record (`figure_text`); `--check`
runs nothing and compares (tests/test_doc_timings.py). Times of expensive work (the study
profiles, long fine-tunes, real checkpoints) are not run here: the docs give them with the date
and commit of the run they come from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "timings.json"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- time:([a-z0-9_]+) -->(.*?)<!-- /time -->", re.S)
_NORMLAB = [sys.executable, "-m", "normlab"]
_EXAMPLES = ROOT / "examples"

# name -> (what it is, the command); every command runs with the repository's examples by
# absolute path, from an empty folder that receives its runs and data
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "prepare_bpe": (
        "normlab prepare shakespeare --tokenizer bpe:2048 (BPE trained, nothing cached)",
        [*_NORMLAB, "prepare", "shakespeare", "--tokenizer", "bpe:2048", "--out",
         "data/shakespeare_bpe"]),
    "prepare_bytes": (
        "normlab prepare shakespeare (bytes: no tokenizer to train)",
        [*_NORMLAB, "prepare", "shakespeare", "--out", "data/shakespeare_bytes"]),
    "bpe_sweep": (
        "normlab sweep run examples/sweeps/bpe_pre_post.yaml --workers 2 (both runs, BPE "
        "trained first)",
        [*_NORMLAB, "sweep", "run", str(_EXAMPLES / "sweeps" / "bpe_pre_post.yaml"),
         "--workers", "2", "--quiet"]),
    "khop_example": (
        "normlab train examples/khop.yaml",
        [*_NORMLAB, "train", str(_EXAMPLES / "khop.yaml"), "--quiet"]),
    "example_pre": (
        "normlab train examples/pre.yaml",
        [*_NORMLAB, "train", str(_EXAMPLES / "pre.yaml"), "--quiet"]),
    "example_post": (
        "normlab train examples/post.yaml",
        [*_NORMLAB, "train", str(_EXAMPLES / "post.yaml"), "--quiet"]),
    "example_modern": (
        "normlab train examples/modern.yaml",
        [*_NORMLAB, "train", str(_EXAMPLES / "modern.yaml"), "--quiet"]),
}


def cpu_model() -> str:
    """`lscpu`'s model name ('unknown' where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def measure(name: str, repeats: int = 2) -> dict:
    """Run `COMMANDS[name]` `repeats` times, each in a fresh folder and cache; the fastest wall
    time, every repeat's, and where."""
    times, loads = [], []
    for _ in range(repeats):
        seconds, load = _run_once(name)
        times.append(round(seconds, 1))
        loads.append(round(load, 2))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    return {"what": COMMANDS[name][0], "seconds": min(times), "repeats": times,
            "load_before": loads, "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "cpu": cpu_model(), "cores": os.cpu_count()}


def _run_once(name: str) -> tuple[float, float]:
    """One run of `COMMANDS[name]` in a fresh folder and cache: its wall seconds and the load
    average just before."""
    _what, cmd = COMMANDS[name]
    with tempfile.TemporaryDirectory(prefix=f"doc-timing-{name}-") as tmp:
        env = {**os.environ, "NORMLAB_CACHE": str(Path(tmp) / "cache"),
               "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        load = os.getloadavg()[0]  # other work on the machine, recorded beside the time
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{name}: {' '.join(cmd)} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, load


def duration_text(seconds: float) -> str:
    """2.8 s, 34 s, 1.6 min."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def figure_text(entry: dict) -> str:
    """What a doc shows between a timing's markers."""
    return (f"{duration_text(entry['seconds'])} (measured {entry['date']} on {entry['cores']} "
            f"cores of {entry['cpu']})")


def read_record(path: Path = RECORD) -> dict[str, dict]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def rewrite(text: str, record: dict[str, dict]) -> str:
    """`text` with every managed figure written from `record` (an unknown name is kept)."""
    def sub(m: re.Match) -> str:
        entry = record.get(m.group(1))
        return m.group(0) if entry is None else \
            f"<!-- time:{m.group(1)} -->{figure_text(entry)}<!-- /time -->"
    return MARKER.sub(sub, text)


def problems(docs: list[Path] = DOCS, record: dict[str, dict] | None = None) -> list[str]:
    """Every managed figure that is not what the record says, or names no recorded timing."""
    record = read_record() if record is None else record
    out = []
    for path in docs:
        for m in MARKER.finditer(path.read_text(encoding="utf-8")):
            name, shown = m.group(1), m.group(2)
            if name not in record:
                out.append(f"{path.name}: time:{name} is not in {RECORD.name}")
            elif shown != figure_text(record[name]):
                out.append(f"{path.name}: time:{name} says {shown!r}, the record "
                           f"{figure_text(record[name])!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare the docs with the record")
    ap.add_argument("--only", nargs="+", choices=list(COMMANDS), help="measure only these")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each; the fastest counts")
    args = ap.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line)
        return 1 if found else 0
    record = read_record()
    for name in args.only or COMMANDS:
        record[name] = measure(name, args.repeats)
        print(f"{name}: {figure_text(record[name])}", flush=True)
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        if MARKER.search(text) and rewrite(text, record) != text:
            path.write_text(rewrite(text, record), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
