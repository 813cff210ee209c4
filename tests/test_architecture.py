"""The package's import graph (``docs/architecture.md``): no cycles, and the layers hold.

The layers are read from ``docs/architecture.md`` ("The layers"), the one place they are stated: a
package imports only packages of its own layer or of a layer listed before it.

The graph is built with ``ast`` from every module's imports, at module level and inside
functions (a function-local import hides a cycle from Python, not from this test), plus
``importlib.import_module("divergence....")`` with a literal name. Run this file as a script
to print the graph's cycles and layer violations.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "divergence"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
# modules every layer may use (``divergence`` itself: the version and the lazy public API, which
# imports only loose modules), and the entry point that sits with the commands
LOOSE = {"errors", "extras", "atomic", "tables", "import_noise", "formats", "divergence"}
ENTRY = {"__main__"}

# (importer package, imported package): each must be absent from the graph
FORBIDDEN = [
    ("pairfolder", "training"),
    ("pairfolder", "recipe"),
    ("pairfolder", "tracking"),
    ("pairfolder", "store"),
    ("comparator", "training"),
]
# what metrics/ may import: the standard library, numpy, torch and its own modules
METRICS_MAY_IMPORT = {
    "numpy",
    "torch",
    "concurrent",
    "dataclasses",
    "math",
    "os",
    "re",
    "typing",
    "collections",
    "functools",
    "itertools",
    "threading",
    "__future__",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute, relative resolved, any depth in the file)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name resolves to its longest module prefix)."""
    out = {}
    for name, path in MODULES.items():
        edges = set()
        for imported in imported_names(name, path):
            if not imported.startswith("divergence"):
                continue
            while imported not in MODULES:
                imported = imported.rsplit(".", 1)[0]
            if imported != name:
                edges.add(imported)
        out[name] = edges
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, edges in modules.items():
        for imported in edges:
            if package_of(name) != package_of(imported):
                out.setdefault(package_of(name), set()).add(package_of(imported))
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def module_cycles() -> list[list[str]]:
    """Cycles between modules; a package's ``__init__`` importing its own modules is not one."""
    modules = graph()
    return cycles({n: {m for m in e if not m.startswith(n + ".")} for n, e in modules.items()})


def layers(text: str | None = None) -> list[list[str]]:
    """The ordered layers of ``docs/architecture.md``: ``N. **name**: `pkg`, `pkg` (...)`` lines."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\d+\. \*\*[^*]+\*\*: ([^(\n]*)", section, flags=re.MULTILINE)
    return [re.findall(r"`(\w+)`", row) for row in rows]


def layer_violations(order: list[list[str]] | None = None) -> list[tuple[str, str]]:
    """Package imports that point to a later layer (and packages the list leaves out or repeats)."""
    order = layers() if order is None else order
    rank = {p: i for i, names in enumerate(order) for p in names}
    top = len(order) - 1
    found = []
    for name, edges in graph().items():
        importer = package_of(name)
        if importer in LOOSE:
            continue
        for imported in edges:
            target = package_of(imported)
            if target in LOOSE or target == importer:
                continue
            if rank.get(importer, top if importer in ENTRY else None) is None or target not in rank:
                found.append((name, imported))
            elif rank[target] > rank.get(importer, top if importer in ENTRY else 0):
                found.append((name, imported))
    return sorted(set(found))


def violations() -> list[tuple[str, str]]:
    modules = graph()
    return sorted((n, m) for n, e in modules.items() for m in e if (package_of(n), package_of(m)) in FORBIDDEN)


def test_no_import_cycle_between_modules():
    assert module_cycles() == []


def test_no_import_cycle_between_packages():
    assert cycles(package_graph(graph())) == []


def test_the_contract_and_the_comparator_do_not_import_the_trainer():
    assert violations() == []


def test_the_documented_layers_name_every_package_once():
    order = layers()
    named = [p for names in order for p in names]
    packages = {package_of(m) for m in MODULES} - LOOSE - ENTRY
    assert len(order) >= 5 and len(named) == len(set(named))
    assert set(named) == packages


def test_every_import_follows_the_documented_layer_order():
    assert layer_violations() == []


def test_the_layer_check_sees_an_upward_import():
    """Reversing two layers of the documented order breaks it: the check is not vacuous."""
    order = layers()
    assert layer_violations([order[1], order[0], *order[2:]]) != []


def test_metrics_import_no_lightning_wandb_or_file_code():
    outside = {}
    for name, path in MODULES.items():
        if package_of(name) != "metrics":
            continue
        for imported in imported_names(name, path):
            top = imported.split(".")[0]
            if top != "divergence" and top not in METRICS_MAY_IMPORT:
                outside.setdefault(name, set()).add(imported)
            elif top == "divergence" and package_of(imported) not in ("metrics", "errors"):
                outside.setdefault(name, set()).add(imported)
    assert outside == {}


def test_the_graph_sees_function_local_imports(tmp_path):
    """A cycle hidden in a function is still a cycle: imports inside functions, relative ones and
    ``importlib.import_module`` with a literal name are all edges."""
    module = tmp_path / "example.py"
    module.write_text(
        "import importlib\n"
        "def f():\n    from divergence.training import fit\n"
        "def g():\n    return importlib.import_module('divergence.comparator.follow')\n"
    )
    assert {"divergence.training", "divergence.training.fit", "divergence.comparator.follow"} <= imported_names(
        "divergence.example", module
    )
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


if __name__ == "__main__":
    print("module cycles:", module_cycles())
    print("package cycles:", cycles(package_graph(graph())))
    print("forbidden edges:", violations())
    print("layers:", layers())
    print("layer violations:", layer_violations())
