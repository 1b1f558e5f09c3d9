"""docs/config.md is what `python scripts/config_docs.py` writes from the config schema: every
field of every section, with its type, default and description."""

from __future__ import annotations

import config_docs
import pytest
from pydantic import Field

from normlab.config import DataConfig, ModelConfig, TrainConfig, _Frozen


def test_the_checked_in_reference_matches_the_schema():
    assert config_docs.DOC.read_text(encoding="utf-8") == config_docs.render(), (
        "docs/config.md is out of date: run python scripts/config_docs.py")
    assert config_docs.main(["--check"]) == 0


def test_every_field_is_listed_with_its_default():
    text = config_docs.render()
    for cls in (ModelConfig, DataConfig, TrainConfig):
        for name, field in cls.model_fields.items():
            row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
            assert field.description.split(";")[0] in row
            assert config_docs.value_text(field.default) in row
    assert "| `placement` | one of: `post`, `pre`," in text
    assert "| `lr` | float, > 0 | `0.001` |" in text


def test_a_field_without_a_description_is_refused():
    class Bare(_Frozen):
        """A section."""

        width: int = Field(3, ge=1)

    with pytest.raises(ValueError, match="Bare.width has no description"):
        config_docs.section_doc("bare", Bare, set())


def test_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "config.md"
    stale.write_text(config_docs.render().replace("`0.001`", "`0.002`"))
    assert config_docs.main(["--check", "--out", str(stale)]) == 1
