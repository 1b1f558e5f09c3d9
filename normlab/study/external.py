"""Claims whose experiments use other parts of normlab: C10 (fine-tuning transfer) and C12
(real pretrained checkpoints). Each reports `not run` with the reason when its part is absent."""

from __future__ import annotations

import math

from normlab.probe.fits import t_quantile
from normlab.study.experiments import StudyContext
from normlab.study.schema import ClaimResult, Effect
from normlab.study.verdict import decide_interval, rule_text


def c10(ctx: StudyContext) -> ClaimResult:
    return ClaimResult(
        id="C10", title="Post-LN transfers better after fine-tuning",
        statement="Pretrained Post-LN models fine-tune to better downstream accuracy than "
                  "Pre-LN ones, even when pretraining losses match.",
        source="Seed blog", method="", verdict="not run", rule="",
        note="the fine-tuning task is not available in this build")


def c12(ctx: StudyContext) -> ClaimResult:
    title = "Deep Pre-LN layers are removable in real models"
    statement = ("In pre-LN LLMs deep layers can be removed at little cost (angular distance "
                 "between consecutive deep layers is small); in post-LN BERT they cannot.")
    source = "Sun et al. 2025, Curse of Depth (2502.05795); Gromov et al. 2024"
    try:
        from normlab.interop import run_hf_probe
        from normlab.interop.checkpoints import CheckpointNotFound
        from normlab.interop.figures import comparison_figure
    except ImportError as e:  # the optional hf extra is absent
        return ClaimResult(id="C12", title=title, statement=statement, source=source, method="",
                           verdict="not run", rule="",
                           note=f"needs the hf extra ({e}): pip install 'normlab[hf]'")
    p = ctx.profile
    results = {}
    for name in ("minilm", "smollm2"):
        def compute(name: str = name) -> dict:
            ctx.log(f"probing the real checkpoint {name}")
            return run_hf_probe(name, n_batches=p.real_passages, batch_size=2, seq_len=64,
                                figures=False)
        try:
            results[name] = ctx.cached(f"real_{name}", compute)
        except CheckpointNotFound as e:
            return ClaimResult(id="C12", title=title, statement=statement, source=source,
                               method="", verdict="not run", rule="", note=str(e))
    deep = {n: _deep_half(r["drop"]["drop_hidden_cos"]) for n, r in results.items()}
    m_post, se_post, n_post = _mean_se(deep["minilm"])
    m_pre, se_pre, n_pre = _mean_se(deep["smollm2"])
    diff = m_post - m_pre
    se = math.sqrt(se_post**2 + se_pre**2)
    # Welch-Satterthwaite degrees of freedom
    df = se**4 / ((se_post**4 / max(1, n_post - 1)) + (se_pre**4 / max(1, n_pre - 1))) if se else 1
    half = t_quantile(0.975, max(1.0, df)) * se
    name = "mean drop cost, deeper half: MiniLM (post) - SmolLM2 (pre)"
    verdict = decide_interval(diff, diff - half, diff + half, ">", 0.0)
    fig = comparison_figure([results["minilm"], results["smollm2"]],
                            ctx.fig_dir / "c12_real_models.png")
    return ClaimResult(
        id="C12", title=title, statement=statement, source=source,
        method="Layer drop on real checkpoints with their own tokenizers, on Shakespeare "
               "validation text: for each block, 1 - cos between the final hidden states with "
               "and without the block (MiniLM has no LM head, so the loss is not comparable). "
               "Effect: mean over the deeper half of the blocks, MiniLM minus SmolLM2, with a "
               "Welch interval over blocks.",
        verdict=verdict, rule=rule_text(name, ">", 0.0),
        effect=Effect(name=name, estimate=diff, ci_low=diff - half, ci_high=diff + half,
                      n=n_post + n_pre, expected="> 0"),
        numbers={n: {"drop_hidden_cos": r["drop"]["drop_hidden_cos"],
                     "drop_dloss": r["drop"].get("drop_dloss"),
                     "ang_prev": r["per_block"]["ang_prev"], "norm": r["per_block"]["norm"],
                     "summary": r["summary"]} for n, r in results.items()},
        figures=[str(fig.relative_to(ctx.out))] if fig else [],
        caveat="One model per placement, and the two differ in far more than the placement "
               "(size, objective, data); the interval is over blocks, not over models.")


def _deep_half(values: list[float]) -> list[float]:
    return values[len(values) // 2:]


def _mean_se(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return m, sd / math.sqrt(n), n
