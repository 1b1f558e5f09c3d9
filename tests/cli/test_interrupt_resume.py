"""Long commands that are interrupted say how to resume, and a re-run reuses what finished:
`normlab study` (Ctrl-C prints the command that resumes) and `normlab probe-hf` (a model whose
probe is already written with the same settings is reused, not probed again)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from normlab.cli import app, load_commands
from normlab.cli.interop import finished

load_commands()


def test_an_interrupted_study_says_what_it_kept_and_the_command_that_resumes(tmp_path,
                                                                             monkeypatch):
    import normlab.study.runner as runner

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_study", interrupted)
    out = tmp_path / "st"
    result = CliRunner().invoke(app, ["study", "--profile", "tiny", "--claims", "C6",
                                      "--out", str(out)])
    assert result.exit_code == 130
    text = " ".join(result.output.split())
    assert f"resume with: normlab study --profile tiny --claims C6 --out {out}" in text
    assert "study.json" in text


def _written(out, name, **data):
    res = {"checkpoint": {"name": name}, "model": {"n_blocks": 3},
           "data": {"text": "shakespeare (validation works)", "n_batches": 2,
                    "batch_size": 4, "seq_len": 128, "seed": 0} | data,
           "drop": {"drop_blocks": [0, 1, 2]}}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(res))
    return res


DATA = {"text": "shakespeare (validation works)", "n_batches": 2, "batch_size": 4,
        "seq_len": 128, "seed": 0}


def test_probe_hf_reuses_a_model_probed_with_the_same_settings(tmp_path):
    res = _written(tmp_path, "m")
    assert finished(tmp_path, "m", DATA, True, None) == res
    assert finished(tmp_path, "m", DATA, True, [0, 1, 2]) == res


def test_probe_hf_probes_again_when_a_setting_differs(tmp_path):
    _written(tmp_path, "m")
    assert finished(tmp_path, "m", DATA | {"seq_len": 64}, True, None) is None
    assert finished(tmp_path, "m", DATA, True, [0]) is None       # another drop subset
    assert finished(tmp_path, "m", DATA, False, None) is None      # written with a drop scan
    assert finished(tmp_path, "other", DATA, True, None) is None   # nothing written
    (tmp_path / "bad.json").write_text("{cut")
    assert finished(tmp_path, "bad", DATA, True, None) is None


def test_probe_hf_does_not_reuse_a_partial_drop_scan_for_a_full_one(tmp_path):
    _written(tmp_path, "m")
    path = tmp_path / "m.json"
    res = json.loads(path.read_text())
    res["drop"]["drop_blocks"] = [0, 2]
    path.write_text(json.dumps(res))
    assert finished(tmp_path, "m", DATA, True, None) is None
    assert finished(tmp_path, "m", DATA, True, [0, 2]) is not None
