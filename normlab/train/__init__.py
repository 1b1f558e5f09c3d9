"""Training: schedules, divergence detection, checkpoints, run records and the loop."""

from normlab.train.checkpoint import CheckpointError, load_trained_model
from normlab.train.rundir import (
    RunFolderError,
    RunLockedError,
    read_run_config,
    read_run_folder,
    read_summary,
)
from normlab.train.trainer import ThreadCountError, train_run

__all__ = ["CheckpointError", "RunFolderError", "RunLockedError", "ThreadCountError",
           "load_trained_model", "read_run_config", "read_run_folder", "read_summary",
           "train_run"]
