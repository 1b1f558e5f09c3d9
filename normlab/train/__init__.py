"""Training: schedules, divergence detection, checkpoints, run records and the loop."""

from normlab.train.checkpoint import CheckpointError, load_trained_model
from normlab.train.trainer import RunFolderError, read_run_config, read_summary, train_run

__all__ = ["CheckpointError", "RunFolderError", "load_trained_model", "read_run_config",
           "read_summary", "train_run"]
