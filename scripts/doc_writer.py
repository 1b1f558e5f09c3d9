"""The command line of a script that writes part of a doc page from its source of truth
(scripts/config_docs.py, scripts/probe_docs.py): write the page, or with --check only say whether
it is current.

    sys.exit(doc_writer.main(argv, prog="python scripts/x_docs.py", description="...",
                             default=DOC, render=lambda current: ...))
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(argv: list[str] | None, *, prog: str, description: str, default: Path,
         render: Callable[[str], str]) -> int:
    """`render(current)` is the page as it should be, given the page as it is ("" when there is
    none). Exit status 1 with --check when the two differ; else write it and return 0."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--check", action="store_true", help="only check that it is current")
    ap.add_argument("--out", type=Path, default=default)
    args = ap.parse_args(argv)
    current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    text = render(current)
    if args.check:
        if current != text:
            print(f"{args.out} is out of date; run {prog}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0
