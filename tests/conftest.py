import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The tests use tiny models, which run fastest on one thread; more threads only oversubscribe
# the cores when anything else runs.
torch.set_num_threads(1)
