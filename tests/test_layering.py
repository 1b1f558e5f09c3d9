"""The layers of normlab/ (docs/design.md, "Layers"), read from the source with `ast`: every import
statement of every module, at the top of a file or inside a function, and every
`importlib.import_module` of a name written out.

- only `normlab/cli/` imports Typer;
- no module imports from a layer above its own, in the order of LAYERS;
- `normlab/` itself holds at most MAX_TOP_MODULES modules besides `__init__.py` and `__main__.py`
  (the config layer); everything else lives in a package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "normlab"

# Bottom to top. "config" is the top-level modules of normlab/ (config.py, placements.py,
# userinput.py, warnings.py and the package's own __init__.py); every other layer is a package.
LAYERS = ("data", "config", "nn", "train", "finetune", "sweep", "probe", "interop", "study",
          "report", "cli")
CONFIG = "config"
MAX_TOP_MODULES = 4
# `python -m normlab` is the command line: normlab/__main__.py only calls normlab.cli.main.
ENTRY_POINTS = {"__main__.py": "cli"}


def layer_of_file(path: Path, root: Path = ROOT) -> str:
    """The layer of a module file of `root` (normlab/)."""
    rel = path.relative_to(root)
    if len(rel.parts) == 1:
        return ENTRY_POINTS.get(rel.name, CONFIG)
    return rel.parts[0]


def layer_of_module(name: str, root: Path = ROOT) -> str | None:
    """The layer of `normlab.<...>` (None for a module outside normlab). A name imported from
    the package itself (`from normlab import placements`) is looked up among its files."""
    parts = name.split(".")
    if parts[0] != "normlab":
        return None
    if len(parts) == 1 or not (root / parts[1]).is_dir():
        return CONFIG  # normlab/__init__.py or a top-level module
    return parts[1]


def package_of(path: Path, root: Path = ROOT) -> str:
    """The dotted package a module file belongs to (for relative imports)."""
    rel = path.relative_to(root.parent).with_suffix("")
    parts = rel.parts if rel.name == "__init__" else rel.parts[:-1]
    return ".".join(p for p in parts if p != "__init__")


def imported_modules(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) for each module `path` imports, anywhere in the file. `from A import b`
    yields `A.b` when A is normlab itself (b may be a module of it), else `A`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(path, root).split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "normlab":
                for alias in node.names:
                    yield node.lineno, f"normlab.{alias.name}"
            else:
                yield node.lineno, module
        elif (isinstance(node, ast.Call) and node.args
              and _called_name(node.func) in ("import_module", "importlib.import_module")):
            name = _literal_prefix(node.args[0])
            if name:
                yield node.lineno, name


def _called_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return ""


def _literal_prefix(arg: ast.expr) -> str:
    """The module a call imports, as far as the source spells it: a string, or the leading text
    of an f-string up to its last dot (`f"normlab.sweep.{m}"` -> `normlab.sweep`)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
            and isinstance(arg.values[0].value, str)):
        return arg.values[0].value.rpartition(".")[0]
    return ""


def modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def climbing_imports(files: list[Path], root: Path = ROOT) -> list[str]:
    """Each import of `files` that reaches a layer above its module's, as `file:line: ...`."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    found = []
    for path in files:
        own = layer_of_file(path, root)
        for line, module in imported_modules(path, root):
            target = layer_of_module(module, root)
            if target is not None and rank[target] > rank[own]:
                found.append(f"{path.relative_to(root.parent)}:{line}: {own} imports {module} "
                             f"({target})")
    return found


def test_the_scan_sees_every_module_and_every_kind_of_import():
    files = modules()
    assert len(files) > 100 and ROOT / "cli" / "app.py" in files
    # the scan finds the imports inside functions, and import_module's, not only the top ones
    found = dict(imported_modules(ROOT / "sweep" / "__init__.py"))
    assert "normlab.sweep" in found.values()
    config = [m for _, m in imported_modules(ROOT / "config.py")]
    assert "normlab.placements" in config


def test_every_package_has_its_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LAYERS) - {CONFIG}, (
        "a package of normlab/ is missing from LAYERS (or LAYERS names one that is gone): "
        "place it in the order, tests/test_layering.py and docs/design.md")
    assert not [p for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"
                and not (p / "__init__.py").exists()], "a folder of normlab/ is not a package"


def test_only_the_command_line_imports_typer():
    found = [f"{path.relative_to(ROOT.parent)}:{line}: {module}"
             for path in modules() if layer_of_file(path) != "cli"
             for line, module in imported_modules(path)
             if module == "typer" or module.startswith("typer.")]
    assert not found, "Typer imported outside normlab/cli/:\n" + "\n".join(found)


def test_no_import_climbs_a_layer():
    found = climbing_imports(modules())
    assert not found, ("imports from a layer above the module's own (order: "
                       + " < ".join(LAYERS) + "):\n" + "\n".join(found))


@pytest.mark.parametrize("source", [
    "from normlab.study.verdict import combine\n",
    "def f():\n    import normlab.report.html\n",
    "def f():\n    from normlab import cli\n",
    "import importlib\nimportlib.import_module('normlab.interop.adapters')\n",
])
def test_a_climbing_import_is_found(tmp_path, source):
    """The same scan over a module of the nn layer that imports from above it."""
    root = tmp_path / "normlab"
    (root / "nn").mkdir(parents=True)
    for name in LAYERS:
        if name != CONFIG:
            (root / name).mkdir(exist_ok=True)
    module = root / "nn" / "bad.py"
    module.write_text(source)
    assert len(climbing_imports([module], root)) == 1
    (root / "nn" / "fine.py").write_text(source.replace("normlab.", "normlab.data.", 1)
                                         .replace("from normlab import cli",
                                                  "from normlab import placements"))
    assert climbing_imports([root / "nn" / "fine.py"], root) == []


def test_normlab_itself_holds_few_modules():
    top = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_MODULES, (
        f"normlab/ holds {len(top)} modules besides __init__.py and __main__.py "
        f"({', '.join(top)}); at most {MAX_TOP_MODULES}: put the new one in the package of its "
        "layer")


def module_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """The normlab modules (dotted, package `__init__`s left out: they gather their package's
    names) each module file imports, anywhere in the file; `from a.b import c` counts as `a.b.c`
    where that is a module."""
    files = {".".join(p.relative_to(root.parent).with_suffix("").parts): p
             for p in sorted(root.rglob("*.py"))
             if "__pycache__" not in p.parts and p.name != "__init__.py"}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        edges[name] = {t for t in targets if t in files and t != name}
    return edges


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle of imports among modules (a module that, through the modules it imports,
    imports itself), as the path around it."""
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt):]
                if frozenset(cycle) not in done:
                    done.add(frozenset(cycle))
                    cycles.append([*cycle, nxt])
            elif len(path) < 12:  # longer cycles than this are not how modules go wrong
                visit(nxt, [*path, nxt])

    for start in sorted(edges):
        visit(start, [start])
    return cycles


def test_no_two_modules_import_each_other():
    """A module that imports one which imports it back (directly or around a few modules) is
    a layering fault even inside one layer: the lower one must not need the higher."""
    cycles = import_cycles(module_imports())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_an_import_cycle_is_found():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(edges) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
