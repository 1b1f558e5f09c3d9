"""The model library: norms, placement plans, the one Block, the model, inits and taps."""

from normlab.nn.hooked import ActivationCache, HookPoint
from normlab.nn.model import ModelOutput, NormTransformer, build_model, profile_admin_omega
from normlab.nn.plan import (
    BlockPlan,
    ModelPlan,
    SublayerPlan,
    admin_closed_form_omega,
    build_plan,
    deepnorm_constants,
)
from normlab.nn.taps import Capture, capture, select_taps, tap_names

__all__ = [
    "ActivationCache", "BlockPlan", "Capture", "HookPoint", "ModelOutput", "ModelPlan",
    "NormTransformer", "SublayerPlan",
    "admin_closed_form_omega", "build_model", "build_plan", "capture", "deepnorm_constants",
    "profile_admin_omega", "select_taps", "tap_names",
]
