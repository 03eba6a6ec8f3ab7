"""The library's layout: no import circles, no module past ~700 lines, a docstring atop each.

Every `import` counts, those inside functions too (a lazy import only hides
a circle until the function runs).
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "capsnet_tf"
MAX_LINES = 700


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path):
    """The `capsnet_tf` modules (and their packages) that the file at `path` imports."""
    importer = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a.b import c` imports module a.b.c when c is one, else a.b.
            names = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name not in MODULES:
                continue
            found.add(name)
            # Importing a.b.c runs package a.b's __init__ first; from inside
            # a.b that is the package importing itself, no circle.
            parent = name.rpartition(".")[0]
            while parent and not importer.startswith(parent + ".") and importer != parent:
                found.add(parent)
                parent = parent.rpartition(".")[0]
    return found


def find_cycle(graph):
    """One import circle of `graph` as a list of modules, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for other in sorted(graph[node]):
            if state.get(other) == "open":
                return stack[stack.index(other):] + [other]
            if other not in state:
                cycle = visit(other, stack)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_cycle_finder_finds_a_planted_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_module_of_the_library_imports_another_in_a_circle():
    # A package's __init__ importing its own submodules is how packages work;
    # a submodule importing its package's __init__ back would close a circle.
    graph = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_short_and_says_what_lives_there(name):
    path = MODULES[name]
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_LINES, f"{path} has over {MAX_LINES} lines"
    assert ast.get_docstring(ast.parse(source)), f"{path} opens with no docstring"
