"""Sweep specs: a base run config plus axes, expanded into validated `RunConfig`s.

    name: warmup_pre_post              # optional; default: the file name
    base:                              # a run config (model / data / train), or a path to one
      model: {n_blocks: 6, d_model: 64, n_heads: 2, max_seq_len: 64}
      train: {steps: 300}
    axes:                              # expanded as a product, the first axis outermost
      model.placement: [pre, post, mix]
      train.lr: {log: [3e-4, 1e-2], num: 4}     # log-spaced, 3 significant digits
      train.warmup: [0, 50, 200]
      train.seed: {range: [0, 2]}                # 0, 1 (Python's range: stop excluded)
      model.mix_switch: {values: [0.25, 0.5], when: {model.placement: mix}}
    engine: auto                       # optional: auto | stacked | separate (see sweep.grouping)

An axis is a list of values or a mapping with exactly one of `values`, `log: [lo, hi]` + `num`,
`linear: [lo, hi]` + `num`, `range: [start, stop]` or `[start, stop, step]`, and optionally
`when: {path: value or [values]}`: a conditional axis applies only to the runs whose earlier axes
(or base) match every condition; the other runs do not get the axis at all (so they are not
duplicated per value). Every run is validated before anything runs; a bad spec raises one
`SpecError` that lists every problem found, each naming the axis and the value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from normlab.config import (
    ConfigError,
    RunConfig,
    deep_merge,
    did_you_mean,
    load_yaml,
    parse_config,
    parse_yaml_text,
    read_yaml_file,
)

# Defaults a sweep adds under its base (the base wins): runs checkpoint often, so a killed sweep
# loses little.
SWEEP_DEFAULTS: dict[str, Any] = {"train": {"checkpoint_every": 50}}
SPEC_KEYS = ("name", "description", "base", "axes", "engine")
# How a sweep trains runs that share a model shape: as stacked groups (one model, one process),
# one by one, or stacked where it pays (`normlab.sweep.grouping`).
ENGINES = ("auto", "stacked", "separate")
AXIS_KEYS = ("values", "log", "linear", "range", "num", "when")
MAX_REPORTED = 10


class SpecError(ConfigError):
    """A sweep spec that cannot be expanded; the message names the axis and the value."""


@dataclass(frozen=True)
class Axis:
    path: str                     # dotted config path, e.g. "train.lr"
    values: tuple[Any, ...]
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def applies(self, point: dict[str, Any], base: dict[str, Any]) -> bool:
        return all(_value_at(point, base, key) in allowed for key, allowed in self.when.items())


@dataclass(frozen=True)
class PlannedRun:
    index: int
    point: dict[str, Any]         # axis path -> value, only the axes that apply to this run
    config: RunConfig

    @property
    def run_id(self) -> str:
        return self.config.run_id()

    def label(self) -> str:
        return " ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in self.point.items())


@dataclass(frozen=True)
class SweepPlan:
    name: str
    spec: dict[str, Any]          # the spec as loaded, with a base path resolved to its mapping
    axes: tuple[Axis, ...]
    runs: tuple[PlannedRun, ...]
    engine: str = "auto"

    @property
    def axis_paths(self) -> list[str]:
        return [a.path for a in self.axes]

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]


def load_spec(path_or_text: str | Path) -> tuple[dict[str, Any], str]:
    """Read a spec mapping from a file (or a YAML string); returns (spec, default name)."""
    is_text = isinstance(path_or_text, str) and "\n" in path_or_text
    path = None if is_text else Path(path_or_text)
    if path is not None:
        spec, source, name = read_yaml_file(path, "sweep spec", SpecError), str(path), path.stem
    else:
        source, name = "<string>", "sweep"
        spec = parse_yaml_text(str(path_or_text), source, SpecError)
    if not isinstance(spec, dict):
        raise SpecError(f"{source}: expected a mapping with base and axes, got "
                        f"{type(spec).__name__}")
    base = spec.get("base")
    if isinstance(base, str):  # a run config file, relative to the spec
        base_path = Path(base)
        if path is not None and not base_path.is_absolute():
            base_path = path.parent / base_path
        spec = {**spec, "base": load_yaml(base_path)}
    return spec, str(spec.get("name") or name)


def plan_sweep(spec_or_path: dict[str, Any] | str | Path, name: str | None = None) -> SweepPlan:
    """Expand and validate a sweep spec; nothing is written. Every problem is collected (each
    spec key, each axis, each run the sound axes give) and raised as one `SpecError`."""
    if isinstance(spec_or_path, dict):
        spec, default_name = spec_or_path, "sweep"
    else:
        spec, default_name = load_spec(spec_or_path)
    problems = Problems()
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        problems.add(SpecError(f"sweep spec: unknown key(s) {', '.join(map(str, unknown))}; "
                               f"known keys are: {', '.join(SPEC_KEYS)}"))
    base = spec.get("base") or {}
    if not isinstance(base, dict):
        problems.add(SpecError("base: expected a run config mapping (model / data / train) or "
                               "a path"))
        base = {}
    for section, value in list(base.items()):  # an axis's value would replace a section as 5
        if section in RunConfig.model_fields and not isinstance(value, dict):
            problems.add(SpecError(f"base.{section}: expected a mapping of {section} fields, "
                                   f"got {type(value).__name__}"))
            del base[section]
    engine = problems.attempt(check_engine, spec.get("engine", "auto"), "engine")
    base = deep_merge(SWEEP_DEFAULTS, base)
    axes = parse_axes(spec.get("axes") or {}, problems)
    points = expand(axes, base)
    runs = validate_points(points, base, axes, problems)
    return SweepPlan(name=name or str(spec.get("name") or default_name), spec=spec,
                     axes=tuple(axes), runs=tuple(runs), engine=engine)


class Problems:
    """The problems of one spec, in the order found; `raise_all` raises them as one
    `SpecError`. Each check raises `SpecError` for its own problem; `attempt` records it and
    lets the next check run."""

    def __init__(self) -> None:
        self.spec: list[str] = []       # of the spec's keys and axes
        self.runs: dict[str, None] = {}  # of the expanded runs, each message once
        self.bad_runs = 0

    def add(self, error: SpecError) -> None:
        self.spec.append(str(error))

    def attempt(self, check: Any, *args: Any) -> Any:
        try:
            return check(*args)
        except SpecError as e:
            self.add(e)
            return None

    def raise_all(self, n_runs: int, has_axes: bool) -> None:
        if not (self.spec or self.runs):
            return
        shown = list(self.runs)[:MAX_REPORTED]
        lines = [f"  - {p}" for p in [*self.spec, *shown]]
        if len(self.runs) > len(shown):
            lines.append(f"  ... and {len(self.runs) - len(shown)} more")
        runs = (f"{self.bad_runs} of {n_runs} runs are invalid" if has_axes
                else "the base config is invalid")
        if not self.spec:
            head = f"sweep spec: {runs}; nothing was run"
        else:
            n = len(self.spec)
            head = (f"sweep spec: {n} problem{'s' * (n > 1)} in the spec"
                    + (f", and {runs} (of the axes without problems)" if self.runs else "")
                    + "; nothing was run")
        raise SpecError("\n".join([head, *lines]))


def check_engine(engine: Any, what: str) -> str:
    if engine not in ENGINES:
        raise SpecError(f"{what}: {engine!r} is not one of {', '.join(ENGINES)}")
    return engine


# -- axes -------------------------------------------------------------------------------------

def parse_axes(raw: Any, problems: Problems | None = None) -> list[Axis]:
    """The axes of a spec. Problems go to `problems` (the axes that have one are left out);
    without it, they are raised together."""
    if problems is None:
        problems = Problems()
        axes = parse_axes(raw, problems)
        problems.raise_all(0, True)
        return axes
    if not isinstance(raw, dict):
        problems.add(SpecError("axes: expected a mapping of config path -> values, e.g. "
                               "{train.lr: [1e-3, 3e-3]}"))
        return []
    names = [str(a) for a in raw]
    axes: list[Axis] = []
    for path, spec in raw.items():
        before = len(problems.spec)
        axis = problems.attempt(_parse_axis, str(path), spec, names, problems)
        if axis is not None and len(problems.spec) == before:
            axes.append(axis)
    return axes


def _parse_axis(path: str, spec: Any, names: list[str], problems: Problems) -> Axis | None:
    check_path(path, what=f"axis {path}")
    when: dict[str, tuple[Any, ...]] = {}
    if isinstance(spec, dict):
        values, when = _axis_mapping(path, spec)
    elif isinstance(spec, list | tuple):
        values = list(spec)
    else:
        raise SpecError(f"axis {path}: expected a list of values or a mapping (values, log, "
                        f"linear, range), got {spec!r}; put a fixed value in base")
    if not values:
        raise SpecError(f"axis {path}: no values (an empty axis would make an empty sweep)")
    for key in when:
        problems.attempt(_check_condition, path, key, names)
    seen: list[Any] = []
    for v in values:
        if any(v == s and type(v) is type(s) for s in seen):
            problems.add(SpecError(f"axis {path}: value {_fmt(v)} is listed twice"))
        seen.append(v)
    return Axis(path=path, values=tuple(_freeze(v) for v in values), when=when)


def _check_condition(path: str, key: str, names: list[str]) -> None:
    check_path(key, what=f"axis {path}: when")
    if key == path:
        raise SpecError(f"axis {path}: when cannot test the axis itself")
    if key in names[names.index(path) + 1:]:
        raise SpecError(f"axis {path}: when tests {key}, an axis declared after it; "
                        f"declare {key} first")


def _axis_mapping(path: str, spec: dict[str, Any]) -> tuple[list[Any], dict[str, tuple]]:
    unknown = sorted(set(map(str, spec)) - set(AXIS_KEYS))
    if unknown:
        raise SpecError(f"axis {path}: unknown key(s) {', '.join(unknown)}; known keys are: "
                        f"{', '.join(AXIS_KEYS)}")
    kinds = [k for k in ("values", "log", "linear", "range") if k in spec]
    if len(kinds) != 1:
        raise SpecError(f"axis {path}: give exactly one of values, log, linear, range "
                        f"(got {', '.join(kinds) or 'none'})")
    kind = kinds[0]
    if kind in ("values", "range") and "num" in spec:
        raise SpecError(f"axis {path}: num goes with log or linear, not with {kind}")
    if kind == "values":
        values = spec["values"]
        if not isinstance(values, list | tuple):
            raise SpecError(f"axis {path}: values must be a list, got {values!r}")
        values = list(values)
    elif kind == "range":
        values = _range_values(path, spec["range"])
    else:
        values = _spaced_values(path, kind, spec[kind], spec.get("num"))
    when_raw = spec.get("when") or {}
    if not isinstance(when_raw, dict):
        raise SpecError(f"axis {path}: when must map config paths to values, e.g. "
                        "{model.placement: mix}")
    when = {str(k): tuple(v) if isinstance(v, list | tuple) else (v,)
            for k, v in when_raw.items()}
    return values, when


def _number(path: str, x: Any) -> float:
    if isinstance(x, bool):
        raise SpecError(f"axis {path}: {x!r} is not a number")
    try:
        value = float(x)
    except (TypeError, ValueError):
        raise SpecError(f"axis {path}: {x!r} is not a number") from None
    if not math.isfinite(value):
        raise SpecError(f"axis {path}: {x!r} is not a finite number")
    return value


def _spaced_values(path: str, kind: str, ends: Any, num: Any) -> list[Any]:
    if not (isinstance(ends, list | tuple) and len(ends) == 2):
        raise SpecError(f"axis {path}: {kind} takes [low, high], got {ends!r}")
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise SpecError(f"axis {path}: {kind} needs num >= 1 (how many values), got {num!r}")
    lo, hi = (_number(path, x) for x in ends)
    if kind == "log" and (lo <= 0 or hi <= 0):
        raise SpecError(f"axis {path}: log range [{lo:g}, {hi:g}] needs positive ends")
    if num == 1:
        raw = [lo]
    elif kind == "log":
        raw = [math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (num - 1))
               for i in range(num)]
    else:
        raw = [lo + i * (hi - lo) / (num - 1) for i in range(num)]
    if all(isinstance(x, int) and not isinstance(x, bool) for x in ends):
        values: list[Any] = []
        for x in raw:  # integer ends (depths, warmups): integer values, repeats dropped
            if round(x) not in values:
                values.append(round(x))
        return values
    return [float(f"{x:.3g}") for x in raw]


def _range_values(path: str, spec: Any) -> list[int]:
    if not (isinstance(spec, list | tuple) and len(spec) in (2, 3)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in spec)):
        raise SpecError(f"axis {path}: range takes integers [start, stop] or "
                        f"[start, stop, step], got {spec!r}")
    if len(spec) == 3 and spec[2] == 0:
        raise SpecError(f"axis {path}: range step cannot be 0")
    return list(range(*spec))


def check_path(path: str, what: str) -> None:
    """`section.field` must name a field of `RunConfig`."""
    parts = path.split(".")
    cls: type[BaseModel] = RunConfig
    for i, part in enumerate(parts):
        fields = cls.model_fields
        if part not in fields:
            where = ".".join(parts[:i]) or "the run config"
            known = sorted(fields)
            shown = [".".join([*parts[:i], k, *parts[i + 1:]]) for k in known]
            hint = did_you_mean(part, known, shown)
            if not hint and i == 0:  # a field without its section, `lr` for `train.lr`
                dotted = [f"{section}.{name}" for section, field in fields.items()
                          if isinstance(field.annotation, type)
                          and issubclass(field.annotation, BaseModel)
                          for name in field.annotation.model_fields]
                hint = did_you_mean(path, [d.split(".", 1)[1] for d in dotted], dotted)
            raise SpecError(f"{what}: unknown config path {path!r}{hint}; {where} has: "
                            f"{', '.join(known)}")
        sub = fields[part].annotation
        if i < len(parts) - 1:
            if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
                raise SpecError(f"{what}: {'.'.join(parts[:i + 1])} is a value, not a section")
            cls = sub
        elif isinstance(sub, type) and issubclass(sub, BaseModel):
            raise SpecError(f"{what}: {path} is a section; sweep one of its fields, e.g. "
                            f"{path}.{next(iter(sub.model_fields))}")


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


def _value_at(point: dict[str, Any], base: dict[str, Any], path: str) -> Any:
    """A config value as a run will see it: the run's axis value, else base, else the default."""
    if path in point:
        return point[path]
    node: Any = base
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return _freeze(node)
    cls: type[BaseModel] = RunConfig
    *sections, name = path.split(".")
    for part in sections:
        cls = cls.model_fields[part].annotation  # type: ignore[assignment]
    return cls.model_fields[name].default


def expand(axes: list[Axis], base: dict[str, Any]) -> list[dict[str, Any]]:
    """The product of the axes, the first outermost; a conditional axis multiplies only the
    points that match its `when`."""
    points: list[dict[str, Any]] = [{}]
    for axis in axes:
        nxt: list[dict[str, Any]] = []
        for point in points:
            if axis.applies(point, base):
                nxt.extend({**point, axis.path: v} for v in axis.values)
            else:
                nxt.append(point)
        points = nxt
    return points


def nested(point: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in point.items():
        node = out
        *sections, name = path.split(".")
        for part in sections:
            node = node.setdefault(part, {})
        node[name] = list(value) if isinstance(value, tuple) else value
    return out


def validate_points(points: list[dict[str, Any]], base: dict[str, Any], axes: list[Axis],
                    problems: Problems | None = None) -> list[PlannedRun]:
    """Build every run's config; collect every problem (into `problems` when given), then raise
    them all as one `SpecError`."""
    problems = problems if problems is not None else Problems()
    runs: list[PlannedRun] = []
    by_id: dict[str, PlannedRun] = {}
    for i, point in enumerate(points):
        try:
            cfg = parse_config(RunConfig, deep_merge(base, nested(point)))
        except ConfigError as e:
            problems.bad_runs += 1
            problems.runs[_blame(point, base, str(e))] = None
            continue
        run = PlannedRun(index=i, point=point, config=cfg)
        other = by_id.get(run.run_id)
        if other is not None:
            problems.bad_runs += 1
            problems.runs[f"runs {other.label() or '(base)'} and {run.label()} are the same "
                          f"config (run {run.run_id}); drop one of the values"] = None
            continue
        by_id[run.run_id] = run
        runs.append(run)
    problems.raise_all(len(points), bool(axes))
    return runs


_FIELD_RE = re.compile(r"([A-Za-z_][\w.]*):")


def _blame(point: dict[str, Any], base: dict[str, Any], message: str) -> str:
    """Name the axis (and value) a config error comes from, as precisely as the message allows."""
    body = message.split("\n", 1)[-1].strip()
    body = " ".join(line.strip() for line in body.splitlines())
    mentioned = set(_FIELD_RE.findall(message))
    culprits = [p for p in point if p in mentioned or p.split(".")[-1] in mentioned]
    if not culprits:
        try:
            parse_config(RunConfig, base)
        except ConfigError:
            return f"base: {body}"  # wrong whatever the axes say
    if not culprits:  # try each axis value alone on the base
        for path in point:
            try:
                parse_config(RunConfig, deep_merge(base, nested({path: point[path]})))
            except ConfigError:
                culprits.append(path)
    if not culprits:
        culprits = list(point)
    if not culprits:
        return f"base: {body}"
    named = ", ".join(f"axis {p} = {_fmt(point[p])}" for p in culprits)
    others = {k: v for k, v in point.items() if k not in culprits}
    ctx = f" (with {', '.join(f'{k}={_fmt(v)}' for k, v in others.items())})" if others else ""
    return f"{named}{ctx}: {body}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


def format_value(v: Any) -> str:
    """How an axis value is printed in tables and figures."""
    return _fmt(v)


