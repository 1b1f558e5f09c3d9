"""Write what docs/study.md and the README say of the study from its sources of truth: the claim
table of docs/study.md from the claim specs (`normlab.study.claims.claim_table`), and the README's
findings and verdict tables from the recorded study.json files under docs/results/
(`normlab.study.table`). Each lies between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers.

    python scripts/study_docs.py          # rewrite both files
    python scripts/study_docs.py --check  # exit 1 if either is out of date (the tests run this)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def blocks() -> dict[Path, dict[str, str]]:
    from normlab.study.claims import claim_table
    from normlab.study.table import findings, markdown_table, study_header

    readme: dict[str, str] = {}
    for profile in ("quick", "standard", "long"):
        path = RESULTS / f"study_{profile}" / "study.json"
        if not path.exists():
            continue
        study = json.loads(path.read_text())
        readme[f"study-{profile}"] = (
            study_header(study) + f" [study.json](docs/results/study_{profile}/study.json), "
            f"[report](docs/results/study_{profile}/report.html).\n\n"
            + findings(study["claims"]) + "\n" + markdown_table(study["claims"]))
    return {ROOT / "docs" / "study.md": {"claim-table": claim_table()},
            ROOT / "README.md": readme}


def render(text: str, parts: dict[str, str], path: Path) -> str:
    for name, body in parts.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n)(.*?)(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path}: no <!-- {name}:start --> ... <!-- {name}:end --> block")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(3), text)
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, parts in blocks().items():
        old = path.read_text()
        new = render(old, parts, path)
        if new != old:
            stale.append(path)
            if not check:
                path.write_text(new)
    if check and stale:
        print("out of date (run python scripts/study_docs.py): "
              + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
