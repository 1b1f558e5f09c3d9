"""How long the command line takes to start: `normlab --help` and `import normlab.cli`, each in a
fresh interpreter, best of N (the target is under 0.5 s for `--help`).

    python benchmarks/bench_cli_start.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

CASES = {"import normlab.cli": [sys.executable, "-c", "import normlab.cli"],
         "normlab --help": [sys.executable, "-m", "normlab", "--help"],
         "normlab --version": [sys.executable, "-m", "normlab", "--version"]}


def best_of(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for name, cmd in CASES.items():
        print(f"{name:<20} {best_of(cmd, args.repeats):.3f} s")


if __name__ == "__main__":
    main()
