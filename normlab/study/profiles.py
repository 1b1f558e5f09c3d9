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

Warmup is a fraction of the run (`warmup_frac`), the same for every placement. Learning rates
start from `lrs`; when a placement's best lr sits at an edge of the grid, the grid is extended by
a factor 2 on that side, at most `max_lr_extensions` times per side, and the study records it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal


@dataclass(frozen=True)
class Profile:
    name: str
    # models at init (depth sweeps)
    width: int
    heads: int
    init_depths: tuple[int, ...]
    init_seeds: int
    probe_batches: int
    probe_batch_size: int
    probe_seq_len: int
    # DeepNet's update size (C7)
    update_steps: int
    update_blocks: int
    update_lr: float
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
    # C9: the inits under which pre and post are compared, each family tuned on its own grid
    # ("xavier": pre_xavier vs post; "gpt2_scaled": pre vs post_gpt2)
    same_inits: tuple[str, ...] = ("xavier",)
    # C11: also tune pre without a final norm on its own grid (else the ablation alone decides)
    c11_trained_without: bool = True
    # fine-tuning (C10)
    finetune_steps: int = 80
    finetune_batch_size: int = 16
    finetune_test_max: int | None = 768
    finetune_lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3)
    finetune_lr_extensions: int = 2
    finetune_passage_bytes: int = 256
    finetune_warmup: int | None = None  # None: a tenth of the fine-tuning steps
    finetune_val_fraction: float = 0.1  # of each play's training region, for tuning the lr
    finetune_val_max: int = 512  # validation passages scored per lr
    finetune_train_eval_max: int = 256  # training passages scored for the training accuracy
    finetune_standardize: int = 512  # passages whose features set the standardization
    # real checkpoints (C12's illustration): passages of text probed; 0: not probed
    real_passages: int = 4
    # C12 on normlab's own deep models
    deep_blocks: int = 12
    deep_evals: int = 10  # evaluations (and kept checkpoints) along each deep run: C12's pairs
    # the deep runs' own budget, warmup and starting lr grid (None: the 6-block runs' own)
    deep_steps: int | None = None
    deep_warmup_frac: float | None = None
    deep_lrs: tuple[float, ...] | None = None
    # C11: the depth at which pre with and without a final norm are compared (None: train_blocks;
    # deep_blocks: the deep runs, tuned at that depth)
    c11_blocks: int | None = None
    # C1-C3 and C13 probe the deep models' trajectory pairs (C12's) instead of the 6-block
    # matched cells
    probe_deep: bool = False
    # C14, the k-hop induction heads task (data.task: khop): each placement at each depth tuned
    # on its own lr grid; the size is the smallest at which depth mattered in the feasibility
    # search (docs/study.md, C14). No depths: C14 not run.
    khop_depths: tuple[int, ...] = ()
    khop_placements: tuple[str, ...] = ("pre", "post", "deepnorm", "mix", "lns")
    khop_width: int = 64
    khop_heads: int = 4
    khop_seq_len: int = 32
    khop_alphabet: int = 4
    khop_max_hops: int = 3
    khop_steps: int = 1200
    khop_batch_size: int = 32
    khop_lrs: tuple[float, ...] = (1.5e-3, 3e-3, 6e-3)
    khop_warmup: int = 100
    khop_seeds: int = 3
    khop_eval_batches: int = 8
    # C14's calibration rung (docs/study.md, C14): before the placements are compared, pre is
    # trained in Sanford et al.'s own setting (their released configs: width 128, 4 heads,
    # depths 2-6, 99 tokens over 4 letters, hops 0-16, batch 32, their targets and optimizer;
    # normlab.study.khop_source) for `khop_cal_steps` steps at the fixed lr `khop_cal_lr`, and the
    # smallest depth that solves each hop count is compared with theirs. Off: not run.
    khop_calibration: bool = False
    khop_cal_steps: int = 10_000  # a tenth of their 100,000
    khop_cal_lr: float = 1e-3  # ten times their 1e-4: the same lr x steps
    khop_cal_warmup: int = 100  # their 1000 of 100,000 steps: 1%
    # one run per depth, as their table has: their dropout (0.1) keeps runs from being stacked,
    # so each seed costs a full run per depth
    khop_cal_seeds: int = 1
    khop_cal_eval_batches: int = 54  # 1728 sequences: at least 100 per hop count, as theirs
    # C10's pairs: "cells", the tuned cells of pre and post whose mean losses are closest
    # (every seed's pair must then lie within the tolerance); "trajectories", each placement
    # trained again at its own tuned lr keeping its weights `deep_evals` times, paired per seed
    # along the two trajectories as C12's deep pairs are (docs/study.md, C10)
    c10_pairs: Literal["cells", "trajectories"] = "cells"
    c12_min_pairs: int = 3  # matched pairs C12's design asks for
    # two checkpoints count as trained to the same loss within this many nats (C2, C3, C10,
    # C12, C13's matched pairs)
    match_tolerance: float = 0.05
    workers: int = 2
    # C10's frozen linear probe: a head trained on the frozen pooled stream of each matched
    # checkpoint and of the same architecture at init, its lr tuned on its own grid (extended
    # like the fine-tuning grid); reported as diagnostics (docs/study.md, C10)
    # the claims at initialization (C1, C4, C5, C7, C8: those traced along a ladder); the long
    # profile leaves them to the standard profile, whose ladders are the same size
    theory: bool = True
    finetune_probe: bool = False
    finetune_probe_lrs: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    # C5's 6-block models at init, seeds of their own: one seed's gradient trend spreads by
    # about 0.27, and pre's flatness is an equivalence at margin 0.25, so the interval must be
    # narrower than a seed's spread (a model at init takes a fraction of a second)
    c5_seeds: int = 60
    # where the profile's sizes fit: "gpu" profiles are refused on a CPU unless asked for
    # explicitly (`normlab study --device cpu`), with their projected GPU cost
    sized_for: Literal["cpu", "gpu"] = "cpu"

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
        return {**asdict(self), "warmup": self.warmup}


PROFILES: dict[str, Profile] = {
    "tiny": Profile(
        name="tiny", width=32, heads=2, init_depths=(2, 4), init_seeds=2, probe_batches=1,
        probe_batch_size=4, probe_seq_len=32, update_steps=4, update_blocks=4, update_lr=5e-4,
        train_blocks=3, train_width=32, train_heads=2, seq_len=32, batch_size=8, steps=8,
        lrs=(1e-3, 2e-3, 4e-3), warmup_frac=0.25, seeds=2, eval_batches=1,
        max_lr_extensions=1, finetune_steps=4, finetune_batch_size=8, finetune_test_max=64,
        finetune_lrs=(1e-3,), finetune_lr_extensions=0, real_passages=1, deep_blocks=4,
        deep_evals=2, khop_depths=(1, 2), khop_placements=("pre", "post"), khop_width=16,
        khop_heads=2, khop_seq_len=12, khop_max_hops=2, khop_steps=8, khop_batch_size=8,
        khop_lrs=(3e-3,), khop_warmup=2, khop_seeds=2, khop_eval_batches=1,
        c5_seeds=2),
    "quick": Profile(
        name="quick", width=64, heads=2, init_depths=(3, 6, 12, 24), init_seeds=3,
        probe_batches=2, probe_batch_size=8, probe_seq_len=64, update_steps=24,
        update_blocks=24, update_lr=5e-4,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=240,
        lrs=(1.5e-3, 3e-3, 6e-3), warmup_frac=0.25, seeds=3, eval_batches=8,
        max_lr_extensions=1,
        finetune_steps=60, finetune_batch_size=16, finetune_test_max=384,
        finetune_lrs=(1e-3, 3e-3), finetune_lr_extensions=0, real_passages=0, deep_blocks=0,
        c11_trained_without=False),
    "standard": Profile(
        name="standard", width=64, heads=2, init_depths=(3, 6, 12, 24, 48), init_seeds=5,
        probe_batches=4, probe_batch_size=8, probe_seq_len=64, update_steps=30,
        update_blocks=24, update_lr=5e-4,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=400,
        lrs=(1.5e-3, 3e-3, 6e-3), warmup_frac=0.25, seeds=4, eval_batches=16,
        same_inits=("xavier", "gpt2_scaled"), finetune_steps=150, finetune_batch_size=16,
        finetune_test_max=512,
        finetune_lrs=(1e-4, 3e-4, 1e-3, 3e-3), finetune_lr_extensions=1, real_passages=8,
        deep_blocks=12),
    "long": Profile(
        name="long", width=64, heads=2, init_depths=(3, 6, 12, 24, 48), init_seeds=5,
        probe_batches=4, probe_batch_size=8, probe_seq_len=64, update_steps=30,
        update_blocks=24, update_lr=5e-4,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=1600,
        lrs=(7.5e-4, 1.5e-3, 3e-3, 6e-3), warmup_frac=0.04, seeds=4, eval_batches=16,
        same_inits=(), finetune_steps=1000, finetune_batch_size=8, finetune_test_max=512,
        finetune_lrs=(3e-5, 1e-4, 3e-4, 1e-3, 3e-3), finetune_lr_extensions=0, real_passages=8,
        theory=False,
        deep_blocks=12, deep_steps=800, deep_warmup_frac=0.25,
        deep_lrs=(3.75e-4, 1.5e-3, 6e-3), c11_blocks=12, probe_deep=True,
        finetune_probe=True, khop_depths=(2, 3), c10_pairs="trajectories",
        max_lr_extensions=3),
    # designed before any of its runs (docs/study.md, "The gpu profile"): every size below is
    # chosen there from the claims' sources and the recorded GPU step times, not from a result
    "gpu": Profile(
        name="gpu", width=64, heads=2, init_depths=(3, 6, 12, 24, 48), init_seeds=5,
        probe_batches=8, probe_batch_size=16, probe_seq_len=128, update_steps=30,
        update_blocks=24, update_lr=5e-4,
        train_blocks=6, train_width=128, train_heads=4, seq_len=128, batch_size=32, steps=2000,
        lrs=(7.5e-4, 1.5e-3, 3e-3, 6e-3), warmup_frac=0.04, seeds=8, eval_batches=16,
        max_lr_extensions=2, same_inits=("xavier",), finetune_steps=1000,
        finetune_batch_size=16, finetune_test_max=512, finetune_lr_extensions=1,
        real_passages=8, theory=False, deep_blocks=24, deep_steps=1000, deep_warmup_frac=0.1,
        deep_lrs=(3.75e-4, 7.5e-4, 1.5e-3, 3e-3), c11_blocks=24, probe_deep=True,
        finetune_probe=True, c10_pairs="trajectories", khop_depths=(2, 3, 4, 6),
        khop_placements=("pre", "post"), khop_width=128, khop_heads=4, khop_seq_len=64,
        khop_max_hops=8, khop_steps=3000, khop_batch_size=32, khop_lrs=(1e-3, 3e-3),
        khop_warmup=150, khop_seeds=4, khop_calibration=True, workers=1, sized_for="gpu"),
    "full": Profile(
        name="full", width=256, heads=4, init_depths=(6, 12, 24, 48, 96, 192), init_seeds=8,
        probe_batches=8, probe_batch_size=16, probe_seq_len=256, update_steps=60,
        update_blocks=48, update_lr=5e-4,
        train_blocks=12, train_width=512, train_heads=8, seq_len=256, batch_size=64,
        steps=10000, lrs=(2.5e-4, 5e-4, 1e-3, 2e-3), warmup_frac=0.1, seeds=5,
        eval_batches=32, same_inits=("xavier", "gpt2_scaled"), finetune_steps=1000,
        finetune_batch_size=64,
        finetune_test_max=None, finetune_lrs=(1e-4, 3e-4, 1e-3), real_passages=64,
        deep_blocks=24, workers=1, sized_for="gpu"),
}

# What a `sized_for="gpu"` profile would cost on one GPU, said where no GPU is found: the
# projection of docs/study.md's design, until a recorded run measures it.
GPU_COST = {
    "gpu": "projected 15-20 minutes on one H200, at most 8 minutes a part (docs/study.md, "
           "\"The gpu profile\": from recorded step times, not yet measured)",
    "full": "hours on one GPU (estimated on the GPU before it starts)",
}
