import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The tests use tiny models, which run fastest on one thread; more threads only oversubscribe
# the cores when anything else runs.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_study_dir(tmp_path_factory):
    """A real study at profile `tiny` (about a minute on one core), run once for every test
    module that reads one."""
    from normlab.study.runner import run_study

    out = tmp_path_factory.mktemp("tiny-study")
    run_study(out, "tiny", log=lambda m: None)
    return out
