"""normlab: where the normalization goes in a Transformer, built, trained, probed and compared."""

from normlab.config import ConfigError, ModelConfig, make_model_config

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModelConfig", "make_model_config", "__version__"]
