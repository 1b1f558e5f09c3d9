"""docs/config.md from the config schema: every field of every section of a run config, with its
type, default and meaning (the field's description).

    python scripts/config_docs.py           # rewrite docs/config.md
    python scripts/config_docs.py --check   # exit 1 when docs/config.md is not what this writes

A field without a description is an error here, so that none goes undocumented.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

import doc_writer
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from normlab.config import RunConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
_BOUNDS = ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<"),
           (MinLen, "min_length", "length >="), (MaxLen, "max_length", "length <="))

HEADER = """# Run config reference

<!-- Written by `python scripts/config_docs.py` from the schema in normlab/config.py; edit the
field descriptions there, then rerun it (tests/test_config_docs.py checks the two agree). -->

A run config is a YAML file with up to three sections, `model`, `data` and `train`; every field is
optional and takes the default below. Set any of them on the command line with
`--set SECTION.FIELD=VALUE` (values are read as YAML: `--set train.tags=[a,b]`); a field without
its section (`--set d_ff=256`) is refused, naming it with its section (`model.d_ff`). `normlab
plan` and `normlab probe`, which build a model and train nothing, take its fields as `FIELD=VALUE`
or `model.FIELD=VALUE` alike. An unknown field or a value outside the allowed ones is refused with
the field's name and a "did you mean". The run's folder is named by a hash of the resolved config,
except the fields marked *not hashed* (they change how or under what label a run is computed, not
what). Defaults a placement decides (`init`, `final_norm`, the DeepNorm and Admin constants, ...)
are shown resolved by `normlab plan`, `normlab runs` and the report. Examples:
[examples/](../examples).
"""


def type_text(annotation: Any) -> str:
    """`int`, `float or null`, `one of: a, b`, `list of str`, ..."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in typing.get_args(annotation))
    if origin is tuple:
        return f"list of {type_text(typing.get_args(annotation)[0])}"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def bounds_text(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for cls, attr, sign in _BOUNDS:
            if isinstance(meta, cls):
                parts.append(f"{sign} {getattr(meta, attr):g}")
    return ", ".join(parts)


def value_text(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_doc(name: str, cls: type[BaseModel], unhashed: set[str]) -> list[str]:
    doc = " ".join((cls.__doc__ or "").split())
    lines = [f"## `{name}`", "", doc, "", "| field | type | default | meaning |",
             "|---|---|---|---|"]
    for field_name, field in cls.model_fields.items():
        if not field.description:
            raise ValueError(f"{cls.__name__}.{field_name} has no description; give it one "
                             "(Field(..., description=...))")
        kind = type_text(field.annotation)
        bounds = bounds_text(field)
        meaning = field.description + (" (*not hashed*)" if field_name in unhashed else "")
        lines.append(f"| `{field_name}` | {_cell(kind + (f', {bounds}' if bounds else ''))} | "
                     f"{_cell(value_text(field.default))} | {_cell(meaning)} |")
    return [*lines, ""]


def render() -> str:
    from normlab.config import DATA_TASK_FIELDS, EXECUTION_OPTIONS, HASHED_WHEN_SET, LABELS

    out = [HEADER]
    for name, field in RunConfig.model_fields.items():
        cls = field.annotation
        assert isinstance(cls, type) and issubclass(cls, BaseModel)
        unhashed = set(EXECUTION_OPTIONS + LABELS) if name == "train" else set()
        out += section_doc(name, cls, unhashed)
    note = ", ".join(f"`{k}`" for k in HASHED_WHEN_SET)
    task = ", ".join(f"`{k}`" for k in DATA_TASK_FIELDS)
    out.append(f"Fields added after run ids were first issued ({note}) count in the hash only "
               "when set away from their default, so older runs keep their folders. The fields "
               f"of a synthetic task ({task}; [data.md](data.md)) count only in the hash of a "
               "run that sets `data.task`.\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    return doc_writer.main(argv, prog="python scripts/config_docs.py",
                           description="write docs/config.md from the config schema",
                           default=DOC, render=lambda _current: render())


if __name__ == "__main__":
    sys.exit(main())
