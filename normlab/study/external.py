"""Claims whose experiments use other parts of normlab: C10 (fine-tuning transfer) and C12
(real pretrained checkpoints). Each reports `not run` with the reason when its part is absent."""

from __future__ import annotations

from normlab.probe.fits import welch_ci
from normlab.study.experiments import StudyContext
from normlab.study.schema import ClaimResult, Effect
from normlab.study.verdict import decide_interval, rule_text


def c10(ctx: StudyContext) -> ClaimResult:
    from normlab.data.genre import genre_task, naive_bayes_baseline
    from normlab.finetune import finetune
    from normlab.study.claims import SCALE, _claim
    from normlab.study.figures import plot_bars

    p = ctx.profile
    passage = min(256, p.seq_len)  # the pretrained models know positions up to seq_len only
    grid = ctx.grid()
    acc: dict[str, list[float]] = {}
    for placement in ("pre", "post"):
        lr = ctx.tuned_lr(placement)
        acc[placement] = []
        for seed in range(p.seeds):
            run_id = grid[f"{placement}|{lr}|{p.warmup}|{seed}|final"]["run_id"]
            res = finetune(ctx.runs_root / run_id, "genre", steps=p.finetune_steps, lr=1e-3,
                           batch_size=p.finetune_batch_size, warmup=max(1, p.finetune_steps // 10),
                           seed=seed, passage_bytes=passage, test_max=p.finetune_test_max,
                           device="cpu")
            acc[placement].append(res["test_accuracy"])
    ctx.log("fine-tuned the tuned pre and post runs on the genre task")
    baseline = ctx.cached(  # scored on the test passages the fine-tuned models are
        f"genre_baseline_{passage}_{p.finetune_test_max}",
        lambda: naive_bayes_baseline(genre_task("genre", passage_bytes=passage),
                                     test_max=p.finetune_test_max))
    from normlab.probe.fits import mean_ci

    bars = {f"{pl} fine-tuned": mean_ci(v) for pl, v in acc.items()}
    bars["char-trigram naive Bayes"] = {"mean": baseline["test_accuracy"], "ci95": [
        baseline["test_accuracy"], baseline["test_accuracy"]]}
    fig = plot_bars(bars, ctx.fig_dir / "c10_transfer.svg", ylabel="genre test accuracy",
                    title=f"{passage}-byte passages, chance {baseline['chance']:.2f}")
    return _claim(
        "C10", "Post-LN transfers better after fine-tuning",
        "Pretrained Post-LN models fine-tune to better downstream accuracy than Pre-LN ones, "
        "even when pretraining losses match.",
        "Seed blog",
        f"The tuned pre and post runs (one per seed) fine-tuned on the Shakespeare genre task "
        f"(comedy/history/tragedy of a {passage}-byte passage, speaker headings and stage "
        f"directions stripped, first 80% of each play for training, last 20% for test), "
        f"{p.finetune_steps} AdamW steps at lr 1e-3, all weights, mean pooling; effect per "
        "seed: test accuracy post - pre.",
        [b - a for a, b in zip(acc["pre"], acc["post"], strict=True)], ">", 0.0,
        "genre test accuracy(post) - accuracy(pre)",
        {"test_accuracy": {pl: mean_ci(v) for pl, v in acc.items()},
         "per_seed_accuracy": acc, "ngram_baseline": baseline["test_accuracy"],
         "chance": baseline["chance"], "majority": baseline.get("majority")},
        [str(fig.relative_to(ctx.out))] if fig else [],
        caveat=SCALE + f" Passages are {passage} bytes (the pretraining context), shorter than "
                       "the task's 256 when the profile's context is shorter.")


def c12(ctx: StudyContext) -> ClaimResult:
    title = "Deep Pre-LN layers are removable in real models"
    statement = ("In pre-LN LLMs deep layers can be removed at little cost (angular distance "
                 "between consecutive deep layers is small); in post-LN BERT they cannot.")
    source = "Sun et al. 2025, Curse of Depth (2502.05795); Gromov et al. 2024"
    from normlab.interop import CheckpointNotFound, MissingDependency, run_hf_probe
    from normlab.interop.figures import comparison_figure

    p = ctx.profile
    results = {}
    for name in ("minilm", "smollm2"):
        def compute(name: str = name) -> dict:
            ctx.log(f"probing the real checkpoint {name}")
            return run_hf_probe(name, n_batches=p.real_passages, batch_size=2, seq_len=64,
                                figures=False)
        try:
            results[name] = ctx.cached(f"real_{name}", compute)
        except (CheckpointNotFound, MissingDependency) as e:  # no checkpoint, or no hf extra
            return ClaimResult(id="C12", title=title, statement=statement, source=source,
                               method="", verdict="not run", rule="", note=str(e))
    deep = {n: _deep_half(r["drop"]["drop_hidden_cos"]) for n, r in results.items()}
    welch = welch_ci(deep["minilm"], deep["smollm2"])
    diff, (low, high) = welch["diff"], welch["ci95"]
    name = "mean drop cost, deeper half: MiniLM (post) - SmolLM2 (pre)"
    verdict = decide_interval(diff, low, high, ">", 0.0)
    fig = comparison_figure([results["minilm"], results["smollm2"]],
                            ctx.fig_dir / "c12_real_models.svg")
    return ClaimResult(
        id="C12", title=title, statement=statement, source=source,
        method="Layer drop on real checkpoints with their own tokenizers, on Shakespeare "
               "validation text: for each block, 1 - cos between the final hidden states with "
               "and without the block (MiniLM has no LM head, so the loss is not comparable). "
               "Effect: mean over the deeper half of the blocks, MiniLM minus SmolLM2, with a "
               "Welch interval over blocks.",
        verdict=verdict, rule=rule_text(name, ">", 0.0),
        effect=Effect(name=name, estimate=diff, ci_low=low, ci_high=high, n=welch["n"],
                      expected="> 0"),
        numbers={n: {"drop_hidden_cos": r["drop"]["drop_hidden_cos"],
                     "drop_dloss": r["drop"].get("drop_dloss"),
                     "ang_prev": r["per_block"]["ang_prev"], "norm": r["per_block"]["norm"],
                     "summary": r["summary"]} for n, r in results.items()},
        figures=[str(fig.relative_to(ctx.out))] if fig else [],
        caveat="One model per placement, and the two differ in far more than the placement "
               "(size, objective, data); the interval is over blocks, not over models.")


def _deep_half(values: list[float]) -> list[float]:
    return values[len(values) // 2:]


