"""The mutation check's list stays true between its runs: every mutant's ``find`` still names
exactly one line of its file and every test it names still exists. ``make mutation-check`` takes
25 minutes and is run by hand; these static checks run in the default suite, so an edit that
moves a mutant's line or renames its test fails here, before the next full check would."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "tools" / "mutation_check.py")
mutation_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation_check)  # type: ignore[union-attr]

MUTANTS = mutation_check.load()


@pytest.mark.parametrize("m", MUTANTS, ids=[m["name"] for m in MUTANTS])
def test_each_mutant_changes_exactly_one_line_of_its_file(m):
    path = ROOT / mutation_check.PACKAGE / m["file"]
    text = path.read_text()
    mutated = mutation_check.mutate(text, m, str(path))  # raises where find is on 0 or 2+ lines
    before, after = text.splitlines(), mutated.splitlines()
    assert len(before) == len(after)
    assert sum(a != b for a, b in zip(before, after)) == 1, m["name"]


def _defined(source: str, name: str) -> bool:
    return re.search(rf"^\s*(async\s+def|def|class)\s+{re.escape(name)}\b", source, re.M) is not None


@pytest.mark.parametrize("m", MUTANTS, ids=[m["name"] for m in MUTANTS])
def test_each_mutant_names_tests_that_exist(m):
    assert m["tests"], f"{m['name']}: no tests"
    for selection in m["tests"]:
        file, *names = selection.split("::")
        path = ROOT / file
        assert path.is_file(), f"{m['name']}: {file} does not exist"
        source = path.read_text()
        for name in names:
            name = name.split("[")[0]  # a parametrized case: its function
            assert _defined(source, name), f"{m['name']}: {selection}: no {name} in {file}"


def test_the_check_refuses_a_find_off_its_line_or_on_two():
    m = {"name": "x", "find": "b = 1", "replace": "b = 2"}
    with pytest.raises(LookupError, match="on 0 lines"):
        mutation_check.mutate("a = 1\n", m, "f.py")
    with pytest.raises(LookupError, match="on 2 lines"):
        mutation_check.mutate("b = 1\nb = 1\n", m, "f.py")
    assert mutation_check.mutate("a = 1\nb = 1\n", m, "f.py") == "a = 1\nb = 2\n"
    assert not _defined("def test_ab():\n", "test_a") and _defined("    def test_a(x):\n", "test_a")
