"""Mutation testing of normlab's core, one module at a time, with mutmut 3.

Each module in pyproject's `[[tool.normlab-mutate.module]]` table is mutated alone, and each of
its mutants is run against that module's own fast test files (mutmut runs, per mutant, only the
tests that reached the mutated function). A module's score is

    killed / (mutants - equivalent)

where `killed` counts mutants a test failed on (or that timed out) and `equivalent` are the
mutants listed in docs/testing.md's tables (a row starting with "| `normlab...__mutmut_N`"):
changes no test can tell from the original because the behaviour is the same, and the few that
only a plain test run can kill (mutmut's trampoline adds a stack frame). A mutant that survives
or that no test reaches counts against the score.

    python scripts/mutate.py                      # every module, in the table's order
    python scripts/mutate.py normlab/study/verdict.py normlab/probe/fits.py
    python scripts/mutate.py --list               # the modules and their tests
    python scripts/mutate.py --recheck normlab/study/verdict.py  # the last run's survivors,
                                                  # against the current tests

A row may name `functions`: then only those functions' mutants run and count (the trainer's
step, not its bookkeeping).

`mutants/` keeps the last module's run only, so `--recheck` applies to the module run last.

Per module it writes build/mutation/<module>.txt (the surviving mutants' diffs) and updates
build/mutation/scores.json; at the end it prints the score per module.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "mutation"
DETECTED = {"killed", "timeout", "segfault"}


def module_table() -> list[dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["normlab-mutate"]["module"]


def equivalent_mutants() -> set[str]:
    """Mutant names listed as equivalent in docs/testing.md (first cell of a table row)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    return set(re.findall(r"^\|\s*`(normlab\.[\w.]+__mutmut_\d+)`", text, flags=re.M))


def mutant_globs(row: dict) -> list[str]:
    """mutmut's name patterns for a row's `functions` (all of the module's mutants if none)."""
    module = row["path"][: -len(".py")].replace("/", ".")
    return [f"{module}.x_{fn}*" for fn in row.get("functions", [])]


def run_one(path: str, tests: list[str], max_children: int, globs: list[str]) -> None:
    """In this process: mutate `path` only and run its tests on every mutant (mutmut's own run);
    with `globs`, only the mutants of those functions."""
    os.chdir(ROOT)
    shutil.rmtree("mutants", ignore_errors=True)
    import _pytest.nodes
    import mutmut
    import mutmut.__main__ as mm

    if not hasattr(_pytest.nodes.Node, "_nodeid"):  # mutmut 3.3 reads it; pytest 9 dropped it
        _pytest.nodes.Node._nodeid = property(lambda node: node.nodeid)
    others = [str(p) for p in Path("normlab").rglob("*.py") if str(p) != path]
    mutmut.config = mm.Config(
        # docs and scripts: tests read them (C14 reuses the k-hop feasibility search's sizes)
        also_copy=[Path("tests/"), Path("docs/"), Path("scripts/"), Path("pyproject.toml")],
        do_not_mutate=others,
        max_stack_depth=-1,
        debug=False,
        paths_to_mutate=[Path("normlab")],
        tests_dir=list(tests),
    )
    mm._run(globs, max_children)


def status_counts(path: str, globs: list[str]) -> dict[str, str]:
    """mutant name -> status, from mutmut's record of the last run on `path`."""
    import fnmatch

    import mutmut.__main__ as mm

    meta = json.loads((ROOT / "mutants" / (path + ".meta")).read_text())
    return {name: mm.status_by_exit_code.get(code, "not checked")
            for name, code in meta["exit_code_by_key"].items()
            if not globs or any(fnmatch.fnmatch(name, g) for g in globs)}


def survivor_diffs(path: str, names: list[str]) -> str:
    """The unified diff of each mutant against the original function (the mutated module is
    parsed once: mutmut's own `show` parses it per mutant)."""
    from difflib import unified_diff

    import libcst as cst
    import mutmut.__main__ as mm

    module = cst.parse_module((ROOT / "mutants" / path).read_text())
    parts = []
    for name in names:
        try:
            orig = cst.Module([mm.read_original_function(module, name)]).code.strip()
            mutant = cst.Module([mm.read_mutant_function(module, name)]).code.strip()
        except Exception as err:  # a diff is a convenience; the name is what matters
            parts.append(f"# {name}: no diff ({err})")
            continue
        diff = unified_diff(orig.split("\n"), mutant.split("\n"), fromfile=path, tofile=path,
                            lineterm="")
        parts.append(f"# {name}\n" + "\n".join(diff))
    return "\n\n".join(parts) + "\n"


def recheck(path: str, tests: list[str], env: dict[str, str], max_children: int) -> int:
    """Run the current tests on the survivors of the last `path` run (the mutants left in
    `mutants/`): each survivor under `MUTANT_UNDER_TEST`, as mutmut runs it, after the project's
    current tests are copied in. A survivor a test now fails on is recorded as killed in mutmut's
    record. Returns how many were killed. Tests added after a run are checked on exactly the
    mutants that run left, without mutating the module again."""
    meta_file = ROOT / "mutants" / (path + ".meta")
    if not meta_file.exists():
        raise SystemExit(f"error: no mutmut record for {path} in mutants/: run "
                         f"`python scripts/mutate.py {path}` first")
    for folder in ("tests", "docs"):
        shutil.copytree(ROOT / folder, ROOT / "mutants" / folder, dirs_exist_ok=True)
    shutil.copy2(ROOT / "pyproject.toml", ROOT / "mutants" / "pyproject.toml")
    meta = json.loads(meta_file.read_text())
    codes = meta["exit_code_by_key"]
    import mutmut.__main__ as mm

    equivalent = equivalent_mutants()  # they stay out of the score: no need to run them
    survivors = [n for n, c in codes.items() if n not in equivalent
                 and mm.status_by_exit_code.get(c, "not checked") not in DETECTED]
    def run(name: str) -> int:
        run_env = dict(env, MUTANT_UNDER_TEST=name, PYTHONPATH=str(ROOT / "mutants"))
        return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                               "no:cacheprovider", *tests], cwd=ROOT / "mutants", env=run_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode

    killed = 0
    with ThreadPoolExecutor(max_children) as pool:
        for i, (name, code) in enumerate(zip(survivors, pool.map(run, survivors),
                                             strict=True), 1):
            codes[name] = code
            # mutmut's own reading of the exit code: 2 (interrupted) or 5 (no tests ran) is no kill
            status = mm.status_by_exit_code.get(code, "not checked")
            killed += status in DETECTED
            print(f"   [{i}/{len(survivors)}] {name}: {status}", flush=True)
    meta_file.write_text(json.dumps(meta))
    return killed


def score(statuses: dict[str, str], equivalent: set[str]) -> dict:
    counted = {n: s for n, s in statuses.items() if n not in equivalent}
    killed = sum(s in DETECTED for s in counted.values())
    survived = sorted(n for n, s in counted.items() if s not in DETECTED)
    total = len(counted)
    return {
        "mutants": len(statuses),
        "equivalent": len(statuses) - total,
        "killed": killed,
        "survived": survived,
        "score": killed / total if total else 1.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module paths (default: every module)")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--timeout", type=float, default=5400.0,
                        help="seconds for one module's run (default 5400)")
    parser.add_argument("--recheck", action="store_true",
                        help="run the current tests on the survivors of each module's last run "
                             "(kept in mutants/) instead of mutating it again")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    args = parser.parse_args()

    rows = {row["path"]: row for row in module_table()}
    table = {path: row["tests"] for path, row in rows.items()}
    if args.run_one:
        run_one(args.run_one, table[args.run_one], args.max_children,
                mutant_globs(rows[args.run_one]))
        return 0
    if args.list:
        for path, tests in table.items():
            print(f"{path}: {' '.join(tests)}")
        return 0
    unknown = [m for m in args.modules if m not in table]
    if unknown:
        print(f"error: {', '.join(unknown)} not in pyproject's [[tool.normlab-mutate.module]] "
              f"table; choose from: {', '.join(table)}", file=sys.stderr)
        return 2

    OUT.mkdir(parents=True, exist_ok=True)
    scores_file = OUT / "scores.json"
    scores = json.loads(scores_file.read_text()) if scores_file.exists() else {}
    equivalent = equivalent_mutants()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    failed = []
    for path in args.modules or list(table):
        print(f"== {path}  (tests: {' '.join(table[path])})", flush=True)
        start = time.monotonic()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--run-one", path,
               "--max-children", str(args.max_children)]
        log = OUT / (path.replace("/", ".") + ".log")
        if args.recheck:
            killed = recheck(path, table[path], env, args.max_children)
            print(f"   {killed} survivor(s) of the last run killed by the current tests",
                  flush=True)
        else:
            try:
                with log.open("w") as out:
                    proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=args.timeout,
                                          stdout=out, stderr=subprocess.STDOUT)
            except subprocess.TimeoutExpired:
                print(f"   timed out after {args.timeout:.0f} s (mutmut's output: {log})",
                      flush=True)
                failed.append(path)
                continue
            if proc.returncode != 0:
                print(log.read_text()[-4000:])
                print(f"   mutmut failed on {path} (exit {proc.returncode})", flush=True)
                failed.append(path)
                continue
        result = score(status_counts(path, mutant_globs(rows[path])), equivalent)
        if args.recheck:  # the run's own time stands; the recheck's is added
            result["seconds"] = scores.get(path, {}).get("seconds", 0)
            result["recheck_seconds"] = round(time.monotonic() - start)
        else:
            result["seconds"] = round(time.monotonic() - start)
        result["tests"] = table[path]
        scores[path] = result
        scores_file.write_text(json.dumps(scores, indent=2) + "\n")
        report = OUT / (path.replace("/", ".") + ".txt")
        report.write_text(survivor_diffs(path, result["survived"]))
        print(f"   {result['killed']}/{result['mutants'] - result['equivalent']} killed "
              f"({result['equivalent']} equivalent), score {result['score']:.1%}, "
              f"{len(result['survived'])} surviving -> {report.relative_to(ROOT)}, "
              f"{result['seconds']} s", flush=True)

    print("\nmodule                                   mutants  equiv  killed  score")
    for path, r in scores.items():
        print(f"{path:<40} {r['mutants']:>7} {r['equivalent']:>6} {r['killed']:>7} "
              f"{r['score']:>6.1%}")
    done = [scores[p] for p in scores]
    killed = sum(r["killed"] for r in done)
    counted = sum(r["mutants"] - r["equivalent"] for r in done)
    if counted:
        print(f"{'all run modules':<40} {counted:>7} {'':>6} {killed:>7} {killed / counted:>6.1%}")
    rows = [f"| `{p}` | {' '.join(f'`{t}`' for t in r['tests'])} | {r['mutants']} | "
            f"{r['equivalent']} | {r['killed']} | {r['score']:.1%} | {r['seconds']} s |"
            for p, r in scores.items()]
    (OUT / "scores.md").write_text("\n".join(rows) + "\n")  # the table of docs/testing.md
    missing = [p for p in table if p not in scores]
    if missing:
        print("not yet run: " + ", ".join(missing))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
