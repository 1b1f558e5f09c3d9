"""Claims whose experiments use other parts of normlab: C10 (fine-tuning transfer) and C12
(real pretrained checkpoints). Each reports `not run` with the reason when its part is absent."""

from __future__ import annotations

from normlab.study.experiments import StudyContext
from normlab.study.schema import ClaimResult


def c10(ctx: StudyContext) -> ClaimResult:
    return ClaimResult(
        id="C10", title="Post-LN transfers better after fine-tuning",
        statement="Pretrained Post-LN models fine-tune to better downstream accuracy than "
                  "Pre-LN ones, even when pretraining losses match.",
        source="Seed blog", method="", verdict="not run", rule="",
        note="the fine-tuning task is not available in this build")


def c12(ctx: StudyContext) -> ClaimResult:
    return ClaimResult(
        id="C12", title="Deep Pre-LN layers are removable in real models",
        statement="In pre-LN LLMs deep layers can be removed at little cost; in post-LN BERT "
                  "they cannot.",
        source="Curse of Depth (2502.05795)", method="", verdict="not run", rule="",
        note="the real-checkpoint probes are not available in this build")
