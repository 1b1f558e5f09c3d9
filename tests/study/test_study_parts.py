"""The study in parts (`normlab.study.parts`): the part table, a part run alone, the parts run
in turn into one folder or in separate folders and merged, against the study run in one go."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from typer.testing import CliRunner

import normlab.study.parts as parts
from normlab.cli import app
from normlab.config import ConfigError
from normlab.study.claims import ALL_CLAIMS, REGISTRY
from normlab.study.parts import (
    PARTS,
    SHARED,
    STUDY_PARTS,
    MergeError,
    merge_parts,
    part_of,
    study_part,
)
from normlab.study.runner import run_study

BASE_GRIDS = {("pre", True), ("post", True)}  # every part trains these in its own folder


def decided(study: dict) -> str:
    """The claims as text without their times (NaN never equals itself; its text does)."""
    return json.dumps([{k: v for k, v in c.items() if k != "elapsed_s"}
                       for c in study["claims"]], sort_keys=True)


def read(folder) -> dict:
    return json.loads((folder / "study.json").read_text())


# -- the table ----------------------------------------------------------------------------------

def test_every_claim_is_in_exactly_one_part():
    counts = Counter(c for p in STUDY_PARTS for c in p.claims)
    assert sorted(counts, key=ALL_CLAIMS.index) == list(ALL_CLAIMS)
    assert set(counts.values()) == {1}
    for p in STUDY_PARTS:
        assert list(p.claims) == sorted(p.claims, key=ALL_CLAIMS.index), p.name
        assert p.description and p.name == p.name.lower()
    assert part_of("C7").name == "warmup"


def test_claims_that_share_a_measurement_share_a_part():
    groups = dict(SHARED)
    # the grids beyond the base ones, from the claims' specs
    for grid in {g for c in REGISTRY.values() for g in c.trains} - BASE_GRIDS:
        groups[f"grid {grid}"] = tuple(c.id for c in REGISTRY.values() if grid in c.trains)
    for ladder in {c.ladder for c in REGISTRY.values() if c.ladder == "xiong"}:
        groups[f"ladder {ladder}"] = tuple(c.id for c in REGISTRY.values() if c.ladder == ladder)
    assert groups["grid ('post', False)"] == ("C6a", "C6b", "C7")
    for what, claims in groups.items():
        assert len({part_of(c).name for c in claims}) == 1, what


def test_an_unknown_part_and_a_part_with_claims_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"did you mean 'pairs'.*the parts: pairs, warmup"):
        study_part("pair")
    r = CliRunner().invoke(app, ["study", "--profile", "tiny", "--part", "khops", "--out",
                                 str(tmp_path / "s")])
    assert r.exit_code == 2 and "did you mean 'khop'" in " ".join(r.output.split())
    assert not (tmp_path / "s" / "study.json").exists()
    r = CliRunner().invoke(app, ["study", "--profile", "tiny", "--part", "khop", "--claims",
                                 "C14", "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and "--part khop with --claims" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["study", "--merge", str(tmp_path), "--part", "khop"])
    assert r.exit_code == 2 and "--merge with --part" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["study", "--list-parts"])
    assert r.exit_code == 0 and all(p in r.output for p in PARTS)


# -- running parts ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def in_turn(tmp_path_factory):
    """Every part run in turn into one folder."""
    out = tmp_path_factory.mktemp("parts-in-turn")
    for p in STUDY_PARTS:
        run_study(out, "tiny", part=p.name, log=lambda m: None)
    return out


def test_parts_run_in_turn_into_one_folder_decide_as_the_whole_study(in_turn, tiny_study_dir):
    study = read(in_turn)
    assert [c["id"] for c in study["claims"]] == list(ALL_CLAIMS)
    assert decided(study) == decided(read(tiny_study_dir))
    assert [p["study_part"] for p in study["parts"]] == list(PARTS)


def test_each_part_exports_a_few_small_files(in_turn):
    for p in STUDY_PARTS:
        export = in_turn / "parts" / p.name
        files = [f for f in export.rglob("*") if f.is_file()]
        assert all(f.stat().st_size <= parts.MAX_FILE_BYTES for f in files)
        names = {f.relative_to(export).parts[0] for f in files}
        assert names <= {"study.json", "runs-1.jsonl", "figures"}, names
        part = read(export)
        assert [c["id"] for c in part["claims"]] == list(p.claims)
        assert part["study_part"] == p.name
        assert [i["study_part"] for i in part["parts"]] == [p.name]
        carried = [json.loads(line)["run_id"]
                   for line in (export / "runs-1.jsonl").read_text().splitlines()]
        assert carried == part["runs"]
        if p.name in ("admin",):  # a ladder at init: no run read
            assert carried == []
        if p.name in ("warmup", "khop"):
            assert carried and all((in_turn / "runs" / i).is_dir() for i in carried)
    warmup = read(in_turn / "parts" / "warmup")["runs"]
    khop = read(in_turn / "parts" / "khop")["runs"]
    assert not set(warmup) & set(khop)  # each carries the runs it read, not the folder's


def test_the_merged_exports_of_one_folder_are_the_whole_study(in_turn, tiny_study_dir,
                                                              tmp_path):
    from normlab.report.html import render

    out = tmp_path / "merged"
    merged = merge_parts(out, [in_turn], log=lambda m: None)
    assert decided(merged) == decided(read(tiny_study_dir)) == decided(read(out))
    assert merged["parts_not_merged"] == []
    assert [m["study_part"] for m in merged["merged_from"]] == sorted(PARTS)  # folder order
    for c in merged["claims"]:
        assert all((out / f).is_file() for f in c["figures"]), c["id"]
    run = next((out / "runs").iterdir())
    assert sorted(f.name for f in run.iterdir()) == sorted(parts.RUN_FILES)
    assert (run / "metrics.jsonl").read_text() == (in_turn / "runs" / run.name /
                                                   "metrics.jsonl").read_text()
    page = render(out).read_text()
    assert "C14" in page and run.name in page
    # merged again: the same; a study continued in a merge is refused
    assert decided(merge_parts(out, [in_turn], log=lambda m: None)) == decided(merged)
    with pytest.raises(ConfigError, match="a merge of the study's parts"):
        run_study(out, "tiny", part="admin", log=lambda m: None)


def test_parts_in_separate_folders_merge_into_their_claims(tiny_study_dir, tmp_path):
    whole = {c["id"]: c for c in json.loads(decided(read(tiny_study_dir)))}
    for name in ("admin", "khop"):
        run_study(tmp_path / name, "tiny", part=name, log=lambda m: None)
    out = tmp_path / "merged"
    r = CliRunner().invoke(app, ["study", "--merge", str(tmp_path / "admin" / "parts" / "admin"),
                                 "--merge", str(tmp_path / "khop"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    merged = read(out)
    got = {c["id"]: c for c in json.loads(decided(merged))}
    assert got["C8"] == whole["C8"] and got["C14"] == whole["C14"]
    assert {c["id"] for c in merged["claims"] if c["verdict"] == "not run"} >= set(
        PARTS["warmup"].claims)
    assert "Part warmup was not merged" in got["C7"]["note"]
    assert merged["parts_not_merged"] == ["pairs", "warmup", "post-ends-better", "transfer"]
    assert (out / "report.html").is_file()
    assert "not merged, so their claims are not run: pairs" in " ".join(r.output.split())


def test_a_claim_decided_differently_by_two_parts_is_refused(in_turn, tmp_path):
    other = tmp_path / "elsewhere" / "khop"
    shutil.copytree(in_turn / "parts" / "khop", other)
    study = read(other)
    study["claims"][0]["verdict"] = "supported" if study["claims"][0]["verdict"] != \
        "supported" else "not supported"
    (other / "study.json").write_text(json.dumps(study))
    out = tmp_path / "merged"
    with pytest.raises(MergeError, match=r"C14 was decided differently by part khop .* and by "
                                         r"part khop \(.*elsewhere"):
        merge_parts(out, [in_turn / "parts" / "khop", other], log=lambda m: None)
    assert not out.exists()  # nothing written
    # the same part twice, decided alike: merged once
    shutil.copytree(in_turn / "parts" / "khop", tmp_path / "again", dirs_exist_ok=True)
    merged = merge_parts(out, [in_turn / "parts" / "khop", tmp_path / "again"],
                         log=lambda m: None)
    assert [c["id"] for c in merged["claims"]] == list(ALL_CLAIMS)
    r = CliRunner().invoke(app, ["study", "--merge", str(tmp_path / "nothing"), "--out",
                                 str(tmp_path / "m2")])
    assert r.exit_code == 2 and "no part's export there" in " ".join(r.output.split())


def test_a_merge_never_overwrites_a_study_run_there(in_turn, tiny_study_dir, tmp_path):
    out = tmp_path / "study"
    shutil.copyfile(tiny_study_dir / "study.json", out.parent / "keep.json")
    out.mkdir()
    shutil.copyfile(tiny_study_dir / "study.json", out / "study.json")
    with pytest.raises(MergeError, match="not a merge of parts"):
        merge_parts(out, [in_turn], log=lambda m: None)
    assert (out / "study.json").read_text() == (tmp_path / "keep.json").read_text()


def test_runs_past_the_file_limit_go_into_further_files(in_turn, monkeypatch, tmp_path):
    export = in_turn / "parts" / "warmup"
    lines = (export / "runs-1.jsonl").read_text().splitlines(keepends=True)
    limit = max(len(line.encode()) for line in lines) + 10
    monkeypatch.setattr(parts, "MAX_FILE_BYTES", limit)
    folder = tmp_path / "split"
    shutil.copytree(export, folder)
    (folder / "runs-1.jsonl").unlink()
    parts._write_runs(folder, lines)
    files = parts.runs_files(folder)
    assert len(files) > 1 and all(f.stat().st_size <= limit for f in files)
    assert "".join(f.read_text() for f in files) == "".join(lines)
    merged = merge_parts(tmp_path / "merged", [folder], log=lambda m: None)
    assert len(list((tmp_path / "merged" / "runs").iterdir())) == len(lines)
    assert merged["claims"][ALL_CLAIMS.index("C7")]["verdict"] == read(export)["claims"][2][
        "verdict"]
    # a file of the export over the limit is said, never dropped
    warnings = parts.write_export(in_turn, PARTS["warmup"], read(in_turn),
                                  read(export)["runs"])
    assert warnings and all("over the" in w for w in warnings)
    monkeypatch.undo()
    assert parts.write_export(in_turn, PARTS["warmup"], read(in_turn), read(export)["runs"]) == []


def test_the_docs_name_every_part_and_its_claims():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "study.md").read_text()
    section = doc.split("\n## Parts\n", 1)[1]
    for p in STUDY_PARTS:
        assert f"| `{p.name}` | {', '.join(p.claims)} |" in section, p.name


def test_a_part_stopped_at_the_time_limit_says_how_to_continue_it(tmp_path):
    out = tmp_path / "s"
    r = CliRunner().invoke(app, ["study", "--profile", "tiny", "--part", "khop", "--out",
                                 str(out), "--device", "cpu", "--time-limit", "0.0005",
                                 "--no-report"])
    assert r.exit_code == 75, r.output
    assert (f"continue with the same command: normlab study --profile tiny --part khop --out "
            f"{out} --device cpu --time-limit 0.0005 --no-report") in " ".join(r.output.split())
    assert not (out / "parts" / "khop").exists()  # exported once the part is done
