"""Hugging Face interop: import/export GPT-2 and BERT, and probe real checkpoints through
normlab's tap names. Optional extra: `transformers` (plus `gguf` and `accelerate` for GGUF).

Nothing here touches a hub: models come from local folders or memory (`local_files_only=True`,
`trust_remote_code=False`). Importing this package does not import transformers.

    from normlab.interop import gpt2_to_normlab, normlab_to_gpt2, bert_to_normlab
    from normlab.interop import HFTapModel, skip_blocks, load_checkpoint, run_hf_probe
"""

from normlab.interop.adapters import (
    HF_FAMILIES,
    HFTapModel,
    capture_hf,
    family_of,
    layers_of,
    skip_blocks,
    tap_model,
)
from normlab.interop.checkpoints import (
    KNOWN,
    CheckpointNotFound,
    CheckpointSpec,
    LoadedCheckpoint,
    load_checkpoint,
    resolve_checkpoint,
)
from normlab.interop.errors import InteropError, MissingDependency
from normlab.interop.hf_bert import bert_to_normlab, load_bert, normlab_to_bert
from normlab.interop.hf_gpt2 import gpt2_to_normlab, load_gpt2, normlab_to_gpt2
from normlab.interop.probe_hf import drop_scan, make_batches, probe_hf_model, run_hf_probe

__all__ = [
    "HF_FAMILIES", "KNOWN", "CheckpointNotFound", "CheckpointSpec", "HFTapModel", "InteropError",
    "LoadedCheckpoint", "MissingDependency", "bert_to_normlab", "capture_hf", "drop_scan",
    "family_of", "gpt2_to_normlab", "layers_of", "load_bert", "load_checkpoint", "load_gpt2",
    "make_batches", "normlab_to_bert", "normlab_to_gpt2", "probe_hf_model", "resolve_checkpoint",
    "run_hf_probe", "skip_blocks", "tap_model",
]
