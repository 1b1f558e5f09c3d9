"""A run folder: its lock, and reading it without trusting it.

    runs/<run_id>/.lock   held (flock) by the one process that trains the run: `normlab train`,
                          a sweep's worker, the study's runs, rank 0 of a multi-process run. It
                          holds that process's pid (and host) while it holds the lock, and is
                          emptied when it lets go; the kernel releases the lock when the process
                          ends, however it ends, so a dead holder never blocks anyone. A pid left
                          in the file is a holder that ended without letting go (killed, crashed):
                          the next holder says that it cleared that stale lock.

`read_run_folder` is the one reader of run folders for everything that lists them (`normlab runs`,
`sweep summarize`, `report`): a folder whose config.yaml or summary.json cannot be read is
returned as `damaged`, with why, and never hides the other folders.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from normlab.config import ConfigError, RunConfig, parse_config
from normlab.userinput import read_yaml
from normlab.warnings import NormlabWarning

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; two writers on one folder are not prevented
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"
FINISHED = ("completed", "stalled", "diverged")  # results: never trained again


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as asked (exists with another config, nothing to resume,
    damaged, in use by another process)."""


class RunLockedError(RunFolderError):
    """Another process is training this run folder."""


# -- the lock ----------------------------------------------------------------------------------

# run folder -> [fd, depth, note]: the locks this process holds, each with what taking it said
_held: dict[Path, list[Any]] = {}
_held_guard = threading.Lock()
_HOST = socket.gethostname()


def lock_holder(run_dir: Path) -> int | None:
    """The pid written into the run's lock file by its holder (None if unknown or none)."""
    return _lock_text_holder(_read_lock(Path(run_dir) / LOCK_FILE))[0]


def _read_lock(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _lock_text_holder(text: str) -> tuple[int | None, str | None]:
    """(pid, host) from a lock file's text, `"<pid> <host>"` (older files: the pid alone)."""
    words = text.split()
    try:
        pid = int(words[0])
    except (ValueError, IndexError):
        return None, None
    return pid, words[1] if len(words) > 1 else None


def pid_exists(pid: int) -> bool:
    """Whether a process of this id exists on this machine (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True  # cannot tell: taken as alive, so that nothing is said wrongly
    return True


def _holder_text(pid: int | None, host: str | None) -> str:
    if pid is None:
        return "process (unknown pid)"
    return f"process {pid}" + (f" on host {host}" if host and host != _HOST else "")


def _stale_note(run_dir: Path, text: str) -> str | None:
    """What to say on taking a lock whose file still names a holder: one that ended without
    letting go (killed, crashed). None when it names none, this process, or a process of this
    machine that still exists (a reused pid, or a file left by an older normlab)."""
    pid, host = _lock_text_holder(text)
    if pid is None or (host in (None, _HOST) and (pid == os.getpid() or pid_exists(pid))):
        return None
    gone = ("which no longer exists" if host in (None, _HOST) else
            "which did not let go of it (killed, or its host went down)")
    return (f"{run_dir}: cleared a stale lock: it named {_holder_text(pid, host)}, {gone}; "
            "the run proceeds")


def _locked_message(run_dir: Path) -> str:
    """Why the lock cannot be taken: its holder, by pid; or, when the named process no longer
    exists, the process it started that holds the lock still (a child that inherited it)."""
    pid, host = _lock_text_holder(_read_lock(run_dir / LOCK_FILE))
    if pid is not None and host in (None, _HOST) and not pid_exists(pid):
        return (f"{run_dir}: locked by a process that process {pid}, which no longer exists, "
                f"started and that still runs (it inherited the lock; `fuser "
                f"{run_dir / LOCK_FILE}` names it); stop it, then run again")
    return (f"{run_dir}: in use by {_holder_text(pid, host)}, which is training this run (a "
            "`normlab train`, a sweep or a study); wait for it to finish or stop it, then run "
            "again")


@contextlib.contextmanager
def hold_run(run_dir: Path, *, wait: bool = False) -> Iterator[str | None]:
    """Hold the run's lock for the block: re-entrant within a process (a sweep worker holds it,
    then the trainer takes it again). Another process holding it: with `wait`, block until it is
    free (a sweep's worker waiting out an earlier worker); otherwise raise `RunLockedError`,
    naming the folder and the holder's pid. A lock file left by a holder that ended without
    letting go (killed) is a stale lock: taking it warns, naming that pid and the run, and the
    block is given the note (the trainer keeps it with the run's repairs); otherwise None."""
    run_dir = Path(run_dir)
    key = run_dir.resolve()
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield _held[key][2]
        finally:
            with _held_guard:
                _held[key][1] -= 1
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield None
        return
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise RunLockedError(_locked_message(run_dir)) from None
        note = _stale_note(run_dir, os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        if note is not None:
            warnings.warn(note, NormlabWarning, stacklevel=3)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_HOST}\n".encode(), 0)
        with _held_guard:
            _held[key] = [fd, 1, note]
        try:
            yield note
        finally:
            with _held_guard:
                _held.pop(key, None)
            os.ftruncate(fd, 0)  # let go: a pid left in the file means a holder that did not
    finally:
        os.close(fd)  # closing releases the lock


def is_live(run_dir: Path) -> bool | None:
    """True if a process holds the run's lock, False if not, None if it cannot be told."""
    path = Path(run_dir) / LOCK_FILE
    if fcntl is None or not path.exists():
        return None
    if path.parent.resolve() in _held:
        return True
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        return False
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------------

def read_config_data(run_dir: Path) -> dict[str, Any]:
    """config.yaml's mapping (with its `meta` section), or `RunFolderError` saying why it cannot
    be read: missing, not text, not YAML, not a mapping."""
    path = Path(run_dir) / "config.yaml"
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise RunFolderError(f"{run_dir}: not a run folder (config.yaml missing)") from None
    except UnicodeDecodeError:
        raise RunFolderError(f"{path}: damaged (not text)") from None
    except OSError as e:
        raise RunFolderError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        data = read_yaml(text)
    except (yaml.YAMLError, ConfigError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunFolderError(f"{path}: damaged (not valid YAML: {first})") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: damaged (a {type(data).__name__}, not a mapping of "
                             "config sections)")
    return data


def read_run_config(run_dir: Path) -> RunConfig:
    """The run's validated config; `RunFolderError` for a damaged file, `ConfigError` for one
    whose values this normlab does not accept (e.g. `lr: null`)."""
    data = dict(read_config_data(run_dir))
    data.pop("meta", None)
    return parse_config(RunConfig, data)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """summary.json, or None when it is missing, cut short or not a JSON object."""
    data = _read_json_object(Path(run_dir) / "summary.json")
    return data if isinstance(data, dict) else None


def summary_problem(run_dir: Path) -> str | None:
    """Why summary.json cannot be read (None when it reads, or there is none)."""
    data = _read_json_object(Path(run_dir) / "summary.json")
    return data if isinstance(data, str) else None


def _read_json_object(path: Path) -> dict[str, Any] | str | None:
    """The JSON object in `path`; None if there is no file; a string saying why otherwise."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        return "not text"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg} at line {e.lineno})"
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    return data


@dataclass
class RunFolder:
    """What a listing shows of one run folder. `outcome` is the summary's, `running` resolved
    against the lock (a dead holder: `interrupted`), `pending` when nothing was written yet, or
    `damaged` with the reasons in `problems`."""

    path: Path
    config: RunConfig | None = None     # validated, when this normlab accepts it
    raw_config: dict[str, Any] = field(default_factory=dict)  # the YAML as written, no meta
    meta: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    outcome: str = "pending"
    problems: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def damaged(self) -> bool:
        return self.outcome == "damaged"


def read_run_folder(run_dir: Path) -> RunFolder:
    """Read a run folder without ever raising for its content (see `RunFolder`)."""
    run_dir = Path(run_dir)
    rf = RunFolder(path=run_dir)
    data = None
    has_config = (run_dir / "config.yaml").exists()  # not yet: a run just being started
    try:
        data = read_config_data(run_dir) if has_config else None
    except RunFolderError as e:
        rf.problems.append(str(e))
    if data is not None:
        meta = data.get("meta")
        rf.meta = meta if isinstance(meta, dict) else {}
        rf.raw_config = {k: v for k, v in data.items() if k != "meta"}
        try:
            rf.config = parse_config(RunConfig, rf.raw_config)
        except ConfigError as e:
            detail = "; ".join(line.strip() for line in str(e).splitlines()[1:]) or str(e)
            rf.problems.append(f"{run_dir / 'config.yaml'}: not a valid config for this "
                               f"normlab ({detail})")
    summary = _read_json_object(run_dir / "summary.json")
    if isinstance(summary, dict):
        rf.summary = summary
        rf.outcome = str(summary.get("outcome", "pending"))
        if rf.outcome == "running" and is_live(run_dir) is False:
            rf.outcome = "interrupted"
    elif isinstance(summary, str):
        rf.problems.append(f"{run_dir / 'summary.json'}: damaged ({summary}); `normlab train "
                           f"--resume {run_dir}` rebuilds it")
    if rf.outcome in FINISHED:
        weights = run_dir / "checkpoint" / "model.safetensors"
        broken = safetensors_problem(weights) if weights.exists() else None
        if broken:
            rf.problems.append(f"{weights}: {broken}; the run's weights cannot be loaded (train "
                               "it again, or restore the file)")
    if rf.problems:
        rf.outcome = "damaged"
    return rf


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is not whole (its header unreadable, or fewer bytes than the
    header's tensors end at), or None: a check of the file's structure that reads no tensor."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "truncated (no header)"
            n = int.from_bytes(head, "little")
            header = json.loads(f.read(n)) if n <= 100_000_000 else None
        end = max((int(t["data_offsets"][1]) for k, t in header.items()
                   if k != "__metadata__"), default=0)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "damaged (its header is not a safetensors header)"
    size = path.stat().st_size
    if size < 8 + n + end:
        return f"truncated ({size:,} bytes of {8 + n + end:,})"
    return None


def find_run_folders(root: Path) -> tuple[list[Path], list[Path]]:
    """(run folders, sweep roots) at any depth below `root`, sorted; a run folder (one with a
    config.yaml) is not searched inside, hidden folders (.git, .venv) are skipped. A sweep root
    is a folder with a sweep.json; its runs are its child folders."""
    runs, sweeps = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(dirpath)
        if "sweep.json" in filenames:
            sweeps.append(here)
        if "config.yaml" in filenames:
            runs.append(here)
            dirnames[:] = []
    return runs, sweeps


def run_folders(root: Path) -> list[Path]:
    """The run folders directly under `root` (those with a config.yaml), sorted."""
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and (p / "config.yaml").exists())


# -- metrics.jsonl ---------------------------------------------------------------------------

def parse_metrics(text: str) -> tuple[list[tuple[dict[str, Any], str]], list[tuple[int, str]]]:
    """(records with their line, damaged lines as (line number, text)): every line that is a JSON
    object with a step is a record, whatever comes before or after it; any other line (cut or
    garbled) is damaged, except an unterminated last line: a write cut by a kill, which is past
    the last checkpoint (records are flushed before each checkpoint) and dropped quietly."""
    records, damaged = [], []
    lines = text.split("\n")
    unterminated = lines.pop()  # "" when the text ends with a newline
    for number, line in enumerate(lines, start=1):
        record = _record(line)
        if record is not None:
            records.append((record, line))
        elif line.strip():
            damaged.append((number, line))
    record = _record(unterminated)
    if record is not None:  # a last record whose newline was not written yet
        records.append((record, unterminated))
    return records, damaged


def _record(line: str) -> dict[str, Any] | None:
    """The metrics record on one line, or None when it is not one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def _read_text(path: Path) -> str | None:
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The intact records of a metrics.jsonl (damaged lines skipped); [] when there is none."""
    text = _read_text(path)
    return [] if text is None else [r for r, _ in parse_metrics(text)[0]]


def cut_metrics_after(path: Path, step: int) -> tuple[list[dict[str, Any]], str | None]:
    """Keep the intact records of metrics.jsonl up to `step` (a resume continues from there) and
    drop the rest. Damaged lines are moved to `metrics.jsonl.damaged`, never silently lost.
    Returns (the records kept, what was skipped or None)."""
    path = Path(path)
    text = _read_text(path)
    if text is None:
        return [], None
    records, damaged = parse_metrics(text)
    kept = [(r, line) for r, line in records if r["step"] <= step]
    note = None
    if damaged:
        with path.with_name(path.name + ".damaged").open("a") as f:
            f.writelines(line + "\n" for _, line in damaged)
        where = ", ".join(str(n) for n, _ in damaged[:10]) + (" ..." if len(damaged) > 10 else "")
        note = (f"{path}: skipped {len(damaged)} damaged line(s) (line {where}), kept in "
                f"{path.name}.damaged; every intact record was kept")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for _, line in kept))
    os.replace(tmp, path)  # a kill while rewriting must not lose checkpointed lines
    return [r for r, _ in kept], note


def seed_metrics(source: Path, target: Path, step: int) -> None:
    """`target` (an extension's metrics.jsonl) written with the intact records of `source` (the
    run it extends) up to `step`, so that the extension's records tell its whole trajectory."""
    text = _read_text(source)
    kept = [line for r, line in parse_metrics(text or "")[0] if r["step"] <= step]
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, target)


def split_run_step(given: Path | str) -> tuple[Path, int | None]:
    """A command's `RUN@STEP` as (RUN, STEP): the run (a folder, or under ./runs its id, a
    unique prefix of it or its name; see `find_run`) and the step of the weights to read; a RUN
    without `@STEP`, or a path that exists as given, is (RUN, None): its latest checkpoint.
    `RunFolderError` for a STEP that is not a step count."""
    text = str(given)
    run, at, step = text.rpartition("@")
    if not at or Path(text).exists():
        return Path(given), None
    if not step.isdigit() or not run:
        raise RunFolderError(f"{text}: give RUN@STEP with STEP a step count (e.g. {run or 'RUN'}"
                             "@200), or the run alone for its latest checkpoint")
    return Path(run), int(step)


def find_run(given: Path | str, root: Path | str = "runs") -> Path:
    """The run folder a command was given: the path itself when it exists; otherwise, for a bare
    word, the one run under `root` (at any depth, a sweep's runs too) whose id starts with it or
    whose `train.name` is it. Several matches: `RunFolderError` listing them. None: the path as
    given, for the caller to say that it does not exist."""
    path = Path(given)
    if path.exists() or len(path.parts) != 1 or not Path(root).is_dir():
        return path
    word = str(given)
    runs, _ = find_run_folders(Path(root))
    by_id = [r for r in runs if r.name.startswith(word)]
    by_name = []
    for r in runs:
        try:
            data = read_config_data(r)
        except RunFolderError:
            continue
        train = data.get("train") if isinstance(data.get("train"), dict) else {}
        if train.get("name") == word:
            by_name.append(r)
    found = list(dict.fromkeys(by_id + by_name))
    if len(found) > 1:
        shown = ", ".join(str(r) for r in found[:8]) + (" ..." if len(found) > 8 else "")
        raise RunFolderError(f"{word}: names {len(found)} runs under {root} ({shown}); give "
                             "more of the id, or the folder")
    return found[0] if found else path
