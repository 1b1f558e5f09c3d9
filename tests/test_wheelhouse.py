"""scripts/wheelhouse.py: a wheelhouse built for this machine's Python and platform installs
normlab, torch included, into a fresh venv with `pip install --no-index` and nothing else (no
pip configuration, no index, no network), and `normlab --help` runs from it. Also what
`--without torch` leaves out, resolved for real (`--dry-run`) and on a planted resolution, and
the platform tags a manylinux tag stands for (docs/install.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import wheelhouse

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "wheelhouse.py"
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# a connection anywhere goes to a closed port on this machine, and fails at once
NOWHERE = "http://127.0.0.1:9"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels_in(folder: Path) -> dict[str, str]:
    """{name: version} of the wheels in `folder`, from their file names."""
    return {canonical(w.name.split("-")[0]): w.name.split("-")[1] for w in folder.glob("*.whl")}


def offline_env() -> dict[str, str]:
    """This environment without pip's settings (this machine's find-links, extra indexes,
    constraints), without PYTHONPATH, and with every proxy pointing at a closed local port: pip
    sees no package but the wheelhouse's, and could reach no index if it tried."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
           and not k.lower().endswith("_proxy")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                  "HTTP_PROXY": NOWHERE, "HTTPS_PROXY": NOWHERE, "ALL_PROXY": NOWHERE,
                  "http_proxy": NOWHERE, "https_proxy": NOWHERE, "all_proxy": NOWHERE}


def ok(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, (f"{shlex.join(cmd)} exited {done.returncode}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def installed(python: Path, env: dict[str, str]) -> dict[str, str]:
    out = ok([str(python), "-m", "pip", "list", "--format", "json"], env=env).stdout
    return {canonical(d["name"]): d["version"] for d in json.loads(out)}


@pytest.mark.xdist_group("wheelhouse")
def test_a_fresh_venv_installs_normlab_from_the_wheelhouse_alone(tmp_path):
    # where the index is reachable: the wheelhouse for this machine's Python and platform
    built = ok([sys.executable, str(SCRIPT), "--out", "wheelhouse", "-q",
                "--python-version", THIS_PYTHON, "--platform", wheelhouse.this_platform()],
               cwd=tmp_path)
    command = next(line.strip() for line in built.stdout.splitlines()
                   if line.strip().startswith("python -m pip install"))
    assert command == "python -m pip install --no-index --find-links wheelhouse normlab"
    assert (tmp_path / "wheelhouse" / "INSTALL.txt").read_text().strip() == built.stdout.strip()
    wheels = wheels_in(tmp_path / "wheelhouse")
    assert {"normlab", "torch", "numpy", "pydantic", "typer"} <= set(wheels)

    # the target: a fresh venv, offline; the printed command, as printed, with its own pip
    env = offline_env()
    venv = tmp_path / "venv"
    ok([sys.executable, "-m", "venv", str(venv)], env=env)
    python = venv / "bin" / "python"
    before = installed(python, env)  # pip (and setuptools, on older Pythons) from the venv
    args = shlex.split(command)
    ok([str(python), *args[1:], "-q", "--no-cache-dir", "--no-compile"], env=env, cwd=tmp_path)

    # from an empty folder, so that nothing there can be imported instead
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    helped = ok([str(venv / "bin" / "normlab"), "--help"], env=env, cwd=elsewhere).stdout
    assert "Usage" in helped and "train" in helped
    probe = ("import json, normlab, torch; print(json.dumps({'normlab': normlab.__file__, "
             "'torch': torch.__file__, 'version': torch.__version__, "
             "'dot': float(torch.ones(3) @ torch.ones(3))}))")
    seen = json.loads(ok([str(python), "-c", probe], env=env, cwd=elsewhere).stdout)
    for module in ("normlab", "torch"):
        assert Path(seen[module]).resolve().is_relative_to(venv.resolve()), seen
    assert seen["version"] == wheels["torch"] and seen["dot"] == 3.0
    ok([str(python), "-m", "pip", "check"], env=env)

    # every package installed came from the wheelhouse, at its version, and the wheelhouse
    # holds nothing that was not needed (bar a newer setuptools than the venv's own)
    after = installed(python, env)
    new = {n: v for n, v in after.items() if before.get(n) != v}
    assert {n: wheels.get(n) for n in new} == new
    assert set(wheels) <= set(after)


def test_without_torch_leaves_out_torch_and_what_only_it_needs(tmp_path):
    done = ok([sys.executable, str(SCRIPT), "--out", str(tmp_path / "wh"), "-q", "--dry-run",
               "--without", "torch"])
    lines = done.stdout.splitlines()
    kept = {canonical(line.split("==")[0]) for line in lines if "==" in line}
    left_out = set(next(line for line in lines if line.startswith("# left out:")).split()[3:])
    assert {"torch", "sympy", "mpmath", "networkx"} <= left_out
    assert not left_out & kept
    # torch's dependencies that normlab needs by another way stay: jinja2 (normlab's own),
    # typing-extensions (pydantic's)
    assert {"jinja2", "typing-extensions", "numpy", "pydantic"} <= kept
    assert not (tmp_path / "wh").exists()  # a dry run writes nothing


def item(name, version, requires=(), *, requested=False, extras=None):
    entry = {"metadata": {"name": name, "version": version, "requires_dist": list(requires)},
             "download_info": {"url": f"https://files.example/{name}-{version}-py3-none-any.whl",
                               "archive_info": {"hashes": {"sha256": "ab" * 32}}},
             "requested": requested}
    if extras:
        entry["requested_extras"] = extras
    return entry


# a resolution shaped like normlab's: torch brings sympy (and so mpmath) and filelock, and shares
# jinja2 with normlab; markers and extras decide the rest
PLANTED = {
    "environment": {"python_version": "3.11", "python_full_version": "3.11.7",
                    "sys_platform": "linux", "platform_system": "Linux",
                    "platform_machine": "x86_64", "implementation_name": "cpython",
                    "platform_python_implementation": "CPython", "os_name": "posix"},
    "install": [
        item("normlab", "0.1.0", ["torch<3,>=2.4", "Jinja2>=3.1", "typer[all]>=0.12",
                                  "tomli; python_version < '3.11'",
                                  "accelerate>=1; extra == 'hf'",
                                  "pyarrow>=14; extra == 'parquet'"],
             requested=True, extras=["hf"]),
        item("torch", "2.13.0+cpu", ["filelock", "sympy>=1.13.3", "jinja2",
                                     "triton==3.5; platform_system == 'Linux' and "
                                     "platform_machine == 'aarch64'"]),
        item("sympy", "1.14.0", ["mpmath<1.4,>=1.1.0"]),
        item("mpmath", "1.3.0"),
        item("filelock", "4.3.1"),
        item("triton", "3.5.0"),
        item("Jinja2", "3.1.6", ["MarkupSafe>=2.0"]),
        item("MarkupSafe", "3.0.4"),
        item("typer", "0.29.2", ["click", "shellingham; extra == 'all'"]),
        item("click", "8.5.1"),
        item("shellingham", "1.5.4"),
        item("tomli", "2.0.0"),
        item("accelerate", "1.15.0", ["torch>=2", "psutil", "rich; extra == 'rich'"]),
        item("psutil", "7.2.2"),
        item("rich", "15.0.0"),
        item("pyarrow", "26.0.1"),
    ],
}


def test_the_walk_follows_markers_and_extras_and_stops_at_what_is_left_out():
    names = lambda items: {canonical(i["metadata"]["name"]) for i in items}  # noqa: E731
    base = {"normlab", "jinja2", "markupsafe", "typer", "click", "shellingham", "accelerate",
            "psutil"}
    assert names(wheelhouse.kept(PLANTED, [])) == base | {"torch", "sympy", "mpmath", "filelock"}
    assert names(wheelhouse.kept(PLANTED, ["torch"])) == base
    assert names(wheelhouse.kept(PLANTED, ["Torch", "jinja2"])) == base - {"jinja2",
                                                                           "markupsafe"}


def test_a_pin_names_the_file_pip_chose():
    torch = PLANTED["install"][1]
    assert wheelhouse.pinned(torch) == (
        "torch @ https://files.example/torch-2.13.0+cpu-py3-none-any.whl#sha256=" + "ab" * 32)
    assert wheelhouse.pinned({"metadata": {"name": "x", "version": "1"}}) == "x==1"


def test_a_manylinux_tag_stands_for_every_older_one():
    tags = wheelhouse.expand_platform("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-4] == "manylinux_2_5_x86_64"
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert "manylinux_2_29_x86_64" not in tags
    assert wheelhouse.expand_platform("manylinux2014_aarch64")[-1] == "manylinux2014_aarch64"
    assert "manylinux1_aarch64" not in wheelhouse.expand_platform("manylinux_2_28_aarch64")
    assert wheelhouse.expand_platform("musllinux_1_2_x86_64") == [
        "musllinux_1_2_x86_64", "musllinux_1_1_x86_64", "musllinux_1_0_x86_64"]
    assert wheelhouse.expand_platform("macosx_14_0_arm64") == ["macosx_14_0_arm64"]
    assert wheelhouse.platform_tags(["manylinux_2_17_x86_64", "manylinux2014_x86_64"]) == \
        wheelhouse.expand_platform("manylinux_2_17_x86_64")


def test_the_install_command_and_bad_arguments(tmp_path, capsys):
    assert wheelhouse.install_command("wh", []) == (
        "python -m pip install --no-index --find-links wh normlab")
    assert wheelhouse.install_command("my wh", ["hf", "data"]) == (
        "python -m pip install --no-index --find-links 'my wh' 'normlab[hf,data]'")
    assert wheelhouse.python_version("311") == wheelhouse.python_version("3.11") == "3.11"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.whl").write_text("")
    assert wheelhouse.main(["--out", str(tmp_path / "full")]) == 2
    assert "already holds wheels: pass --clean" in capsys.readouterr().err
    assert wheelhouse.main(["--out", str(tmp_path / "x"), "--python-version", "three"]) == 2
    assert "--python-version 'three'" in capsys.readouterr().err
    assert wheelhouse.main(["--out", str(tmp_path / "x"), "--constraints", "nope.txt"]) == 2
    assert "no constraints file" in capsys.readouterr().err
