"""Training: schedules, divergence detection, checkpoints, run records and the loop."""

from normlab.train.checkpoint import CheckpointError
from normlab.train.trainer import RunFolderError, read_run_config, read_summary, train_run

__all__ = ["CheckpointError", "RunFolderError", "read_run_config", "read_summary", "train_run"]
