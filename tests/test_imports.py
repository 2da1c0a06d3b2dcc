"""The package's import structure: no circle, data/ below training/, small data/ modules; and
no test module imports another.

The graph is read from the source with ``ast`` (every ``import`` / ``from ... import``, also
those inside functions, which a circle hides behind), not by importing anything. Imports under
``if TYPE_CHECKING:`` are left out: they name a type for the reader and load nothing (the
controller's reporting and checkpoint modules annotate the controller that imports them).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parents[1] / "slipstream_rec"
TESTS = Path(__file__).resolve().parent
# data/ is the ground floor for these: none of them may be imported from data/.
ABOVE_DATA = ("training", "slipstream", "model", "sharding")
MAX_DATA_LINES = 500
# The package's floors, bottom up: a module imports only from its own floor's package or from
# the floors below it, transitively (what a module imports, and so on, stays below it). Each
# top-level module or package of slipstream_rec/ is on exactly one floor.
LAYERS = [
    ("validation", "interrupt", "cli_errors", "metrics", "distributed", "run_lock", "timing", "config_keys"),
    ("data", "checkpoint", "optim", "step_probe"),
    ("model", "sharding"),
    ("slipstream",),
    ("training",),
    ("config",),
    ("preflight", "resume_rules", "job", "launcher", "train", "data_cli", "report", "self_check"),
]  # fmt: skip
# The one floor whose packages may import each other: the entry points and the report.
TOP = LAYERS[-1]
# The method's own package holds nothing longer than this (issue 28).
MAX_SLIPSTREAM_LINES = 400


def _modules() -> Dict[str, Tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _runtime_nodes(tree: ast.AST) -> List[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None)
            if isinstance(child, ast.If) and isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def _imports() -> Tuple[Dict[str, Set[str]], List[Tuple[str, str, str]]]:
    """(module -> package modules it imports, [(importer, module, private name)])."""
    mods = _modules()
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    private = []
    for mod, (f, is_pkg) in mods.items():
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in _runtime_nodes(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                edges[mod].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    if f"{base}.{a.name}" in mods:  # a submodule
                        edges[mod].add(f"{base}.{a.name}")
                    elif base in mods:
                        edges[mod].add(base)
                        if a.name.startswith("_"):
                            private.append((mod, base, a.name))
    return edges, private


def _circles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_circle_finder_finds_a_circle() -> None:
    """The finder itself, on a hand-made graph: a -> b -> c -> a is one circle, d hangs off it."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package() -> None:
    edges, _ = _imports()
    assert _circles(edges) == []


def _floor(module: str) -> int:
    top = module.split(".")[1] if "." in module else module
    return next(i for i, floor in enumerate(LAYERS) if top in floor)


def _reachable(edges: Dict[str, Set[str]], start: str) -> Set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in edges[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_module_is_on_a_floor() -> None:
    edges, _ = _imports()
    named = [m for floor in LAYERS for m in floor]
    assert len(named) == len(set(named)), "a package on two floors"
    tops = {m.split(".")[1] for m in edges if m.count(".") >= 1}
    assert sorted(tops - set(named)) == []


def test_no_import_reaches_a_floor_above_transitively() -> None:
    """What each module loads, with what those load in turn, stays on its floor or below; on
    a floor below the top, within its own package."""
    edges, _ = _imports()
    up = []
    for module in (m for m in edges if "." in m):  # the root package's __init__ imports nothing
        own = module.split(".")[1]
        for target in _reachable(edges, module):
            other = target.split(".")[1]
            if _floor(target) > _floor(module) or (
                _floor(target) == _floor(module) and other != own and own not in TOP
            ):
                up.append((module, target))
    assert sorted(up) == []


def test_the_floor_rule_finds_an_upward_import() -> None:
    """The rule itself, on a hand-made graph: data -> config -> training reaches two floors up."""
    edges = {"slipstream_rec.data.x": {"slipstream_rec.config"}, "slipstream_rec.config": {"slipstream_rec.training.x"},
             "slipstream_rec.training.x": set()}  # fmt: skip
    reached = _reachable(edges, "slipstream_rec.data.x")
    assert reached == {"slipstream_rec.config", "slipstream_rec.training.x"}
    assert all(_floor(t) > _floor("slipstream_rec.data.x") for t in reached)


def test_no_private_name_is_imported_across_packages() -> None:
    _, private = _imports()
    assert [p for p in private if p[0].split(".")[1] != p[1].split(".")[1]] == []


def _longer_than(folder: str, limit: int) -> List[Tuple[str, int]]:
    """(module, lines) of every module under slipstream_rec/<folder> longer than ``limit``."""
    return sorted(
        (str(f.relative_to(PACKAGE)), n) for f in (PACKAGE / folder).rglob("*.py")
        if (n := len(f.read_text().splitlines())) > limit
    )  # fmt: skip


def test_the_method_s_package_has_small_modules() -> None:
    assert _longer_than("slipstream", MAX_SLIPSTREAM_LINES) == []


def test_data_imports_nothing_from_the_layers_above() -> None:
    edges, _ = _imports()
    up = sorted(
        (m, t) for m, targets in edges.items() if m.startswith("slipstream_rec.data.")
        for t in targets if t.split(".")[1] in ABOVE_DATA
    )  # fmt: skip
    assert up == []


def test_data_modules_are_small_and_share_no_private_names() -> None:
    assert _longer_than("data", MAX_DATA_LINES) == []
    _, private = _imports()
    assert [p for p in private if p[0].startswith("slipstream_rec.data.")] == []


def _imported_modules(tree: ast.AST) -> List[str]:
    """Every module an ``import`` or ``from ... import`` in ``tree`` names, with each imported
    name appended as a possible submodule; also those of any string constant that parses as
    Python with an import in it (a script handed to a subprocess)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                script = ast.parse(node.value)
            except SyntaxError:
                continue
            out += _imported_modules(script)
    return out


def _test_modules_importing_test_modules(root: Path) -> List[Tuple[str, str]]:
    """(test file, test module it imports) for every tests/**/test_*.py under ``root``."""
    found = []
    for f in sorted(root.rglob("test_*.py")):
        for mod in _imported_modules(ast.parse(f.read_text())):
            if mod.startswith("tests.") and mod.rsplit(".", 1)[-1].startswith("test_"):
                found.append((str(f.relative_to(root.parent)), mod))
    return found


def test_the_test_import_finder_finds_imports_of_test_modules(tmp_path) -> None:
    """The finder itself, on hand-made files: at module level, in a function, as a submodule,
    and in a subprocess's script; an underscore module's import is fine."""
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "test_a.py").write_text("from tests.sub.test_b import X\nfrom tests._fixtures import Y\n")
    (tests / "sub" / "test_b.py").write_text("def f():\n    from tests.sub import test_c\n")
    (tests / "sub" / "test_c.py").write_text('SCRIPT = """\nimport tests.test_a\n"""\nimport tests.sub._util\n')
    assert _test_modules_importing_test_modules(tests) == [
        ("tests/sub/test_b.py", "tests.sub.test_c"),
        ("tests/sub/test_c.py", "tests.test_a"),
        ("tests/test_a.py", "tests.sub.test_b"),
    ]


def test_no_test_module_imports_another() -> None:
    """What tests share lives in underscore modules (tests/_fixtures.py and the like): importing
    a test module runs it and binds its tests to the importer's. This file's own hand-made
    cases above are strings that import test modules, so it is left out."""
    this = str(Path(__file__).resolve().relative_to(TESTS.parent))
    assert [(f, mod) for f, mod in _test_modules_importing_test_modules(TESTS) if f != this] == []
