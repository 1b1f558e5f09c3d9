"""The names a command takes (a run's id, prefix or `train.name`; a placement; a claim, a probe,
a metric), and the "did you mean" for one that names nothing: `normlab.config.did_you_mean`,
the one helper every message of this kind uses (fields and values of a config, sweep axes)."""

from __future__ import annotations

from pathlib import Path

from normlab.cli.console import fail
from normlab.config import did_you_mean

__all__ = ["check_run_found", "did_you_mean", "run_name_hint"]


def run_name_hint(given: Path | str, root: Path | str = "runs") -> str:
    """`" (did you mean 'pre baseline'?)"` for a bare word that names no run under `root` but
    is close to a run's id or `train.name` there; "" otherwise."""
    from normlab.train.rundir import RunFolderError, find_run_folders, read_config_data

    path = Path(given)
    if path.exists() or len(path.parts) != 1 or not Path(root).is_dir():
        return ""
    runs, _ = find_run_folders(Path(root))
    names = [r.name for r in runs]
    for r in runs:
        try:
            train = read_config_data(r).get("train")
        except RunFolderError:
            continue
        if isinstance(train, dict) and isinstance(train.get("name"), str):
            names.append(train["name"])
    return did_you_mean(str(given), list(dict.fromkeys(names)))


def check_run_found(given: Path, label: str = "") -> None:
    """`fail` when `given` (a run folder, or under ./runs a run's id, a unique prefix of it or
    its `train.name`) names no run and a run's id or name is close to it, with that one as the
    "did you mean"; otherwise the command goes on (and says itself what else is wrong)."""
    from normlab.train.rundir import RunFolderError, find_run

    try:
        if find_run(given).exists():
            return
    except RunFolderError:  # several runs match: the command names them
        return
    hint = run_name_hint(given)
    if hint:
        fail(f"{label}{given}: no such run folder{hint}; `normlab runs` lists the runs")
