"""A claim's declarative spec: what the source says, in what setting, and each prediction with
its role, its rule and where each of its numbers comes from, written before any run.

A claim module opens with one `Claim`, read top to bottom like a methods paragraph, then
defines `measure(ctx)`, which computes the values and asks the spec to decide them
(`Claim.predict`). A claim with sizes of its own (its runs, seeds, grids) declares them as a
frozen `Settings` dataclass with a value per profile (`Claim.settings`); the profile
(`normlab.study.profiles.Profile`) keeps only the sizes several claims share. The spec is the
single home of a prediction's words and rule; the registry (`normlab.study.claims`) derives
the claim list, the families each claim trains and the claim table of docs/study.md from the
specs.

Roles (docs/study.md, "How a verdict is decided"):
- `claim`: the statement itself; only these decide the verdict;
- `premise`: must hold for the test to mean anything; a premise that fails or is undecided
  leaves the claim inconclusive (or "not tested at this scale"), never "not supported";
- `diagnostic`: reported with its interval, never decides.

Rule kinds (`normlab.study.verdict`): `direction` (`> t` or `< t`), `band` (a bound tested as a
bound), `order` (a one-sided law of growth: a slope above or below a bound),
`non_inferiority` (no worse than a margin stated before the run), `equivalence` (within +-
margin), `failure_rate` (the share of seeds that diverged or stalled, above or below a rate),
`setting` (a fact of the design or the runs, such as the depth a probe reads, checked exactly
against the source's setting: a premise, never estimated).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from normlab.study import verdict as rules
from normlab.study.profiles import Profile

if TYPE_CHECKING:
    from normlab.study.context import WorkPlan
    from normlab.study.schema import ClaimResult

Role = Literal["claim", "premise", "diagnostic"]
RuleKind = Literal["direction", "band", "order", "non_inferiority", "equivalence",
                   "failure_rate", "setting"]
ROLES: tuple[str, ...] = ("claim", "premise", "diagnostic")
RULE_KINDS: tuple[str, ...] = ("direction", "band", "order", "non_inferiority", "equivalence",
                               "failure_rate", "setting")


@dataclass(frozen=True)
class Rule:
    """How one prediction is decided, with the origin of each of its numbers.

    `expected` is the side (`>` or `<`) of a direction, an order or a failure rate, and the
    side on which "worse" lies for a non-inferiority test; `threshold` its line (a failure
    rate's share); `low`/`high` a band's edges; `margin` a non-inferiority or equivalence
    margin. A number left None is supplied by `measure` on each rung, derived as `derivation`
    says (a rung's own branch variances, the depths measured)."""

    kind: RuleKind
    expected: str | None = None  # ">" or "<"; a setting also ">=" or "<="
    threshold: float | None = None
    low: float | None = None
    high: float | None = None
    margin: float | None = None
    meaningful: float | None = None  # the smallest effect meant (defaults from the rule)
    origin: str = ""  # where the numbers come from: the source's words, or "0, size reported"

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"rule kind {self.kind!r} is not one of {', '.join(RULE_KINDS)}")
        if self.kind in ("direction", "order", "failure_rate", "non_inferiority") and \
                self.expected not in (">", "<"):
            raise ValueError(f"a {self.kind} rule needs expected '>' or '<'")
        if self.kind == "setting" and self.expected not in rules.SETTING_SIDES:
            raise ValueError(f"a setting rule needs expected one of "
                             f"{', '.join(rules.SETTING_SIDES)}")


@dataclass(frozen=True)
class PredictionSpec:
    """One prediction of a claim: its subject (a placement or a comparison; `{}` fields are
    filled by `measure`, e.g. the lr), what is measured, what the source says, its role and
    rule, and how the prediction is derived on each rung."""

    key: str
    quantity: str
    paper: str
    rule: Rule
    role: Role = "claim"
    derivation: str = ""  # off the source's rung: the mechanism, with the rung's own quantities
    scale: bool = False  # a premise about scale: failing it is "not tested at this scale"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.scale and self.role != "premise":
            raise ValueError(f"{self.key}: only a premise can be about scale")


@dataclass(frozen=True)
class Claim:
    """A claim of docs/reference.md as an experiment (module doc)."""

    id: str
    title: str
    statement: str
    source: str
    quote: str  # the source's own sentence
    setting: str  # the setting the source states
    paper: str  # the source's numbers, printed beside ours
    predictions: tuple[PredictionSpec, ...]
    # the (family, with warmup) grids the claim tunes
    # (`normlab.study.experiments.TRAINING_FAMILIES`)
    trains: tuple[tuple[str, bool], ...] = ()
    ladder: str | None = None  # the ladder a theory claim is traced along, or None
    # the smallest setting that could test the claim, said when a scale premise fails
    needs: str = ""
    # the claim's own sizes: a frozen dataclass whose defaults are every profile's unless
    # `per_profile` (profile name -> instance) gives that profile its own
    settings_class: type | None = None
    per_profile: Mapping[str, Any] = field(default_factory=dict, compare=False)
    measure: Callable[[Any], ClaimResult] | None = field(default=None, compare=False)
    # the grids the claim tunes in a profile (default: every grid of `trains`)
    grids: Callable[[Profile], tuple[tuple[str, bool], ...]] | None = field(
        default=None, compare=False)
    # the families the claim reads at the profile's `deep_blocks` (none: no deep model)
    deep_grids: Callable[[Profile], tuple[str, ...]] | None = field(default=None,
                                                                     compare=False)
    # the claim's own runs and work beyond its grids, told to the time estimate
    # (`normlab.study.context.WorkPlan`)
    work: Callable[[WorkPlan], None] | None = field(default=None, compare=False)

    def bind(self, measure: Callable[[Any], ClaimResult], *,
             grids: Callable[[Profile], tuple[tuple[str, bool], ...]] | None = None,
             deep_grids: Callable[[Profile], tuple[str, ...]] | None = None,
             work: Callable[[WorkPlan], None] | None = None) -> Claim:
        """The spec with its experiment (a module defines `measure` after its spec); where its
        settings leave some of `trains` out, the grids it tunes in a profile; the families it
        reads at the deep models' depth; where it trains or computes more than its grids, the `work`
        hook that tells the time estimate."""
        return replace(self, measure=measure, grids=grids, deep_grids=deep_grids, work=work)

    def settings(self, profile: Profile) -> Any:
        """The claim's own settings in `profile`: those a study set on the profile
        (`with_settings`), else the claim's value for that profile, else its defaults; None
        for a claim without settings of its own."""
        if self.settings_class is None:
            return None
        own = profile.claims.get(self.id)
        if own is not None:
            return own
        if profile.name in self.per_profile:
            return self.per_profile[profile.name]
        return self.settings_class()

    def with_settings(self, profile: Profile, **changes: Any) -> Profile:
        """`profile` with this claim's settings changed by `changes`."""
        if self.settings_class is None:
            raise ValueError(f"{self.id} has no settings of its own")
        return replace(profile, claims={**profile.claims,
                                        self.id: replace(self.settings(profile), **changes)})

    def trained(self, profile: Profile) -> tuple[tuple[str, bool], ...]:
        """The `(family, with warmup)` grids the claim tunes in `profile`."""
        return self.grids(profile) if self.grids is not None else self.trains

    def spec(self, key: str) -> PredictionSpec:
        for p in self.predictions:
            if p.key == key:
                return p
        raise KeyError(f"{self.id} declares no prediction {key!r} "
                       f"(declared: {', '.join(p.key for p in self.predictions)})")

    def predict(self, key: str, values: Sequence[float], *, subject: str | None = None,
                threshold: float | None = None, low: float | None = None,
                high: float | None = None, margin: float | None = None,
                meaningful: float | None = None, paper: str | None = None,
                quantity: str | None = None, derivation: str | None = None
                ) -> rules.Prediction:
        """Decide the declared prediction `key` on per-seed `values` (a failure rate: one
        truth value per seed, True where the seed failed); the rule's numbers that the spec
        leaves to the rung (`None`) are given here, with the `derivation` that gave them."""
        s = self.spec(key)
        r = s.rule
        subj, qty = subject or s.key, quantity or s.quantity
        text = paper if paper is not None else s.paper
        kw: dict[str, Any] = {"threshold_source": r.origin}
        role = s.role

        def need(value: float | None, what: str) -> float:
            if value is None:
                raise ValueError(f"{self.id} {key}: a {r.kind} rule needs its {what}")
            return value

        if r.kind == "band":
            lo, hi = (r.low if low is None else low), (r.high if high is None else high)
            if lo is None or hi is None:
                raise ValueError(f"{self.id} {key}: a band needs its edges")
            pred = rules.predict_band(subj, qty, text, values, lo, hi, **kw)
        elif r.kind == "equivalence":
            m = need(r.margin if margin is None else margin, "margin")
            pred = rules.predict_equivalence(subj, qty, text, values, m, **kw)
        elif r.kind == "non_inferiority":
            m = need(r.margin if margin is None else margin, "margin")
            pred = rules.predict_non_inferiority(subj, qty, text, values, m,
                                                 r.expected or ">", **kw)
        elif r.kind == "failure_rate":
            t = need(r.threshold if threshold is None else threshold, "threshold")
            pred = rules.predict_failure_rate(subj, qty, text, [bool(v) for v in values],
                                              r.expected or ">", t, **kw)
        elif r.kind == "setting":
            t = need(r.threshold if threshold is None else threshold, "threshold")
            pred = rules.predict_setting(subj, qty, text, values, r.expected or ">", t,
                                         role=role, **kw)
        elif r.kind == "order":
            t = need(r.threshold if threshold is None else threshold, "threshold")
            pred = rules.predict_order(subj, qty, text, values, r.expected or ">", t, **kw)
        else:
            t = need(r.threshold if threshold is None else threshold, "threshold")
            m = meaningful if meaningful is not None else (
                r.meaningful if r.meaningful is not None else 0.0)
            pred = rules.predict_direction(subj, qty, text, values, r.expected or ">", t, m,
                                           **kw)
        pred.role, pred.scale = role, s.scale
        pred.derivation = s.derivation if derivation is None else derivation
        return rules.zero_width_undecided(pred)
