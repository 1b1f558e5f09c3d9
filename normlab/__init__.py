"""normlab: where the normalization goes in a Transformer, built, trained, probed and compared."""

import warnings

from normlab.config import ConfigError, ModelConfig, make_model_config
from normlab.placements import register_placement

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModelConfig", "make_model_config", "register_placement",
           "__version__"]

# matplotlib warns when `tight_layout` cannot fit a crowded figure's decorations; the figure is
# drawn all the same, and the warning would cut into a command's output and the study's log.
# Only the warnings raised from normlab's own figure code are silenced.
warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning,
                        module=r"normlab(\.|$)")
