"""Reading what a user writes, with errors that say what is wrong and how to fix it: YAML
files and text (`read_yaml_file`, `parse_yaml_text`: a key given twice is refused, `1e-3` is a
float, a syntax error names its line and column in plain words), `ConfigError` for a setting
that cannot be used, and `did_you_mean` for a mistyped name. The config (`normlab.config`) and
the placement registry (`normlab.placements`) both read through it.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config that cannot be built; the message names each offending field."""


class _NormlabYaml:
    """What normlab's loaders change of the safe loader: `1e-3` (no dot; a string in YAML 1.1)
    reads as a float, as a learning rate written that way means, and a key given twice in one
    mapping is an error (PyYAML would keep the last value silently, so `lr` set twice would hide
    one setting)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = first_seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the safe loader reports it
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (lines "
                    f"{first.start_mark.line + 1} and {key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark)
        return super().construct_mapping(node, deep)


class YamlLoader(_NormlabYaml, yaml.SafeLoader):
    """The safe loader with normlab's changes (`_NormlabYaml`), in pure Python: its error
    messages are the ones `yaml_problem` puts in plain words."""


class _FastYamlLoader(_NormlabYaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The same with libyaml's parser where PyYAML was built with it: a run's config.yaml in
    about a sixth of the pure-Python parser's time (a group of hundreds of runs reads each
    one's at its start)."""


for _loader in (YamlLoader, _FastYamlLoader):
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


def write_yaml(data: Any) -> str:
    """`data` as YAML in the order given, as `yaml.safe_dump(data, sort_keys=False)` writes it,
    with libyaml's emitter where PyYAML was built with it: about a tenth of the pure-Python
    emitter's time (a group of hundreds of runs writes each one's config.yaml at its start)."""
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def read_yaml(text: str) -> Any:
    """The YAML document in `text`, read fast; a document that does not read is read again in
    pure Python, so that the error raised is the one `yaml_problem` knows."""
    try:
        return yaml.load(text, Loader=_FastYamlLoader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml_file(path: Path, what: str = "config file",
                   error: type[ConfigError] = ConfigError) -> Any:
    """The YAML document in a file. `error` (a `ConfigError`) names the file and says why when
    it is missing, a folder, unreadable, not UTF-8 text, or not valid YAML."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path}: not found") from None
    except IsADirectoryError:
        if (path / "config.yaml").is_file():
            raise error(f"{what} {path}: is a run folder, not a config file; give its "
                        f"config.yaml ({path / 'config.yaml'})") from None
        raise error(f"{what} {path}: is a folder; give a YAML file") from None
    except PermissionError:
        raise error(f"{what} {path}: cannot be read (permission denied)") from None
    except UnicodeDecodeError as e:
        raise error(f"{what} {path}: not a text file (byte {e.start} is not UTF-8); give a "
                    "YAML file") from None
    except OSError as e:
        raise error(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    return parse_yaml_text(text, f"{what} {path}", error)


def parse_yaml_text(text: str, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """The YAML document in `text`; `error` starts with `source` and gives the line and column
    of a problem, and what is wrong in plain words (`yaml_problem`)."""
    try:
        return read_yaml(text)
    except yaml.MarkedYAMLError as e:
        mark, problem = yaml_problem(e, text)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise error(f"{source}: not valid YAML: {where}{problem}") from None
    except yaml.YAMLError as e:
        raise error(f"{source}: not valid YAML: {e}") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to read") from None


def _quoted_line(text: str, mark: Any) -> str:
    lines = text.splitlines()
    if mark is None or not 0 <= mark.line < len(lines) or not lines[mark.line].strip():
        return ""
    line = lines[mark.line].rstrip()
    return f" (line {mark.line + 1} reads {line[:60] + ('...' if len(line) > 60 else '')!r})"


def yaml_problem(e: yaml.MarkedYAMLError, text: str = "") -> tuple[Any, str]:
    """Where a YAML error is (the mark to report: where the mistake is, which is often where
    the parser started what it could not finish, not where it gave up) and what is wrong, in
    plain words with the fix; the parser's own words for a problem not recognised here."""
    problem, context = e.problem or "", e.context or ""
    at, start = e.problem_mark, e.context_mark or e.problem_mark
    if "given twice" in problem:  # normlab's own words (YamlLoader)
        return at, problem
    if "could not find expected ':'" in problem:
        return start, ("a key without ':' after it; write `key: value`, with a space after the "
                       "':'" + _quoted_line(text, start))
    if "found character '\\t'" in problem:
        return at, ("a tab character; YAML indents with spaces only, so replace the tab with "
                    "spaces")
    flow = re.match(r"expected ',' or '([\]}])'", problem)
    if flow:
        opened = "[" if flow.group(1) == "]" else "{"
        return start, (f"a {'list' if opened == '[' else 'mapping'} opened with '{opened}' here "
                       f"is not closed: add the '{flow.group(1)}' (or the ',' between two of "
                       f"its items)" + _quoted_line(text, start))
    if "while scanning a quoted scalar" in context:
        return start, ("a quoted string opened here is never closed; add its closing quote"
                       + _quoted_line(text, start))
    if problem.startswith(("expected <block end>", "did not find expected key")):
        return at, ("this line is not indented like the lines of its mapping above it; indent "
                    "the keys of one mapping by the same number of spaces"
                    + _quoted_line(text, at))
    if "did not find expected '-' indicator" in problem:
        return at, ("this line is not indented like the '- ' items of its list above it"
                    + _quoted_line(text, at))
    if "mapping values are not allowed here" in problem:
        return at, ("a ':' where a value was expected: a key goes on a line of its own, and a "
                    "value that holds ': ' must be quoted" + _quoted_line(text, at))
    if "found undefined alias" in problem:
        return at, "an alias (*name) with no anchor (&name) before it; define the anchor first"
    if "unknown escape character" in problem:
        return at, ("an unknown backslash escape in a double-quoted string; use single quotes, "
                    "or write the backslash twice")
    if "could not determine a constructor" in problem:
        return at, (f"{problem.split('for the tag', 1)[-1].strip()} is a tag normlab does not "
                    "read; give plain values (numbers, strings, lists, mappings)")
    found = re.match(r"found character '(.)' that cannot start any token", problem)
    if found:
        return at, (f"a value cannot start with {found.group(1)!r}; put the value in quotes"
                    + _quoted_line(text, at))
    return at, problem + (f" ({context})" if context else "")


# What other libraries call a setting normlab names otherwise (nanoGPT, Hugging Face configs,
# x-transformers): a mistyped name that is one of these is pointed at normlab's field, which
# spelling distance alone would miss (`n_layer` is closer to `n_classes` than to `n_blocks`).
# A name that means two settings (nanoGPT's `block_size`: the model's and the data's context)
# names the one of the section it was given in.
SYNONYMS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("n_layer", "n_layers", "num_layers", "num_hidden_layers", "depth",
                     "layers"), ("n_blocks",)),
    **dict.fromkeys(("n_head", "num_heads", "num_attention_heads", "heads"), ("n_heads",)),
    **dict.fromkeys(("n_embd", "hidden_size", "dim", "width", "d_embed"), ("d_model",)),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_hidden", "n_inner"), ("d_ff",)),
    **dict.fromkeys(("block_size", "n_positions", "max_position_embeddings"),
                     ("max_seq_len", "seq_len")),
    **dict.fromkeys(("learning_rate", "max_lr"), ("lr",)),
    **dict.fromkeys(("max_iters", "max_steps", "iters", "num_steps", "total_steps"), ("steps",)),
    **dict.fromkeys(("warmup_steps", "warmup_iters"), ("warmup",)),
    **dict.fromkeys(("context_length", "seq_length", "context"), ("seq_len", "max_seq_len")),
}


def did_you_mean(word: str, choices: list[str], shown: list[str] | None = None) -> str:
    """`" (did you mean 'placement'?)"` for the choice closest to a mistyped `word` (one that
    starts with it or it starts with, else difflib's closest match), or "" when none is close.
    `shown`: how each choice is named in the message (its full path), when not as matched."""
    meant = [c for c in SYNONYMS.get(word, ()) if c in choices]
    if meant:
        named = dict(zip(choices, shown or choices, strict=True))[meant[0]]
        return f" (did you mean {named!r}?)"
    lowered = word.lower()
    near = [c for c in choices if c != word and (
        c.lower().startswith(lowered) or lowered.startswith(c.lower()))]
    near = sorted(near, key=lambda c: abs(len(c) - len(word)))[:1] or difflib.get_close_matches(
        word, choices, n=1, cutoff=0.6)
    if not (near and word):
        return ""
    named = dict(zip(choices, shown or choices, strict=True))[near[0]]
    return f" (did you mean {named!r}?)"
