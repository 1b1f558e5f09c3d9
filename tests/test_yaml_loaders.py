"""normlab reads YAML with libyaml's parser where PyYAML has it, and falls back to the
pure-Python one for a document that does not read (its errors are the ones put in plain words):
both must read every document alike, with normlab's two changes (`1e-3` a float, a key given
twice refused). It writes YAML with libyaml's emitter, the same text as the pure-Python one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from normlab.config import load_run_config
from normlab.userinput import (
    ConfigError,
    YamlLoader,
    _FastYamlLoader,
    parse_yaml_text,
    write_yaml,
)

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted(p for p in (REPO / "examples").rglob("*.yaml"))


def test_libyaml_is_used_where_pyyaml_has_it():
    assert issubclass(_FastYamlLoader, yaml.CSafeLoader) == yaml.__with_libyaml__


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_both_loaders_read_the_examples_alike(path):
    text = path.read_text()
    assert yaml.load(text, Loader=_FastYamlLoader) == yaml.load(text, Loader=YamlLoader)  # noqa: S506


def test_both_loaders_read_a_run_config_alike():
    text = load_run_config(None, ["train.lr=1e-3", "train.tags=[a, b]"]).to_yaml()
    fast = yaml.load(text, Loader=_FastYamlLoader)  # noqa: S506
    assert fast == yaml.load(text, Loader=YamlLoader)  # noqa: S506
    assert fast["train"]["lr"] == 1e-3


@pytest.mark.parametrize("loader", [YamlLoader, _FastYamlLoader])
def test_each_loader_reads_1e_minus_3_as_a_float_and_refuses_a_key_given_twice(loader):
    assert yaml.load("lr: 1e-3\nn: 5e2\ns: e5\n", Loader=loader) == {  # noqa: S506
        "lr": 1e-3, "n": 500.0, "s": "e5"}
    with pytest.raises(yaml.constructor.ConstructorError, match="given twice"):
        yaml.load("a: 1\nb: 2\na: 3\n", Loader=loader)  # noqa: S506


def test_errors_come_in_plain_words():
    with pytest.raises(ConfigError, match=r"line 1, column 4: a list opened with '\[' here"):
        parse_yaml_text("a: [1, 2\n", "x.yaml")
    with pytest.raises(ConfigError, match="a tab character"):
        parse_yaml_text("a:\n\tb: 1\n", "x.yaml")
    with pytest.raises(ConfigError, match="given twice"):
        parse_yaml_text("a: 1\na: 2\n", "x.yaml")


def test_written_yaml_is_the_pure_python_emitters_text():
    cfg = load_run_config(None, ["train.lr=1e-3", "train.tags=[a, b]", "model.placement=deepnorm",
                                 "train.name=résumé run"])
    meta = {"meta": {"torch": "2.13.0+cpu", "device": "cpu", "params": 12345, "nan": None,
                     "constants": {"alpha": 0.1234567890123, "beta": [1e-3, 2.5e10]}}}
    for data in (cfg.to_dict(), meta):
        assert write_yaml(data) == yaml.safe_dump(data, sort_keys=False)
    assert cfg.to_yaml() == yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    assert load_run_config_text(cfg.to_yaml()) == cfg.to_dict()


def load_run_config_text(text: str) -> dict:
    return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)
