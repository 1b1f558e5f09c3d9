"""The k-hop feasibility search (docs/study.md, C14): the smallest size at which depth visibly
matters on this machine, for the placement the task's authors trained (GPT-2's Pre-LN).

The search and its rule were fixed before any of its runs:

- Sizes, cheapest first (the letters are always 4, as in the authors' configs; batch 32, lr 3e-3
  with 100 warmup steps, 8 validation batches, fp32 on CPU):
    S1  width 32, 2 heads, 24 tokens, hops 1-3,  600 steps
    S2  width 64, 4 heads, 32 tokens, hops 1-3, 1200 steps
    S3  width 64, 4 heads, 32 tokens, hops 1-4, 2400 steps
    S4  width 64, 4 heads, 48 tokens, hops 1-6, 3000 steps
- At each size: Pre-LN at 1, 2, 3 and 4 blocks, 2 seeds (seed s: the same data and init draw
  at every depth).
- Depth visibly matters at a size when both hold:
    (a) in each seed, the accuracy on the largest hop count at 4 blocks exceeds that at 1 block
        by at least 0.3;
    (b) the largest hop count solved (every hop count up to it at accuracy >= 0.9), averaged over
        the seeds, is larger at 4 blocks than at 2.
- The search stops at the first size that passes; that size is the smallest.

    python scripts/khop_feasibility.py OUT     (resumable: finished runs are reused)

writes OUT/feasibility.json and prints a table per size.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

SIZES = {
    "S1": dict(width=32, heads=2, seq_len=24, max_hops=3, steps=600),
    "S2": dict(width=64, heads=4, seq_len=32, max_hops=3, steps=1200),
    "S3": dict(width=64, heads=4, seq_len=32, max_hops=4, steps=2400),
    "S4": dict(width=64, heads=4, seq_len=48, max_hops=6, steps=3000),
}
DEPTHS = (1, 2, 3, 4)
SEEDS = (0, 1)
SOLVED = 0.9     # a hop count is solved at this accuracy
RISE = 0.3       # rule (a): the largest hop count's accuracy, 4 blocks minus 1 block, per seed


def configs(size: dict, depth: int, seed: int):
    from normlab.config import load_run_config

    alphabet = 4
    return load_run_config(None, [
        "model.placement=pre", f"model.n_blocks={depth}", f"model.d_model={size['width']}",
        f"model.n_heads={size['heads']}", f"model.max_seq_len={size['seq_len']}",
        f"model.vocab_size={alphabet + size['max_hops']}",
        "data.task=khop", f"data.khop_alphabet={alphabet}", "data.khop_min_hops=1",
        f"data.khop_max_hops={size['max_hops']}", f"data.seq_len={size['seq_len']}",
        f"train.steps={size['steps']}", "train.batch_size=32", "train.lr=3e-3",
        "train.warmup=100", f"train.seed={seed}", f"train.eval_every={size['steps'] // 4}",
        "train.eval_batches=8", f"train.log_every={size['steps'] // 10}",
        "train.device=cpu"])


def solved(acc: dict[int, float]) -> int:
    """The largest k such that every hop count 1..k is at accuracy >= SOLVED (0: none)."""
    k = 0
    for hop in sorted(acc):
        if acc[hop] < SOLVED:
            break
        k = hop
    return k


def main(out: Path) -> int:
    from normlab.study.experiments import StudyFolder
    from normlab.study.profiles import PROFILES

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = StudyFolder(out, replace(PROFILES["quick"], workers=2), print)
    record: dict = {"rule": {"solved": SOLVED, "rise": RISE, "depths": DEPTHS, "seeds": SEEDS},
                    "cpu": _cpu(), "python": platform.python_version(), "sizes": {}}
    for name, size in SIZES.items():
        t = time.perf_counter()
        grid = {(d, s): configs(size, d, s) for d in DEPTHS for s in SEEDS}
        summaries = dict(zip(grid, folder.train(list(grid.values())), strict=True))
        acc = {(d, s): {k: summaries[d, s].get(f"val_acc_hop{k}", float("nan"))
                        for k in range(1, size["max_hops"] + 1)} for d, s in grid}
        top = size["max_hops"]
        rise = [acc[DEPTHS[-1], s][top] - acc[DEPTHS[0], s][top] for s in SEEDS]
        mean_solved = {d: sum(solved(acc[d, s]) for s in SEEDS) / len(SEEDS) for d in DEPTHS}
        passes = all(r >= RISE for r in rise) and mean_solved[4] > mean_solved[2]
        record["sizes"][name] = {
            **size, "wall_s": time.perf_counter() - t,
            "runs": {f"{d}x{s}": {"run_id": grid[d, s].run_id(), "outcome":
                                  summaries[d, s].get("outcome"),
                                  "val_loss": summaries[d, s].get("val_loss"),
                                  "acc": acc[d, s], "solved": solved(acc[d, s])}
                     for d, s in grid},
            "rise_top_hop": rise, "mean_solved": mean_solved, "passes": passes}
        print(f"\n{name} {size}: {time.perf_counter() - t:.0f} s")
        print("blocks seed " + " ".join(f"k={k}" for k in range(1, top + 1)) + " solved")
        for d, s in grid:
            print(f"{d:6d} {s:4d} " + " ".join(f"{acc[d, s][k]:.2f}" for k in range(1, top + 1))
                  + f" {solved(acc[d, s])}")
        print(f"rise at k={top} (4 blocks - 1 block): {rise}; mean solved {mean_solved}; "
              f"passes: {passes}")
        (out / "feasibility.json").write_text(json.dumps(record, indent=1))
        if passes:
            record["smallest"] = name
            break
    record["wall_s"] = time.perf_counter() - t0
    (out / "feasibility.json").write_text(json.dumps(record, indent=1))
    print(f"smallest size where depth matters: {record.get('smallest', 'none')}")
    return 0


def _cpu() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor()
    name = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")]
    flags = [ln for ln in text.splitlines() if ln.startswith("Flags")]
    isa = [f for f in ("avx2", "avx512f", "amx_bf16") if flags and f in flags[0].split()]
    return f"{name[0] if name else '?'} ({', '.join(isa)})"


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("khop_feasibility")))
