"""Study sizes. `tiny` runs in seconds (tests); `quick` fits in about 10 minutes on a 2-core CPU
(what `make demo` runs); `standard` in about 2 hours there; `full` is sized for a GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    update_steps: int
    # training runs
    train_blocks: int
    train_width: int
    train_heads: int
    seq_len: int
    batch_size: int
    steps: int
    lrs: tuple[float, ...]
    warmup: int
    seeds: int
    eval_batches: int
    # fine-tuning (C10)
    finetune_steps: int
    finetune_batch_size: int
    finetune_test_max: int | None
    # real checkpoints (C12): passages of text probed
    real_passages: int
    workers: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


PROFILES: dict[str, Profile] = {
    # seconds: for tests and smoke checks; its verdicts mean little
    "tiny": Profile(
        name="tiny", width=32, heads=2, init_depths=(2, 4), init_seeds=2, probe_batches=1,
        probe_batch_size=4, probe_seq_len=32, update_steps=4, train_blocks=2, train_width=32,
        train_heads=2, seq_len=32, batch_size=8, steps=8, lrs=(1e-3, 4e-3), warmup=2, seeds=2,
        eval_batches=1, finetune_steps=4, finetune_batch_size=8, finetune_test_max=64,
        real_passages=1),
    "quick": Profile(
        name="quick", width=64, heads=2, init_depths=(3, 6, 12, 24), init_seeds=3,
        probe_batches=2, probe_batch_size=8, probe_seq_len=64, update_steps=24,
        train_blocks=6, train_width=64, train_heads=2, seq_len=64, batch_size=16, steps=200,
        lrs=(1e-3, 4e-3), warmup=40, seeds=3, eval_batches=4,
        finetune_steps=80, finetune_batch_size=16, finetune_test_max=768, real_passages=4),
    "standard": Profile(
        name="standard", width=128, heads=2, init_depths=(6, 12, 24, 48, 96), init_seeds=5,
        probe_batches=4, probe_batch_size=8, probe_seq_len=128, update_steps=40,
        train_blocks=6, train_width=128, train_heads=2, seq_len=128, batch_size=32,
        steps=1500, lrs=(5e-4, 1e-3, 2e-3, 4e-3), warmup=200, seeds=3, eval_batches=16,
        finetune_steps=400, finetune_batch_size=32, finetune_test_max=None, real_passages=16),
    "full": Profile(
        name="full", width=256, heads=4, init_depths=(6, 12, 24, 48, 96, 192), init_seeds=8,
        probe_batches=8, probe_batch_size=16, probe_seq_len=256, update_steps=60,
        train_blocks=12, train_width=512, train_heads=8, seq_len=256, batch_size=64,
        steps=10000, lrs=(2.5e-4, 5e-4, 1e-3, 2e-3), warmup=1000, seeds=5, eval_batches=32,
        finetune_steps=1000, finetune_batch_size=64, finetune_test_max=None, real_passages=64,
        workers=1),
}
