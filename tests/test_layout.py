"""The library's shape: no import loops, no entry point of its callers started by name, files of one job."""

import ast
import re

from conftest import REPO

LIBRARY = sorted((REPO / "infopro").glob("*.py"))
MAX_LINES = 400  # a longer file says in its docstring why it is one file


def imported_modules(path) -> set[str]:
    """The infopro modules `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "infopro":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("infopro."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("infopro.")}
    return found


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module -> modules it imports), or [] when there is none."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other, path + [other])):
                return found
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return []


def test_the_cycle_finder_finds_a_loop_hidden_in_a_function():
    assert cycle({"plots": {"tables"}, "tables": {"style"}, "style": set()}) == []
    assert cycle({"plots": {"tables"}, "tables": {"plots"}}) == ["plots", "tables", "plots"]


def test_no_library_module_imports_itself_back_through_others():
    graph = {path.stem: imported_modules(path) - {path.stem} for path in LIBRARY}
    assert cycle(graph) == []


def test_the_library_never_starts_a_callers_entry_point():
    """Workers run a library main (`python -m infopro.<module>`): arrows point from the edge inward."""
    starting = [path.name for path in LIBRARY
                if re.search(r"""["']-m["'],\s*["'](experiments|analysis)\.""", path.read_text())]
    assert starting == []


def test_every_library_file_has_one_job_of_a_readable_size():
    long = {path.name: n for path in LIBRARY if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
