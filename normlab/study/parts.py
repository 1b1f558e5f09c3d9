"""The study in parts: named groups of claims, each small enough for one short allocation of a
machine (`normlab study --part NAME`), exported in a few small files, and merged into one study
on any machine (`normlab study --merge`).

A part holds the claims that share measurements beyond the pre and post grids with warmup that
every trained claim tunes (`SHARED`): run into one study folder in turn, the parts reuse each
other's runs and caches and `study.json` accumulates their claims; run into separate folders
(on separate machines), each part trains what it reads, and the merge combines their exports.

A part's export, `DIR/parts/NAME/`, is what another machine needs to merge it and render its
report, in a few files of at most `MAX_FILE_BYTES` each: `study.json` (the part's claims and
the study's settings), `runs-1.jsonl` (and `runs-2.jsonl`... where one file would be larger:
each run the part read, with its `config.yaml`, `summary.json` and `metrics.jsonl`, never its
weights) and the figures its claims drew.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab.config import ConfigError, did_you_mean
from normlab.study.claims import ALL_CLAIMS, REGISTRY
from normlab.study.devices import runs_by_device
from normlab.study.experiments import StudyFolder
from normlab.study.schema import ClaimResult
from normlab.train.logging import write_json_atomic

# The largest file an export holds: what a short allocation's machine hands back in one piece.
MAX_FILE_BYTES = 16 * 2**20
EXPORTS = "parts"  # a study folder's exports: DIR/parts/NAME/
# What an export carries of each run: enough for the report's runs table and loss curves.
RUN_FILES = ("config.yaml", "summary.json", "metrics.jsonl")
RUNS_GLOB = "runs-*.jsonl"


@dataclass(frozen=True)
class StudyPart:
    """A named group of claims run by one command; `claims` in the registry's order."""
    name: str
    description: str
    claims: tuple[str, ...]


STUDY_PARTS: tuple[StudyPart, ...] = (
    StudyPart("pairs", "matched-loss pre and post checkpoints probed (the deep models where the "
              "profile trains them), the final norm, removable blocks, and the Xiong ladder at "
              "init C1 shares with C4 and C5",
              ("C1", "C2", "C3", "C4", "C5", "C11", "C12", "C13")),
    StudyPart("warmup", "warmup at a common and at each placement's own lr, and DeepNet's "
              "update at the lr where post fails without warmup",
              ("C6a", "C6b", "C7")),
    StudyPart("admin", "Admin's output sensitivity at init (a ladder, no training)", ("C8",)),
    StudyPart("post-ends-better", "post against pre trained near convergence, each with its own "
              "and with a shared init", ("C9",)),
    StudyPart("transfer", "fine-tuning the matched pre and post checkpoints on a genre task",
              ("C10",)),
    StudyPart("khop", "pre, post and their successors on the k-hop task", ("C14",)),
)
PARTS: dict[str, StudyPart] = {p.name: p for p in STUDY_PARTS}

# What several claims read in common, besides the pre and post grids with warmup (each part
# trains those in its own folder). A part holds every claim of each group, so that a
# measurement is never made twice in separate folders.
SHARED: dict[str, tuple[str, ...]] = {
    "the Xiong ladder at init (cache/ladder_xiong_*)": ("C1", "C4", "C5"),
    "the probes of the matched-loss pair (StudyFolder.trained_probes, init_probes)":
        ("C1", "C2", "C3", "C13"),
    "the deep models (StudyFolder.deep_grid, c12_checkpoints; probe_deep profiles probe them)":
        ("C1", "C2", "C3", "C11", "C12", "C13"),
    "post without warmup at the profile's lrs (C6's grid; C7 takes its failing lr)":
        ("C6a", "C6b", "C7"),
}


def study_part(name: str) -> StudyPart:
    """The part called `name`; ConfigError naming the parts (and the closest) otherwise."""
    if name in PARTS:
        return PARTS[name]
    hint = did_you_mean(name, list(PARTS))
    raise ConfigError(f"--part: {name!r} is not a part of the study{hint}; the parts: "
                      f"{', '.join(PARTS)} (`normlab study --list-parts`)")


def part_of(claim: str) -> StudyPart:
    """The part that decides `claim`."""
    return next(p for p in STUDY_PARTS if claim in p.claims)


class PartFolder(StudyFolder):
    """A study folder that notes every run a claim reads (`train` hands out every run the
    claims see, trained or finished), so a part's export carries exactly those runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs_read: set[str] = set()

    def train(self, configs: list) -> list[dict[str, Any]]:
        self.runs_read.update(c.run_id() for c in configs)
        return super().train(configs)


class MergeError(ValueError):
    """Parts that cannot be merged; the message names the parts and what to do."""


# -- the export ---------------------------------------------------------------------------------
def export_dir(out: Path, part: str) -> Path:
    return out / EXPORTS / part


def write_export(out: Path, part: StudyPart, study: dict[str, Any], run_ids: Iterable[str]
                 ) -> list[str]:
    """Write `part`'s export below the study folder `out` (module doc) from the study's record
    `study`, and return a warning for each file over `MAX_FILE_BYTES` (none: it fits). The
    export replaces an earlier one of the part whole."""
    dest = export_dir(out, part.name)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    claims = [c for c in study["claims"] if c["id"] in part.claims]
    ids = sorted(i for i in run_ids if (out / "runs" / i / "summary.json").exists())
    own = [p for p in study.get("parts", []) if p.get("study_part") == part.name]
    header = {k: v for k, v in study.items() if k != "claims"}
    write_json_atomic(tmp / "study.json", {
        **header, "parts": own or header.get("parts", []), "study_part": part.name,
        "runs": ids, "claims": claims})
    for rel in sorted({f for c in claims for f in c.get("figures", [])}):
        if (out / rel).is_file():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / rel, tmp / rel)
    _write_runs(tmp, (_run_line(out / "runs" / i) for i in ids))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return [f"{f.relative_to(out)}: {f.stat().st_size / 2**20:.1f} MiB, over the "
            f"{MAX_FILE_BYTES // 2**20} MiB a file of a part's export may take"
            for f in sorted(dest.rglob("*")) if f.is_file() and f.stat().st_size > MAX_FILE_BYTES]


def _run_line(run_dir: Path) -> str:
    files = {n: (run_dir / n).read_text() for n in RUN_FILES if (run_dir / n).is_file()}
    return json.dumps({"run_id": run_dir.name, "files": files}) + "\n"


def _write_runs(folder: Path, lines: Iterable[str]) -> None:
    """The runs' lines in `runs-1.jsonl`, then `runs-2.jsonl`... each file ending before it
    would pass `MAX_FILE_BYTES` (a run larger than that alone has a file of its own)."""
    chunk: list[str] = []
    size, n = 0, 1
    for line in lines:
        length = len(line.encode())
        if chunk and size + length > MAX_FILE_BYTES:
            (folder / f"runs-{n}.jsonl").write_text("".join(chunk))
            chunk, size, n = [], 0, n + 1
        chunk.append(line)
        size += length
    (folder / f"runs-{n}.jsonl").write_text("".join(chunk))


def runs_files(folder: Path) -> list[Path]:
    """An export's `runs-N.jsonl` files in the order of N."""
    return sorted(folder.glob(RUNS_GLOB), key=lambda f: int(f.stem.rpartition("-")[2]))


# -- the merge ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Export:
    folder: Path
    study: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.study["study_part"])

    @property
    def where(self) -> str:
        return f"part {self.name} ({self.folder})"


def find_exports(sources: Sequence[Path]) -> list[_Export]:
    """The exports `sources` name: each a part's export (`DIR/parts/NAME`) or a study folder,
    which gives every export below its `parts/`."""
    found: list[_Export] = []
    for src in sources:
        folders = [src] if (src / "study.json").is_file() and _is_export(src) else \
            sorted(f for f in (src / EXPORTS).glob("*") if (f / "study.json").is_file()
                   and _is_export(f))
        if not folders:
            raise MergeError(
                f"{src}: no part's export there: give a part's export (DIR/{EXPORTS}/NAME, "
                f"written by `normlab study --part NAME --out DIR`) or a study folder that "
                f"holds some ({EXPORTS}/)")
        for f in folders:
            found.append(_Export(f, json.loads((f / "study.json").read_text())))
    return found


def _is_export(folder: Path) -> bool:
    try:
        data = json.loads((folder / "study.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("study_part"), str)


def _decided(claim: dict[str, Any]) -> str:
    """A claim's result as text, without the time it took: what two copies must agree on."""
    return json.dumps({k: v for k, v in claim.items() if k != "elapsed_s"}, sort_keys=True)


def merge_parts(out: Path, sources: Sequence[Path], log: Callable[[str], None] = print
                ) -> dict[str, Any]:
    """Merge the parts' exports `sources` (`find_exports`) into the study folder `out`: its
    `study.json` holds every claim in the registry's order, each from the part that decided it
    (a claim no part decided: "not run", naming its part), and `runs/` the runs the parts read
    (no weights: the folder is for reading and its report). MergeError, with nothing written,
    when `out` holds a study that is not a merge, when the parts ran different profiles or
    settings, or when two parts decided a claim differently."""
    exports = find_exports(sources)
    target = out / "study.json"
    if target.exists():
        try:
            old = json.loads(target.read_text())
        except (OSError, ValueError):
            old = None
        if not (isinstance(old, dict) and "merged_from" in old):
            raise MergeError(f"{out}: holds a study that is not a merge of parts; merge into a "
                             "new folder (its study.json stays as it is)")
    first = exports[0]
    for e in exports[1:]:
        for key in ("profile", "profile_settings"):
            if e.study.get(key) != first.study.get(key):
                raise MergeError(f"{e.where} and {first.where} ran different "
                                 f"{key.replace('_', ' ')} ({e.study.get('profile')!r}, "
                                 f"{first.study.get('profile')!r}): merge the parts of one "
                                 "study only")
    decided: dict[str, tuple[dict[str, Any], _Export]] = {}
    for e in exports:
        for c in e.study.get("claims", []):
            if c["id"] in decided and _decided(decided[c["id"]][0]) != _decided(c):
                kept, other = decided[c["id"]]
                raise MergeError(
                    f"{c['id']} was decided differently by {other.where} ({kept['verdict']}) "
                    f"and by {e.where} ({c['verdict']}); merge one of them (run the part again "
                    "in one folder to settle which)")
            decided.setdefault(c["id"], (c, e))
    profile = str(first.study.get("profile"))
    claims = [decided[cid][0] if cid in decided else not_merged(cid, profile).to_dict()
              for cid in ALL_CLAIMS]
    out.mkdir(parents=True, exist_ok=True)
    for c, e in decided.values():
        for rel in c.get("figures", []):
            if (e.folder / rel).is_file():
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(e.folder / rel, out / rel)
    differing = _merge_runs(out / "runs", exports)
    if differing:
        log(f"{len(differing)} run(s) differ between the parts that read them (the first part's "
            f"copy kept): {', '.join(differing[:5])}{' ...' if len(differing) > 5 else ''}")
    invocations = sorted((p for e in exports for p in e.study.get("parts", [])),
                         key=lambda p: str(p.get("started")))

    header = {k: v for k, v in first.study.items()
              if k not in ("claims", "study_part", "runs", "parts")}
    for key in ("device", "device_name", "cuda"):
        values = list(dict.fromkeys(str(e.study.get(key)) for e in exports))
        if len(values) > 1:
            header[key] = ", ".join(values)
    total = sum(float(p.get("elapsed_s") or 0) for p in invocations)
    merged_names = list(dict.fromkeys(e.name for e in exports))
    study = {**header, "parts": invocations, "elapsed_s": total, "elapsed_total_s": total,
             "merged_from": [{"study_part": e.name, "claims": [c["id"] for c in e.study["claims"]],
                              **{k: e.study.get(k) for k in ("created", "git_commit", "normlab",
                                                             "device", "device_name", "cuda",
                                                             "numerics")}}
                             for e in exports],
             "parts_not_merged": [p.name for p in STUDY_PARTS if p.name not in merged_names],
             "runs_by_device": runs_by_device(out / "runs"), "claims": claims}
    write_json_atomic(target, study)
    return study


def _merge_runs(runs_root: Path, exports: Sequence[_Export]) -> list[str]:
    """Every run of the exports written to `runs_root/<id>/` (its `RUN_FILES`); the ids whose
    files differ between two exports (the first export's copy is kept)."""
    seen: dict[str, dict[str, str]] = {}
    differing: list[str] = []
    for e in exports:
        for path in runs_files(e.folder):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                run = json.loads(line)
                rid, files = str(run["run_id"]), dict(run["files"])
                if rid in seen:
                    if seen[rid] != files and rid not in differing:
                        differing.append(rid)
                    continue
                seen[rid] = files
                folder = runs_root / rid
                folder.mkdir(parents=True, exist_ok=True)
                for name, text in files.items():
                    if name in RUN_FILES:
                        (folder / name).write_text(text)
    return differing


def not_merged(cid: str, profile: str) -> ClaimResult:
    """A claim whose part was not among the merged ones."""
    claim, part = REGISTRY[cid], part_of(cid)
    return ClaimResult(
        id=cid, title=claim.title, statement=claim.statement, source=claim.source, method="",
        verdict="not run", rule="",
        note=f"Part {part.name} was not merged: run it (`normlab study --profile {profile} "
             f"--part {part.name}`) and merge its export with the others.")
