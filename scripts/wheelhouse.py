#!/usr/bin/env python
"""Build a wheelhouse: every wheel normlab needs on a machine that reaches no package index,
for that machine's Python version and platform (docs/install.md).

Run it where the index is reachable. It builds normlab's own wheel (`pip wheel --no-deps`),
resolves normlab and the chosen extras for the target (`pip install --dry-run --report`, with
`--only-binary=:all: --python-version --platform`, honouring a constraints file), then downloads
exactly the files that resolution chose (`pip download --no-deps`, by URL and hash). Copy the
folder to the target and install from it alone:

    python -m pip install --no-index --find-links wheelhouse 'normlab[hf]'

    python scripts/wheelhouse.py --out wh                  # this machine's Python and platform
    python scripts/wheelhouse.py --out wh --python-version 3.11 \\
        --platform manylinux_2_28_x86_64 --extras hf,data  # a GPU machine's
    python scripts/wheelhouse.py --out wh --without torch  # the site provides torch

`--without NAME` leaves out that package and whatever only it needs (torch's CUDA libraries,
sympy, ...): resolved for the target as usual, then walked from normlab without entering NAME.
A manylinux tag stands for that glibc and every older manylinux tag (what pip on the target
accepts). pip takes its other settings (index, extra index, proxy) from its own configuration
and environment, as usual: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu126, say, for
one CUDA build of torch.

pip evaluates environment markers (`; python_version < "3.12"`, `; sys_platform == "linux"`) for
the Python that runs it, not for the target: run this script with a Python of the target's
version on the target's operating system (it warns otherwise).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a Python without `packaging` still has pip's copy of it
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "normlab"
INSTALL_NOTE = "INSTALL.txt"  # written into the wheelhouse: what it is for and how to install it

# The glibc of each legacy manylinux tag (PEP 600), and the architectures it was defined for.
LEGACY_MANYLINUX = {
    "manylinux2014": (17, {"x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x"}),
    "manylinux2010": (12, {"x86_64", "i686"}),
    "manylinux1": (5, {"x86_64", "i686"}),
}
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(.+)")
_MUSLLINUX = re.compile(r"musllinux_(\d+)_(\d+)_(.+)")
_LEGACY = re.compile(r"(manylinux2014|manylinux2010|manylinux1)_(.+)")


class WheelhouseError(Exception):
    """A problem with the arguments or the project, said in one line (exit 2)."""


# -- the target ---------------------------------------------------------------------------------

def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def this_platform() -> str:
    """This machine's most specific manylinux (or musllinux) tag, as pip here accepts it."""
    if sys.platform != "linux":
        raise WheelhouseError("no default platform off Linux: name the target's with --platform "
                              "(manylinux_2_28_x86_64, say)")
    machine = platform.machine()
    libc, version = platform.libc_ver()
    if libc == "glibc" and version:
        major, minor = version.split(".")[:2]
        return f"manylinux_{major}_{minor}_{machine}"
    raise WheelhouseError("this machine's C library is not glibc: name the target's platform "
                          "with --platform (musllinux_1_2_x86_64, say)")


def expand_platform(tag: str) -> list[str]:
    """`tag` and every tag that pip on a machine of that tag also accepts, newest first: a
    manylinux_2_N tag brings every manylinux_2_M (M <= N) and the legacy manylinux2014/2010/1
    aliases that fall within it; musllinux_1_N likewise. Other tags are taken as given."""
    if m := _LEGACY.fullmatch(tag):
        glibc, _ = LEGACY_MANYLINUX[m.group(1)]
        return expand_platform(f"manylinux_2_{glibc}_{m.group(2)}")
    if m := _MANYLINUX.fullmatch(tag):
        major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
        if major != 2:
            return [tag]
        tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
        for legacy, (glibc, arches) in LEGACY_MANYLINUX.items():
            if glibc <= minor and arch in arches:
                tags.append(f"{legacy}_{arch}")
        return tags
    if m := _MUSLLINUX.fullmatch(tag):
        major, minor, arch = int(m.group(1)), int(m.group(2)), m.group(3)
        return [f"musllinux_{major}_{n}_{arch}" for n in range(minor, -1, -1)]
    return [tag]


def platform_tags(tags: Iterable[str]) -> list[str]:
    """The expanded tags of each of `tags`, each once, in order."""
    return list(dict.fromkeys(t for tag in tags for t in expand_platform(tag)))


def python_version(text: str) -> str:
    """'3.11' or '311' as 'X.Y'."""
    m = re.fullmatch(r"(\d)\.?(\d+)", text.strip())
    if not m:
        raise WheelhouseError(f"--python-version {text!r}: give it as 3.11 (or 311)")
    return f"{m.group(1)}.{m.group(2)}"


def split_names(values: Sequence[str] | None) -> list[str]:
    """`--extras hf,data --extras ray` as ['hf', 'data', 'ray']."""
    return [n.strip() for v in values or () for n in v.split(",") if n.strip()]


def target_args(python: str, platforms: Sequence[str], implementation: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", implementation]
    for tag in platforms:
        args += ["--platform", tag]
    return args


def host_warnings(python: str, platforms: Sequence[str]) -> list[str]:
    """Where pip's marker evaluation (for the Python that runs it) may differ from the
    target's."""
    notes = []
    if python != this_python():
        notes.append(f"target Python {python}, this one {this_python()}: pip evaluates environment "
                     "markers for this one; run the script with Python "
                     f"{python} for an exact wheelhouse")
    linux = any(t.startswith(("manylinux", "musllinux", "linux")) for t in platforms)
    if linux and sys.platform != "linux":
        notes.append("a Linux target built elsewhere: pip evaluates platform markers for this "
                     "machine; run the script on Linux for an exact wheelhouse")
    machine = platform.machine()
    if platforms and not any(t.endswith(machine) for t in platforms):
        notes.append(f"the target's architecture differs from this machine's ({machine}): pip "
                     "evaluates platform_machine markers for this one")
    return notes


# -- what to download ---------------------------------------------------------------------------

def kept(report: dict, without: Iterable[str]) -> list[dict]:
    """The items of pip's installation report `report` (one per distribution) that normlab
    needs when the packages named in `without` are provided by the target: the resolution walked
    from what was requested (with its extras), along each package's requirements whose markers
    hold in the report's environment, never into a package of `without`."""
    excluded = {canonicalize_name(n) for n in without}
    env = dict(report.get("environment") or {})
    items = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    active: dict[str, set[str]] = {}  # name -> the extras it is needed with
    queue = [(name, frozenset(i.get("requested_extras") or ()))
             for name, i in items.items() if i.get("requested")]
    while queue:
        name, extras = queue.pop()
        if name in excluded or name not in items:
            continue
        wanted = {canonicalize_name(e) for e in extras}
        seen = active.get(name)
        if seen is not None and wanted <= seen:
            continue
        active[name] = (seen or set()) | wanted
        for text in items[name]["metadata"].get("requires_dist") or ():
            req = Requirement(text)
            if req.marker is None or any(_holds(req.marker, env, e)
                                         for e in ("", *sorted(active[name]))):
                queue.append((canonicalize_name(req.name), frozenset(req.extras)))
    return [items[n] for n in items if n in active]


def _holds(marker: Marker, env: dict, extra: str) -> bool:
    return marker.evaluate({**env, "extra": extra})


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """The name, version and extras of a built wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    fields = [line.split(":", 1) for line in text.split("\n\n", 1)[0].splitlines() if ":" in line]
    get = {k: v.strip() for k, v in fields}
    extras = [v.strip() for k, v in fields if k == "Provides-Extra"]
    return get["Name"], get["Version"], extras


def pinned(item: dict) -> str:
    """A report item as a requirement for exactly the file pip chose (`name @ URL#sha256=...`),
    so that the download looks up no index page again; `name==version` when it has no URL."""
    meta, info = item["metadata"], item.get("download_info") or {}
    url = info.get("url")
    if not url or "archive_info" not in info:
        return f"{meta['name']}=={meta['version']}"
    hashes = info["archive_info"].get("hashes") or {}
    fragment = f"#sha256={hashes['sha256']}" if "sha256" in hashes else ""
    return f"{meta['name']} @ {url.split('#', 1)[0]}{fragment}"


def requirement_text(extras: Sequence[str]) -> str:
    return f"{PROJECT}[{','.join(extras)}]" if extras else PROJECT


def install_command(out: str, extras: Sequence[str]) -> str:
    return ("python -m pip install --no-index --find-links "
            f"{shlex.quote(out)} {shlex.quote(requirement_text(extras))}")


# -- building -----------------------------------------------------------------------------------

def run(cmd: list[str], *, quiet: bool) -> None:
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else None)
    if done.returncode:
        raise SystemExit(f"wheelhouse: the command above failed (exit {done.returncode})")


def copy_sources(project: Path, dest: Path, skip: Path) -> Path:
    """A copy of the project's sources to build from, so that the build writes nothing into the
    project and takes nothing stale from it (setuptools' build/ folder): in a git checkout, the
    files that git tracks or would track (untracked new modules included); elsewhere the folder
    without its usual by-products. Wheels and the folder `skip` (the wheelhouse, when it lies
    in the project) are left behind."""
    try:
        listed = subprocess.run(["git", "-C", str(project), "ls-files", "-z", "-co",
                                 "--exclude-standard"], capture_output=True)
    except FileNotFoundError:  # no git
        listed = None
    if listed is not None and listed.returncode == 0 and listed.stdout:
        for rel in filter(None, listed.stdout.decode().split("\0")):
            src = project / rel
            if src.suffix == ".whl" or src.resolve().is_relative_to(skip) or not src.is_file():
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
        return dest
    skipped = shutil.ignore_patterns(
        ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".ruff_cache", "runs", "demo", "mutants", "*.whl")
    shutil.copytree(project, dest, dirs_exist_ok=True, ignore=lambda folder, names: {
        *skipped(folder, names), *(n for n in names if (Path(folder) / n).resolve() == skip)})
    return dest


def build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    stale = sorted(out.glob("*.whl")) if out.is_dir() else []
    if stale and not args.dry_run and not args.clean:
        raise WheelhouseError(f"{out} already holds wheels: pass --clean to remove them first "
                              "(a stale wheel would be installed on the target too)")
    python = python_version(args.python_version) if args.python_version else this_python()
    platforms = platform_tags(args.platform or [this_platform()])
    extras = split_names(args.extras)
    without = split_names(args.without)
    constraints = None if args.no_constraints else Path(args.constraints)
    if constraints is not None and not constraints.is_file():
        raise WheelhouseError(f"no constraints file {constraints} (--no-constraints for none)")
    for note in host_warnings(python, platforms):
        print(f"wheelhouse: warning: {note}", file=sys.stderr)
    pip = [sys.executable, "-m", "pip"]
    quiet = ["-q"] if args.quiet else []
    target = target_args(python, platforms, args.implementation)

    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        tmp = Path(tmp)
        # 1. normlab's own wheel, built from a clean copy of its sources
        src = copy_sources(Path(args.project).resolve(), tmp / "src", skip=out.resolve())
        run([*pip, "wheel", *quiet, "--no-deps", "--wheel-dir", str(tmp / "own"), str(src)],
            quiet=args.quiet)
        wheel = next((tmp / "own").glob("*.whl"))
        name, version, provided = wheel_metadata(wheel)
        unknown = [e for e in extras if canonicalize_name(e) not in
                   {canonicalize_name(p) for p in provided}]
        if unknown:
            raise WheelhouseError(f"{name} {version} has no extra {', '.join(unknown)} "
                                  f"(it has: {', '.join(provided)})")

        # 2. the resolution for the target: pip reads the packages' metadata, not their files
        report_path = tmp / "report.json"
        root = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
        run([*pip, "install", *quiet, "--dry-run", "--ignore-installed", "--report",
             str(report_path), "--target", str(tmp / "target"), *target,
             *(["--constraint", str(constraints)] if constraints else []), root],
            quiet=args.quiet)
        report = json.loads(report_path.read_text())
        resolved = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
        for n in without:
            if canonicalize_name(n) not in resolved:
                print(f"wheelhouse: warning: --without {n}: not among what normlab needs here",
                      file=sys.stderr)

        # 3. exactly the files chosen, less what the target provides
        pins = [i for i in kept(report, without)
                if canonicalize_name(i["metadata"]["name"]) != canonicalize_name(name)]
        left_out = sorted(set(resolved) - {canonicalize_name(i["metadata"]["name"]) for i in pins}
                          - {canonicalize_name(name)})
        if args.dry_run:
            print("\n".join(f"{i['metadata']['name']}=={i['metadata']['version']}"
                            for i in pins))
            if left_out:
                print("# left out: " + " ".join(left_out))
            return 0
        for path in [*stale, out / INSTALL_NOTE]:  # --clean: the wheels only, nothing else
            path.unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, out / wheel.name)
        if pins:
            pins_path = tmp / "pins.txt"
            pins_path.write_text("".join(pinned(i) + "\n" for i in pins))
            run([*pip, "download", *quiet, "--no-deps", "--dest", str(out), *target,
                 "-r", str(pins_path)], quiet=args.quiet)

    wheels = sorted(out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    with_extras = f" [{','.join(extras)}]" if extras else ""
    lines = [f"A wheelhouse of {name} {version}{with_extras} for Python {python} "
             f"({args.implementation}) on {', '.join(args.platform or platforms[:1])}: "
             f"{len(wheels)} wheels, {size / 1e6:.0f} MB.",
             "", f"On the target machine, with this folder copied there as {args.out}:",
             "", "    " + install_command(args.out, extras), ""]
    if left_out:
        lines += [f"Left out, as the target provides them: {', '.join(left_out)}. They must be "
                  "installed where that python sees them (a venv made with "
                  "--system-site-packages, or PYTHONPATH) before normlab is.", ""]
    torch_cpu = [w.name for w in wheels if w.name.startswith("torch-") and "+cpu" in w.name]
    if torch_cpu:
        lines += [f"Note: {torch_cpu[0]} is a CPU-only build of torch; a GPU machine needs a CUDA "
                  "build (pip's index has one; or --without torch where the site provides it).",
                  ""]
    text = "\n".join(lines)
    (out / INSTALL_NOTE).write_text(text)
    print(text)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wheelhouse.py", description=__doc__.split("\n\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Then, on the target: python -m pip install --no-index --find-links DIR "
               "'normlab[EXTRAS]' (docs/install.md).")
    p.add_argument("--out", required=True, help="the wheelhouse folder to write")
    p.add_argument("--python-version", help="the target's Python, as 3.11 (default: this one's)")
    p.add_argument("--platform", action="append", metavar="TAG",
                   help="a platform tag of the target, as manylinux_2_28_x86_64 (repeatable; a "
                        "manylinux tag also admits older ones; default: this machine's)")
    p.add_argument("--implementation", default="cp", help="the Python implementation (cp)")
    p.add_argument("--extras", action="append", metavar="NAMES",
                   help="normlab's extras to include, comma-separated (hf,data; repeatable)")
    p.add_argument("--without", action="append", metavar="NAMES",
                   help="packages the target provides, comma-separated (torch): left out with "
                        "what only they need")
    p.add_argument("--constraints", default=str(ROOT / "constraints.txt"),
                   help="a pip constraints file (default: the project's constraints.txt)")
    p.add_argument("--no-constraints", action="store_true",
                   help="resolve without a constraints file")
    p.add_argument("--project", default=str(ROOT), help="the project to build (this one)")
    p.add_argument("--clean", action="store_true",
                   help="remove the wheels already in --out first (nothing else there)")
    p.add_argument("--dry-run", action="store_true",
                   help="resolve only: print the versions the wheelhouse would hold (and what "
                        "--without leaves out); write and download nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="only the summary, and pip's errors")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return build(args)
    except WheelhouseError as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
