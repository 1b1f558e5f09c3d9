"""Study sizes, fixed before any run (docs/study.md says why each number is what it is).

- `tiny`: seconds, for tests; its verdicts mean nothing.
- `quick`: what `make demo` runs; at most 10 minutes on 2 CPU cores; 3 paired seeds, 240 steps;
  C12's real checkpoints not probed (an illustration, and C12 is not run without deep models).
- `standard`: at most an hour on 2 CPU cores; 4 paired seeds, 400 steps, pre and post compared
  under both inits (C9), and 12-block models (C11, C12).
- `long`: at most 150 minutes on 2 CPU cores; the trained claims at the sources' scale: 1600-step
  6-block runs over 4 lrs (C6), warmup 4% of the run (Vaswani et al.: 4000 of 100,000 steps),
  12-block models with their own budget, warmup and grid (C11 decided at 12 blocks, C12, and
  C2/C3/C13 probing their trajectory pairs), 1000-step fine-tuning (C10), k-hop models (C14).
- `gpu`: sized for one GPU (`sized_for="gpu"`), in parts of at most 8 minutes each: the
  scale-limited claims (C2, C3, C6, C9-C14) at 8 seeds, 6-block models trained 2000 steps near
  convergence, 24-block models, 1000-step fine-tuning, k-hop depths 2-6 on 8 hops; designed before
  any of its runs (docs/study.md, "The gpu profile"), its cost projected from recorded GPU step
  times until it is measured. Without a GPU `normlab study` says so and asks for `--device cpu`.
- `full`: sized for a GPU or a Ray cluster (width 256 and up); prints its estimated time first.

Each claim's own sizes (its seeds, grids, runs) live in the claim's module as its `Settings`,
one value per profile (`normlab.study.claims`); `Profile` keeps the sizes the claims share.

Warmup is a fraction of the run (`warmup_frac`), the same for every placement. Learning rates
start from `lrs`; when a placement's best lr sits at an edge of the grid, the grid is extended by
a factor 2 on that side, at most `max_lr_extensions` times per side, and the study records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal


@dataclass(frozen=True)
class Profile:
    """The sizes several claims share. A claim's own sizes (C7's update ladder, C10's
    fine-tuning, C14's k-hop models, ...) are its `Settings`, declared per profile in the claim's
    module (`normlab.study.claims.spec.Claim.settings`); `claims` holds those a study sets on
    the profile itself (`Claim.with_settings`), by claim id."""

    name: str
    # models at init (depth sweeps)
    width: int
    heads: int
    init_depths: tuple[int, ...]
    init_seeds: int
    probe_batches: int
    probe_batch_size: int
    probe_seq_len: int
    # training runs
    train_blocks: int
    train_width: int
    train_heads: int
    seq_len: int
    batch_size: int
    steps: int
    lrs: tuple[float, ...]
    warmup_frac: float
    seeds: int
    eval_batches: int
    max_lr_extensions: int = 2
    # the deep models (C12's pairs; C11 at their depth; C1-C3 and C13 with `probe_deep`)
    deep_blocks: int = 12
    deep_evals: int = 10  # evaluations (and kept checkpoints) along each deep run: C12's pairs
    # the deep runs' own budget, warmup and starting lr grid (None: the 6-block runs' own)
    deep_steps: int | None = None
    deep_warmup_frac: float | None = None
    deep_lrs: tuple[float, ...] | None = None
    # C1-C3 and C13 probe the deep models' trajectory pairs (C12's) instead of the 6-block
    # matched cells
    probe_deep: bool = False
    # two checkpoints count as trained to the same loss within this many nats (C2, C3, C10,
    # C12, C13's matched pairs)
    match_tolerance: float = 0.05
    workers: int = 2
    # the claims at initialization (C1, C4, C5, C7, C8: those traced along a ladder); the long
    # profile leaves them to the standard profile, whose ladders are the same size
    theory: bool = True
    # where the profile's sizes fit: "gpu" profiles are refused on a CPU unless asked for
    # explicitly (`normlab study --device cpu`), with their projected GPU cost
    sized_for: Literal["cpu", "gpu"] = "cpu"
    # claim settings set on this profile for one study (claim id -> the claim's `Settings`);
    # empty: each claim's own value for the profile
    claims: Mapping[str, Any] = field(default_factory=dict)

    @property
    def warmup(self) -> int:
        """Warmup steps of a run with warmup: `warmup_frac` of the run."""
        return max(1, round(self.warmup_frac * self.steps))

    @property
    def deep_train_steps(self) -> int:
        """Steps of a deep run (`deep_steps`, or the 6-block runs' `steps`)."""
        return self.deep_steps or self.steps

    @property
    def deep_warmup(self) -> int:
        """Warmup steps of a deep run: `deep_warmup_frac` (or `warmup_frac`) of its steps."""
        frac = self.warmup_frac if self.deep_warmup_frac is None else self.deep_warmup_frac
        return max(1, round(frac * self.deep_train_steps))

    @property
    def deep_start_lrs(self) -> tuple[float, ...]:
        """The lr grid a deep family's tuning starts from (`deep_lrs`, or `lrs`)."""
        return tuple(self.deep_lrs or self.lrs)

    def to_dict(self) -> dict:
        """The shared sizes (study.json records them with every claim's settings:
        `normlab.study.claims.profile_settings`)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "claims"},
                "warmup": self.warmup}


PROFILES: dict[str, Profile] = {
    "tiny": Profile(
        name="tiny", width=32, heads=2, init_depths=(2, 4), init_seeds=2, probe_batches=1,
        probe_batch_size=4, probe_seq_len=32,
        train_blocks=3, train_width=32, train_heads=2, seq_len=32, batch_size=8, steps=8,
        lrs=(1e-3, 2e-3, 4e-3), warmup_frac=0.25, seeds=2, eval_batches=1,
        max_lr_extensions=1, deep_blocks=4, deep_evals=2),
    "quick": Profile(
        name="quick", width=64, heads=2, init_depths=(3, 6, 12, 24), init_seeds=3,
        probe_batches=2, probe_batch_size=8, probe_seq_len=64,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=240,
        lrs=(1.5e-3, 3e-3, 6e-3), warmup_frac=0.25, seeds=3, eval_batches=8,
        max_lr_extensions=1, deep_blocks=0),
    "standard": Profile(
        name="standard", width=64, heads=2, init_depths=(3, 6, 12, 24, 48), init_seeds=5,
        probe_batches=4, probe_batch_size=8, probe_seq_len=64,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=400,
        lrs=(1.5e-3, 3e-3, 6e-3), warmup_frac=0.25, seeds=4, eval_batches=16,
        deep_blocks=12),
    "long": Profile(
        name="long", width=64, heads=2, init_depths=(3, 6, 12, 24, 48), init_seeds=5,
        probe_batches=4, probe_batch_size=8, probe_seq_len=64,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=1600,
        lrs=(7.5e-4, 1.5e-3, 3e-3, 6e-3), warmup_frac=0.04, seeds=4, eval_batches=16,
        theory=False, deep_blocks=12, deep_steps=800, deep_warmup_frac=0.25,
        deep_lrs=(3.75e-4, 1.5e-3, 6e-3), probe_deep=True, max_lr_extensions=3),
    # designed before any of its runs (docs/study.md, "The gpu profile"): every size below, and
    # each claim's own for this profile, is chosen there from the claims' sources and the
    # recorded GPU step times, not from a result
    "gpu": Profile(
        name="gpu", width=64, heads=2, init_depths=(3, 6, 12, 24, 48), init_seeds=5,
        probe_batches=8, probe_batch_size=16, probe_seq_len=128,
        train_blocks=6, train_width=128, train_heads=4, seq_len=128, batch_size=32, steps=2000,
        lrs=(7.5e-4, 1.5e-3, 3e-3, 6e-3), warmup_frac=0.04, seeds=8, eval_batches=16,
        max_lr_extensions=2, theory=False, deep_blocks=24, deep_steps=1000,
        deep_warmup_frac=0.1, deep_lrs=(3.75e-4, 7.5e-4, 1.5e-3, 3e-3), probe_deep=True,
        workers=1, sized_for="gpu"),
    "full": Profile(
        name="full", width=256, heads=4, init_depths=(6, 12, 24, 48, 96, 192), init_seeds=8,
        probe_batches=8, probe_batch_size=16, probe_seq_len=256,
        train_blocks=12, train_width=512, train_heads=8, seq_len=256, batch_size=64,
        steps=10000, lrs=(2.5e-4, 5e-4, 1e-3, 2e-3), warmup_frac=0.1, seeds=5,
        eval_batches=32, deep_blocks=24, workers=1, sized_for="gpu"),
}

# What a `sized_for="gpu"` profile would cost on one GPU, said where no GPU is found: the
# design of docs/study.md and what its first run on a GPU measured.
GPU_COST = {
    "gpu": "designed for 15-20 minutes on one GPU, at most 8 minutes a part; on one H100 its "
           "post-ends-better part alone was estimated at 17 minutes from measured step times, "
           "so it needs resizing (docs/study.md, \"The gpu profile\")",
    "full": "hours on one GPU (estimated on the GPU before it starts)",
}
