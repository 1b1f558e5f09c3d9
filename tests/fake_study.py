"""The one fake `StudyContext` every claim test uses: it serves planted measurements, so each
claim's rule is tested without training or building a model.

- **Training runs** (`tuned`, `runs`, `late_improvement`, `final_norm_costs`, `deep_grid`):
  planted numbers `numbers[key]` plus `noise * N(0, 1)` per seed. Keys: `val_<family>` (with
  warmup) and `val_<family>_nowarmup`, each optionally `@<lr>` for one lr; `fails_<family>
  [_nowarmup][@<lr>]` how many seeds (the first ones) diverge there (scored ln 256, as the study
  scores a diverged run); `best_lr_<family>[_nowarmup]` a grid's best lr, whatever the losses
  say; `late_<family>` how much a run's loss still fell over its last quarter (spread 0.001 of
  its own), `stable_<family>` the same over the quarter before a wsd run's decay (C9's premise,
  `late_improvement(..., end=...)`); `stalled_<family>` every seed stalled;
  `unbracketed_<family>` its best at an edge;
  `fn<blocks>` the cost of dropping the final norm (`rms<blocks>`, `rms<blocks>_init` the raw
  final stream's RMS); `deep_seeds` the deep runs' seeds.
- **A claim's own measurements** (`own(measurement, ...)`): the fake's planted method of the
  measurement's name: C9's `late_improvement`, C10's `c10_checkpoints`, C11's
  `final_norm_measures` (above) and C14's k-hop measurements (below).
- **The k-hop task** (`khop_tuned`, `khop_accuracy`): `khop_<placement>@<blocks>` the accuracy
  per hop count (default `KHOP`, the world where the sources hold) plus noise per seed;
  `stalled_khop_<placement>` every seed stalled; `stable_khop_<placement>` how much its loss
  still fell over the quarter before the wsd decay (C14's plateau premise; spread 0.001).
  C14's calibration rung (`khop_calibration`): `khopcal@<blocks>` pre's accuracy per hop count
  1..16 in the source's setting (default: one minus Sanford et al.'s released errors, the world
  where the rung passes) plus noise.
- **Matched-loss probes** (`trained_probes`, `init_probes`, `same_lr_probes`: see each): per
  placement and seed,
  `ang_slope_<pl>` the slope of the angle to the previous block and `ang_level_<pl>` its level
  at block 2 (default 0.4, above C3's and C12's near-identity line), `merge_<pl>` / `drop_<pl>` the
  log of the merge and drop KLs, `lens_gap_<pl>` the logit-lens gap through the final norm and
  `lens_free_gap_<pl>` through a norm without parameters (that gap, unless planted) (each drawn
  only when planted, so a world's draws do not depend on keys it does not plant); the stream's
  norm from the ladders' world (`Planted`, Curse of Depth's trained growth).
- **Ladders at init** (`init_ladder`, `update_ladder`): the theory claims' worlds, from a few
  planted parameters per rung (`Planted`), made for exactly the rungs, placements, depths and
  measurements asked (a claim that asks for the wrong ones reads data that is not there); each
  request is recorded in `requests`.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from normlab.study.claims import c14_khop_depth, with_settings
from normlab.study.context import MatchedPair, ProbedPair, ProbedRun, RunRecord, TunedGrid
from normlab.study.profiles import PROFILES

SEEDS = 5  # training runs and probes
LADDER_SEEDS = 6  # models at init
LRS = (1e-3, 2e-3)

# What the sources state, per placement, in the planted parameters' terms. Lemma 2's world: each
# block adds its branches' energy (units of d): uniform attention d/2, the ReLU FFN d/2 (Lemma 1),
# so pre's stream grows by `pre_inc` = attn_sq + mlp_sq per block, linearly (`pre_power` 1), and
# post's FFN norm input is 1 + mlp_sq at every block (`post_norm_slope` 0).
XIONG = {"pre_inc": 1.0, "attn_sq": 0.5, "mlp_sq": 0.5, "pre_power": 1.0,
         "post_norm_slope": 0.0, "pre_mech": 0.0, "post_slope": 0.0,
         "post_trend": 1.0, "pre_trend": 0.0}
# Curse of Depth: a trained Pre-LN stream grows faster than at init (log growth over the model).
TRAINED = {"pre_growth": 0.5, "post_growth": 0.0}
ADMIN = {"post": "n", "pre": "log", "admin": "log", "admin_o1": "const"}
# Admin's laws of the output change against n (and of the sum of branch over input energies,
# `<placement>_mech`); each is 0 at n = 0, so a sublayer i adds law(i) - law(i - 1) to the sum.
LAWS = {"n": float, "log": lambda n: math.log(n) if n > 0 else 0.0,
        "const": lambda n: 1.0 if n > 0 else 0.0, "sqrt": math.sqrt,
        "n1.5": lambda n: float(n) ** 1.5}
DEEPNET = {"post": 1.0, "deepnorm": 0.05, "pre": 0.1, "post_depth": 1.0, "deepnorm_depth": 0.0}
# C7's linear regime: a first update of size * (L / 24)^slope * lr * (1 + lr / nonlinear_lr), so
# per unit lr it departs from linear by lr / nonlinear_lr: with 5e-4, 10% at lr 5e-5 (outside
# the 5% tolerance) and 1% at 5e-6, the lr the world is read at.
NONLINEAR_LR = 5e-4
FIG3_DEPTH = 6
# The k-hop world where the sources hold (C14): accuracy per hop count 1..3 by (placement, depth);
# deeper solves more (Sanford et al.), post solves more than pre at each depth (the seed).
KHOP = {("pre", 1): [0.9, 0.4, 0.3], ("post", 1): [0.9, 0.4, 0.3],  # no gap: nothing to merge
        ("pre", 2): [1.0, 0.6, 0.5], ("pre", 3): [1.0, 0.95, 0.65],
        ("post", 2): [1.0, 0.75, 0.6], ("post", 3): [1.0, 1.0, 0.8],
        ("pre", 12): [1.0, 0.6, 0.5], ("pre", 24): [1.0, 0.95, 0.65],
        ("post", 12): [1.0, 0.75, 0.6], ("post", 24): [1.0, 1.0, 0.8]}


class Planted:
    """The ladders' world: per rung key, parameters overriding the source-consistent defaults;
    noise per value."""

    def __init__(self, noise: float = 0.005, **by_rung: dict[str, Any]) -> None:
        self.noise, self.by_rung = noise, by_rung
        self.rng = random.Random(0)

    def param(self, rung: str, key: str, default: Any) -> Any:
        return self.by_rung.get(rung, {}).get(key, default)

    def jitter(self, value: float) -> float:
        return value * math.exp(self.noise * self.rng.gauss(0.0, 1.0))


class FakeStudy:
    """A `StudyContext` (normlab.study.context) serving planted numbers (module doc)."""

    def __init__(self, tmp: Path, noise: float = 0.01, profile: str = "standard", *,
                 world: Planted | None = None, failing_lrs: tuple[float, ...] = (),
                 settings: dict[str, Any] | None = None, seed: int = 0,
                 **numbers: Any) -> None:
        self.out, self.p, self.noise = tmp, numbers, noise
        self.world = world if world is not None else Planted()
        self.failing_lrs = failing_lrs
        self.rng = random.Random(seed)  # another seed: another draw of the same world
        self.late_rng = random.Random(1)  # its own draws: the losses' stay as they were
        self.stable_rng = random.Random(2)  # C9's stable-phase fall: its own draws too
        self._stable: dict[int, float] = {}  # per record: its planted stable-phase fall
        self.khop_rng = random.Random(3)  # C14's plateau falls: their own draws
        self.fig_dir = tmp / "figures"
        self.fig_dir.mkdir(exist_ok=True)
        self.runs_root = tmp / "runs"
        self.device = "cpu"
        self.profile = with_settings(PROFILES[profile], **(settings or {}))
        self.logged: list[str] = []
        self.log = self.logged.append
        self.claims: list[str] | None = None
        self.stalled = tuple(k[len("stalled_"):] for k in numbers if k.startswith("stalled_"))
        self.tuned_calls: list[tuple[str, int]] = []
        self.prefetched: list[Any] = []
        self.deep_asked: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.cached_names: list[str] = []
        self._late: dict[int, float] = {}  # per record (by identity): its planted late fall

    def own(self, measurement, *args) -> Any:
        """A claim's own measurement (`StudyContext.own`): this fake's planted one of the same
        name."""
        return getattr(self, measurement.__name__)(*args)

    def cached(self, name: str, compute) -> Any:
        """Computes every time, recording the name in `cached_names`."""
        self.cached_names.append(name)
        return compute()

    def probe_batches(self, seq_len: int | None = None) -> list:
        raise AssertionError("the fake study builds no model: no probe batches")

    def draw(self, key: str, lr: float | None = None) -> float:
        value = self.p.get(f"{key}@{lr:g}", self.p[key]) if lr is not None else self.p[key]
        return value + self.noise * self.rng.gauss(0.0, 1.0)

    # -- training runs -----------------------------------------------------------------------
    def _records(self, family: str, lr: float, warmup: int) -> list[RunRecord]:
        suffix = "_nowarmup" if warmup == 0 else ""
        key = f"val_{family}{suffix}"
        fails = f"fails_{family}{suffix}"
        n_failed = int(self.p.get(f"{fails}@{lr:g}", self.p.get(fails, 0)))
        outcomes = self.world.param("runs", "outcomes", ["stalled"] * SEEDS)
        out = []
        for s in range(SEEDS):
            stalled = family in self.stalled
            # drawn even for a diverged seed: the others keep theirs
            v = self.draw(key, lr) if key in self.p else 2.5
            late = self.p.get(f"late_{family}", 0.0) + 0.001 * self.late_rng.gauss(0.0, 1.0)
            diverged = s < n_failed
            failed = diverged or stalled or lr in self.failing_lrs
            outcome = ("diverged" if diverged else "stalled" if stalled else
                       outcomes[s] if lr in self.failing_lrs else "completed")
            score = math.log(256) if diverged else 3.3 if stalled else v
            out.append(RunRecord(f"{key}-{lr:g}-{s}", s, outcome, score, failed,
                                 val_loss=None if diverged else score, lr=lr, warmup=warmup,
                                 step=None))
            self._late[id(out[-1])] = math.nan if failed else late
            stable = self.p.get(f"stable_{family}", 0.0) + 0.001 * self.stable_rng.gauss(0.0,
                                                                                       1.0)
            self._stable[id(out[-1])] = math.nan if failed else stable
        return out

    def tuned(self, family: str, warmup: int | None = None, blocks: int | None = None
              ) -> TunedGrid:
        w = self.profile.warmup if warmup is None else warmup
        self.tuned_calls.append((family, w))
        recs = {lr: tuple(self._records(family, lr, w)) for lr in LRS}
        # as the study's: a cell where a seed failed is no optimum unless every cell failed
        trained = [lr for lr in LRS if not any(r.failed for r in recs[lr])]
        best = self.p.get(f"best_lr_{family}" + ("_nowarmup" if w == 0 else "")) or min(
            trained or LRS, key=lambda lr: sum(r.score for r in recs[lr]))
        all_failed = not trained and all(r.failed for rs in recs.values() for r in rs)
        return TunedGrid(family, w, LRS, recs, best,
                         f"unbracketed_{family}" not in self.p and not all_failed)

    def runs(self, family: str, lrs: list[float], warmup: int, blocks: int | None = None
             ) -> dict[float, list[RunRecord]]:
        self.requests.append({"kind": "runs", "family": family, "lrs": list(lrs),
                              "warmup": warmup})
        return {lr: self._records(family, lr, warmup) for lr in lrs}

    def late_improvement(self, records, frac: float = 0.25, end: int | None = None,
                         steps: int | None = None) -> list[float]:
        self.requests.append({"kind": "late", "frac": frac, "end": end, "steps": steps})
        table = self._late if end is None else self._stable
        return [table.get(id(r), math.nan) for r in records]

    def prefetch(self, specs: list) -> None:
        self.prefetched.append(specs)

    def prefetch_deep(self) -> None:
        self.prefetched.append("deep")

    def deep_grid(self, placement: str) -> TunedGrid | None:
        self.deep_asked.append(placement)
        if "fn12" not in self.p:
            return None
        seeds = int(self.p.get("deep_seeds", SEEDS))
        recs = tuple(RunRecord(f"deep-{s}", s, "completed", 2.5, False, val_loss=2.5)
                     for s in range(seeds))
        return TunedGrid(placement, self.profile.warmup, (2e-3,), {2e-3: recs}, 2e-3, True)

    def final_norm_measures(self, records) -> list[dict[str, float]]:
        """`fn<blocks>` the cost of dropping the final norm; the raw final stream's RMS
        `rms<blocks>` trained and `rms<blocks>_init` at init (default 1: no growth)."""
        blocks = 12 if records and records[0].run_id.startswith("deep") else 6
        return [{"cost": self.draw(f"fn{blocks}"),
                 # planted without noise: a draw here would move every later draw
                 "stream_rms": self.p.get(f"rms{blocks}", 1.0),
                 "stream_rms_init": self.p.get(f"rms{blocks}_init", 1.0)} for _ in records]

    # -- the k-hop task (C14) ------------------------------------------------------------------
    def khop_tuned(self, placement: str, blocks: int) -> TunedGrid:
        self.requests.append({"kind": "khop", "placement": placement, "blocks": blocks})
        stalled = f"stalled_khop_{placement}" in self.p
        recs = tuple(RunRecord(f"khop-{placement}-{blocks}-{s}", s,
                               "stalled" if stalled else "completed", 1.0 if stalled else 0.3,
                               stalled, val_loss=1.0 if stalled else 0.3) for s in range(SEEDS))
        for r in recs:
            fall = self.p.get(f"stable_khop_{placement}", 0.0) + 0.001 * self.khop_rng.gauss(
                0.0, 1.0)
            self._stable[id(r)] = math.nan if stalled else fall
        warmup = c14_khop_depth.CLAIM.settings(self.profile).khop_warmup
        return TunedGrid(f"khop {placement}", warmup, (3e-3,), {3e-3: recs}, 3e-3, True)

    def khop_calibration(self) -> dict[int, list[RunRecord]]:
        self.requests.append({"kind": "khop calibration"})
        return {d: [RunRecord(f"khopcal-pre-{d}-{s}", s, "completed", 0.3, False, val_loss=0.3)
                    for s in range(SEEDS)] for d in range(2, 7)}

    def khop_accuracy(self, records, hops=None) -> list[dict[int, float]]:
        """Per run, `khop_<placement>@<blocks>` (one accuracy per hop count) plus noise, capped
        at 1; unplanted: KHOP's world. Calibration runs: `khopcal@<blocks>`."""
        from normlab.study.khop_source import WIDTH, load_table

        out = []
        for r in records:
            kind, pl, blocks, _seed = r.run_id.split("-")
            if kind == "khopcal":
                source = load_table().errors[WIDTH][int(blocks)][1:]
                base = self.p.get(f"khopcal@{blocks}", [1.0 - e for e in source])
            else:
                base = self.p.get(f"khop_{pl}@{blocks}",
                                  KHOP.get((pl, int(blocks)), [0.5, 0.4, 0.3]))
            out.append({k + 1: a if math.isnan(a) else  # nan: not measured
                        min(1.0, a + self.noise * self.rng.gauss(0.0, 1.0))
                        for k, a in enumerate(base)})
        return out

    # -- matched-loss probes -----------------------------------------------------------------
    def _pair(self) -> MatchedPair:
        deep = self.profile.deep_blocks if self.profile.probe_deep else None
        return MatchedPair(True, tolerance=0.05, pre_lr=2e-3, post_lr=2e-3, pre_val_loss=2.2,
                           post_val_loss=2.21, gap=-0.01,
                           runs={pl: tuple(f"{pl}-{s}" for s in range(SEEDS))
                                 for pl in ("pre", "post")}, blocks=deep)

    def _norm(self, pl: str, trained: bool) -> list[float]:
        """The stream's per-block norm: at init the Pre-LN stream's sqrt(d (1 + l)); trained,
        that times exp(growth l / (L - 1)) (planted under the world's `trained`)."""
        w, L, d = self.world, self.profile.train_blocks, 64.0
        g = w.param("trained", f"{pl}_growth", TRAINED[f"{pl}_growth"])
        g = g + w.noise * 20 * w.rng.gauss(0.0, 1.0) if trained else 0.0
        return [math.sqrt(d * (1 + (l + 1 if pl == "pre" else 0))) * math.exp(g * l / (L - 1))
                for l in range(L)]

    def _planted(self, key: str, default: float) -> float:
        return self.draw(key) if key in self.p else default

    def trained_probes(self) -> ProbedPair:
        L = self.profile.train_blocks
        seeds: dict[str, tuple[ProbedRun, ...]] = {}
        for pl in ("pre", "post"):
            runs = []
            for s in range(SEEDS):
                slope = self._planted(f"ang_slope_{pl}", math.nan)
                level = self._planted(f"ang_level_{pl}", 0.4)
                ang = [level] * L if math.isnan(slope) else \
                    [0.5] + [level + slope * i / (L - 2) for i in range(L - 1)]
                merge = math.exp(self._planted(f"merge_{pl}", 0.0))
                drop = math.exp(self._planted(f"drop_{pl}", math.log(0.1)))
                gap = self._planted(f"lens_gap_{pl}", 0.0)
                # through a norm without parameters: the trained norm's reading unless planted
                free = self._planted(f"lens_free_gap_{pl}", gap)
                runs.append(ProbedRun(f"{pl}-{s}", {
                    "ang_prev": ang, "merge_kl": [merge] * (L - 1), "drop_kl": [drop] * L,
                    "drop_dloss": [drop] * L, "lens_raw": [3.0 + gap] * L,
                    "lens_normed": [3.0] * L, "lens_free": [3.0 + gap - free] * L,
                    "norm": self._norm(pl, trained=True)},
                    {"effective_depth_kl": 3.0, "n_blocks": L}))
            seeds[pl] = tuple(runs)
        return ProbedPair(self._pair(), seeds)

    def same_lr_probes(self) -> ProbedPair:
        """The same-lr, same-step pair: the world of `trained_probes` drawn again, where a key
        planted as `same_<key>` (e.g. `same_ang_level_post`) takes the place of `<key>`; both
        at one lr. `no_same_lr` planted: no lr where both trained."""
        if "no_same_lr" in self.p:
            return ProbedPair(MatchedPair(False, reason="no lr of both grids where every seed "
                                                        "of pre and of post trained"))
        saved = self.p
        self.p = {**saved, **{k[len("same_"):]: v for k, v in saved.items()
                              if k.startswith("same_")}}
        try:
            probed = self.trained_probes()
        finally:
            self.p = saved
        return ProbedPair(replace(self._pair(), matched=False, gap=-0.2, pre_val_loss=2.2,
                                  post_val_loss=2.4, seed_gaps=(-0.2,) * SEEDS), probed.seeds)

    def init_probes(self) -> ProbedPair:
        """The same runs' models at step 0: the angle and the stream's norm of the world at
        init, and the merge and drop KLs planted as the trained ones are, under their own keys
        `init_merge_<pl>` / `init_drop_<pl>` (logs; the trained defaults where not planted, so
        at init, unless planted, pre and post do not differ)."""
        L = self.profile.train_blocks
        seeds: dict[str, tuple[ProbedRun, ...]] = {}
        for pl in ("pre", "post"):
            runs = []
            for s in range(SEEDS):
                merge = math.exp(self._planted(f"init_merge_{pl}", 0.0))
                drop = math.exp(self._planted(f"init_drop_{pl}", math.log(0.1)))
                runs.append(ProbedRun(f"{pl}-{s}", {
                    "ang_prev": [0.5] + [0.3] * (L - 1), "merge_kl": [merge] * (L - 1),
                    "drop_kl": [drop] * L, "drop_dloss": [drop] * L,
                    "norm": self._norm(pl, trained=False)}, {"n_blocks": L}))
            seeds[pl] = tuple(runs)
        return ProbedPair(self._pair(), seeds)

    def c10_checkpoints(self) -> list:
        return []

    def c12_checkpoints(self) -> list:
        return []

    # -- ladders at init: C1, C4, C5 (Xiong), C8 (Admin), C7 (DeepNet) ----------------------
    def init_ladder(self, name: str, rungs, placements, depths, perturb: bool = False,
                    stats: bool = True) -> dict[str, Any]:
        self.requests.append({"kind": "init", "name": name, "rungs": list(rungs),
                              "placements": list(placements), "depths": list(depths),
                              "perturb": perturb, "stats": stats,
                              "seeds": self.profile.init_seeds})
        if name.startswith("ladder_admin"):
            return self._admin(rungs, placements, depths, perturb, stats)
        # a ladder asked at a seed count other than the profile's (C5's `c5_seeds`) has that
        # many seeds; at the profile's own, LADDER_SEEDS
        own = self.profile.init_seeds == PROFILES[self.profile.name].init_seeds
        return self._xiong(rungs, placements, depths, stats,
                           LADDER_SEEDS if own else self.profile.init_seeds)

    def update_ladder(self, name: str, rungs, depths, steps: int, warmup: int,
                      variants=None, distance: bool = True) -> dict[str, Any]:
        self.requests.append({"kind": "update", "name": name,
                              "rungs": [(r.key, r.fields, lr) for r, lr in rungs],
                              "depths": list(depths), "steps": steps, "warmup": warmup}
                             | ({"variants": list(variants)} if variants is not None else {})
                             | ({} if distance else {"distance": False}))
        if name.startswith("ladder_deepnet_linear"):
            return self._deepnet_linear(rungs, depths, variants)
        return self._deepnet([r.key for r, _ in rungs], depths)

    def depths(self) -> list[int]:
        return sorted(set(self.profile.init_depths) | {FIG3_DEPTH})

    def _pre_stream(self, rung: str, L: int) -> dict[str, list[float]]:
        """Pre-LN's stream and its branches, in units of d. The stream grows by `pre_inc` per
        block on average, as `l^pre_power`, to reach `pre_inc L` at the last block (so the
        power alone changes its shape, not the increment); block l's attention and MLP add
        `attn_sq` and `mlp_sq` times that block's share of the growth (the cross terms vanish,
        Lemma 2's mechanism, when attn_sq + mlp_sq = pre_inc). Each block's stream and each
        model's branches carry their own jitter (one per value, median-preserving)."""
        w = self.world
        ffn_only = rung == "source_a"
        inc = w.param(rung, "pre_inc", 0.5 if ffn_only else XIONG["pre_inc"])
        attn = w.param(rung, "attn_sq", 0.0 if ffn_only else XIONG["attn_sq"])
        mlp = w.param(rung, "mlp_sq", XIONG["mlp_sq"])
        p = w.param(rung, "pre_power", XIONG["pre_power"])
        grown = [inc * L * (l / L) ** p for l in range(L + 1)]
        share = [(b - a) / inc for a, b in zip(grown, grown[1:], strict=False)]
        sq = [1 + w.jitter(g) for g in grown[1:]]
        j = w.jitter(1.0)
        attn_b, mlp_b = [attn * s * j for s in share], [mlp * s * j for s in share]
        attn_in = [1.0, *sq[:-1]]
        return {"sq_norm": sq, "attn_branch_sq": attn_b, "mlp_branch_sq": mlp_b,
                "attn_in_sq": attn_in,
                "mlp_in_sq": [x + a for x, a in zip(attn_in, attn_b, strict=True)]}

    def _stats(self, rung: str, placement: str, L: int) -> dict[str, Any]:
        w, d = self.world, 64.0
        if placement == "pre":
            units = self._pre_stream(rung, L)
            # the mechanism: grad ~ E||x_L||^-1/2-power, times L^(planted departure)
            grad = units["sq_norm"][-1] ** -0.5 * L ** w.param(rung, "pre_mech",
                                                                XIONG["pre_mech"])
            trend = w.param(rung, "pre_trend", XIONG["pre_trend"])
            units["mlp_norm_input_sq"] = [3.0] * L
        else:
            # Post-LN: each sublayer reads the normalized stream (E||z||^2 = d); the FFN norm's
            # input is z + FFN(z), 1 + E||FFN(z)||^2 / d (Lemma 2's 3/2 with Lemma 1's d/2)
            ffn_only = rung == "source_a"
            mlp = w.param(rung, "mlp_sq", XIONG["mlp_sq"])
            grad = L ** w.param(rung, "post_slope", XIONG["post_slope"])
            trend = w.param(rung, "post_trend", XIONG["post_trend"])
            # (one jitter per model for its level and its FFN's energy; a symmetric one per
            # block about the planted tilt, which leaves the mean over blocks unbiased)
            level = w.jitter(w.param(rung, "post_norm_in", 1 + mlp))
            tilt = w.param(rung, "post_norm_slope", XIONG["post_norm_slope"])
            ffn = w.jitter(mlp)
            units = {"sq_norm": [1.0] * L,
                     "mlp_norm_input_sq": [level + tilt * (i / max(1, L - 1) - 0.5)
                                           + level * w.noise * w.rng.gauss(0.0, 1.0)
                                           for i in range(L)],
                     "attn_branch_sq": [0.0 if ffn_only else XIONG["attn_sq"]] * L,
                     "mlp_branch_sq": [ffn] * L,
                     "attn_in_sq": [1.0] * L, "mlp_in_sq": [1.0] * L}
        trend = w.param(rung, f"{placement}_trend@{L}", trend)  # a trend at one depth only
        trend = trend + w.noise * 20 * w.rng.gauss(0.0, 1.0)
        fc = [math.exp(trend * i / max(1, L - 1)) for i in range(L)]
        per_block = {k: [d * v for v in vs] for k, vs in units.items()} | {"fc_out_grad": fc}
        return {"per_block": per_block,
                "summary": {"embed_sq": d, "final_in_sq": per_block["sq_norm"][-1],
                            "last_fc_out_grad": w.jitter(grad), "d_model": 64, "n_blocks": L}}

    def _xiong(self, rungs, placements, depths, stats: bool, seeds: int = LADDER_SEEDS
               ) -> dict[str, Any]:
        return {r.key: {pl: [{"n_blocks": L, "seed": s}
                             | ({"stats": self._stats(r.key, pl, L)} if stats else {})
                             for s in range(seeds) for L in depths]
                        for pl in placements} for r in rungs}

    def _admin_stats(self, law: str, L: int) -> dict[str, Any]:
        """Per sublayer i = 1..2L (attention 2l + 1, MLP 2l + 2), an input stream of i d and a
        branch of i d (F(i) - F(i - 1)): Admin's sum of branch over input energies is F(2L) (one
        jitter per model), F the planted law."""
        d, f, j = 64.0, LAWS[law], self.world.jitter(1.0)

        def branch(i: int) -> float:
            return d * i * (f(i) - f(i - 1)) * j

        return {"per_block": {"attn_in_sq": [d * (2 * l + 1) for l in range(L)],
                              "mlp_in_sq": [d * (2 * l + 2) for l in range(L)],
                              "attn_branch_sq": [branch(2 * l + 1) for l in range(L)],
                              "mlp_branch_sq": [branch(2 * l + 2) for l in range(L)]},
                "summary": {"d_model": 64, "n_blocks": L}}

    def _admin(self, rungs, placements, depths, perturb: bool, stats: bool) -> dict[str, Any]:
        out = {}
        for r in rungs:
            out[r.key] = {}
            for pl in placements:
                f = LAWS[self.world.param(r.key, pl, ADMIN[pl])]
                mech = self.world.param(r.key, f"{pl}_mech", ADMIN[pl])
                out[r.key][pl] = [{"n_blocks": L, "seed": s}
                                  | ({"perturb_change": self.world.jitter(f(2 * L))}
                                     if perturb else {})
                                  | ({"stats": self._admin_stats(mech, L)} if stats else {})
                                  for s in range(LADDER_SEEDS) for L in depths]
        return out

    def _deepnet(self, keys: list[str], depths) -> dict[str, Any]:
        w = self.world
        out = {}
        for key in keys:
            def series(name: str, depth_key: str | None, key=key) -> list[dict[str, Any]]:
                size = w.param(key, name, DEEPNET.get(name, 0.01))
                slope = w.param(key, depth_key, DEEPNET[depth_key]) if depth_key else 0.0
                return [{"n_blocks": L, "seed": s,  # `<name>@L`: a size at one depth only
                         "update": [0.0, w.jitter(w.param(key, f"{name}@{L}", size)
                                                  * (L / 24) ** slope)]}
                        for L in depths for s in range(LADDER_SEEDS)]
            out[key] = {"lr": 1e-3, "series": {
                "post, no warmup": series("post", "post_depth"),
                "post, warmup": series("post_warmup", None),
                "deepnorm, no warmup": series("deepnorm", "deepnorm_depth"),
                "pre, no warmup": series("pre", None)},
                "init_distance": [{"n_blocks": L, "seed": s,
                                   "distance": w.param(key, f"distance@{L}", 10.0)}
                                  for L in depths for s in range(LADDER_SEEDS)]}
        return out

    def _deepnet_linear(self, rungs, depths, variants) -> dict[str, Any]:
        """C7's linear regime (`NONLINEAR_LR`), per rung key (`<key>@<lr>`: the rung `<key>` at
        that lr) from the same planted sizes and depth slopes as `_deepnet`; `<name>_linear` a
        size for the linear regime only, `nonlinear_lr` the rung's own departure scale."""
        w = self.world
        names = {"post, no warmup": ("post", "post_depth"),
                 "deepnorm, no warmup": ("deepnorm", "deepnorm_depth")}
        out = {}
        for rung, lr in rungs:
            key = rung.key.split("@")[0]
            bend = w.param(key, "nonlinear_lr", NONLINEAR_LR)

            def series(name: str, depth_key: str, key=key, lr=lr, bend=bend
                       ) -> list[dict[str, Any]]:
                size = w.param(key, f"{name}_linear", w.param(key, name, DEEPNET[name]))
                slope = w.param(key, f"{depth_key}_linear",
                                w.param(key, depth_key, DEEPNET[depth_key]))
                return [{"n_blocks": L, "seed": s,
                         "update": [0.0, w.jitter(size * (L / 24) ** slope * lr
                                                  * (1 + lr / bend))]}
                        for L in depths for s in range(LADDER_SEEDS)]
            out[rung.key] = {"lr": lr, "series": {label: series(*names[label])
                                                  for label in variants},
                             "init_distance": []}
        return out
