"""The package's imports follow the layer order written in docs/design.md and form no cycle.

The order is the markdown list of the section ``## Layer order`` of ``docs/design.md``, bottom
layer first. Each list item (``1. ...`` or ``- ...``) is one layer and starts with the
backticked names of its modules or subpackages, separated by commas; the rest of the line
describes it::

    1. `docnmt_jax.errors`, `docnmt_jax.files` — the error hierarchy, atomic files.
    2. `docnmt_jax.data` — corpora, tokenizer, batches.

A name without the package prefix (`` `data` ``) means the package's module of that name.
Every module belongs to the layer of the longest listed name that is the module itself or a
package holding it (so `` `docnmt_jax.decoding.search` `` may sit below
`` `docnmt_jax.decoding` ``). Every module must belong to a layer (but the package's own
``__init__``, which must import nothing of the package but lazily, inside its ``__getattr__``),
and every listed name must be a module or subpackage.

Imports are read from the source with :mod:`ast`: every ``import`` and ``from ... import``
statement of a module, at module level, inside functions and under ``TYPE_CHECKING`` alike.
``import a.b.c`` depends on ``a.b.c`` (the longest prefix that is a module); ``from a.b
import c`` on the module ``a.b.c`` when there is one, else on ``a.b``; relative imports are
resolved. Parent packages that Python initialises on the way are not counted. A module may
import its own layer and the layers listed before it; a cycle between modules (a strongly
connected component of the import graph) is reported whatever the layers.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from conftest import ROOT

PACKAGE = "docnmt_jax"

#: Cycles that may remain, each as its set of modules; an entry that is no longer a cycle
#: fails the test, so that it is removed as soon as the code is fixed. None today.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()

Graph = dict[str, dict[str, int]]  # module -> {imported module: first line}


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file of ``root/package`` (a package's
    ``__init__.py`` under the package's own name)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package, or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement of ``module`` may load, before resolution."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(modules: Mapping[str, Path], package: str) -> Graph:
    """Every module's imports of other modules of ``package``, with the line of the first."""
    graph: Graph = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _targets(node, module, is_package)
            if isinstance(node, ast.ImportFrom):  # a submodule, else the module it is from
                names = [n if n in modules else names[-1] for n in names[:-1]]
            for name in names:
                if name != package and not name.startswith(package + "."):
                    continue
                target = _resolve(name, modules)
                if target is not None and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def lazy_imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that the package's ``__init__`` imports only inside its
    module-level ``__getattr__`` (loaded on first use of an attribute, never on import:
    ``docnmt_jax.load``)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    names.add(inner.module)
                elif isinstance(inner, ast.Import):
                    names.update(alias.name for alias in inner.names)
    return {n for n in names if n.startswith(package + ".")}


def read_layers(design: Path, package: str) -> list[tuple[str, ...]]:
    """The layers of the ``## Layer order`` section of ``design`` (module docstring), bottom
    first, each as the full dotted names it lists."""
    text = design.read_text(encoding="utf-8")
    section = re.search(r"^## Layer order[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if section is None:
        raise AssertionError(f"{design}: no '## Layer order' section")
    layers = []
    for line in section.group(1).splitlines():
        item = re.match(r"\s*(?:\d+\.|[-*])\s+((?:`[\w.]+`\s*,?\s*)+)", line)
        if item:
            names = re.findall(r"`([\w.]+)`", item.group(1))
            full = [
                n if n == package or n.startswith(package + ".") else f"{package}.{n}"
                for n in names
            ]
            layers.append(tuple(full))
    if not layers:
        raise AssertionError(f"{design}: the '## Layer order' section lists no layer")
    return layers


def layer_index(layers: list[tuple[str, ...]]) -> dict[str, int]:
    """``{listed name: its layer's position, 0 at the bottom}``."""
    return {name: i for i, names in enumerate(layers) for name in names}


def layer_of(module: str, index: Mapping[str, int]) -> int | None:
    """The layer of the longest listed name that is ``module`` or a package holding it."""
    name = module
    while name:
        if name in index:
            return index[name]
        name = name.rpartition(".")[0]
    return None


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative: no recursion limit on deep graphs
        work = [(start, iter(graph.get(start, ())))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in graph:
        if node not in order:
            visit(node)
    return sorted(found)


def _cycle_edges(component: Iterable[str], graph: Graph) -> str:
    members = set(component)
    return "; ".join(
        f"{a}:{graph[a][b]} -> {b}"
        for a in sorted(members)
        for b in sorted(graph[a])
        if b in members
    )


def problems(
    root: Path,
    package: str,
    design: Path,
    known_cycles: frozenset[frozenset[str]] = frozenset(),
) -> list[str]:
    """Every breach of the layer order of ``design`` and every import cycle in
    ``root/package``, one line each (empty: the package is in order). A cycle of
    ``known_cycles`` is not reported; a known cycle that no longer exists is."""
    modules = package_modules(root, package)
    graph = import_graph(modules, package)
    index = layer_index(read_layers(design, package))
    out = [
        f"{design.name}: {name} is no module of the package"
        for name in index
        if name not in modules
    ]
    for module in sorted(modules):
        if module == package:
            lazy = lazy_imports(modules[module], package)
            eager = sorted(set(graph[module]) - lazy)
            if eager:
                out.append(f"{module} (the package's __init__) imports {eager}")
            continue
        mine = layer_of(module, index)
        if mine is None:
            out.append(f"{module} belongs to no layer of {design.name}")
            continue
        for target, line in sorted(graph[module].items()):
            theirs = layer_of(target, index)
            if theirs is not None and theirs > mine:
                out.append(
                    f"{modules[module].relative_to(root)}:{line}: {module} (layer {mine + 1}) "
                    f"imports {target} (layer {theirs + 1}, above it)"
                )
    found = {frozenset(c): c for c in cycles(graph)}
    for component in sorted(set(found) - known_cycles, key=sorted):
        out.append(f"import cycle {found[component]}: {_cycle_edges(component, graph)}")
    for component in sorted(known_cycles - set(found), key=sorted):
        out.append(f"known cycle {sorted(component)} is gone: remove it from KNOWN_CYCLES")
    return out


def test_the_package_follows_the_layer_order_and_has_no_import_cycle():
    root = Path(ROOT)
    found = problems(root, PACKAGE, root / "docs" / "design.md", KNOWN_CYCLES)
    assert not found, "\n".join(found)


def test_the_layer_list_is_parsed_from_the_design_page():
    layers = read_layers(Path(ROOT) / "docs" / "design.md", PACKAGE)
    index = layer_index(layers)
    assert index["docnmt_jax.errors"] == 0
    assert index["docnmt_jax.data"] < index["docnmt_jax.models"] < index["docnmt_jax.training"]
    assert layer_of("docnmt_jax.models.contract", index) == index["docnmt_jax.models"]


def _fake_package(tmp_path: Path) -> Path:
    """A package ``fake`` with layers low < mid < high, a cycle in ``mid`` (one edge inside a
    function, one under TYPE_CHECKING) and an upward import from ``low`` (a relative one)."""
    files = {
        "fake/__init__.py": "",
        "fake/low/__init__.py": "",
        "fake/low/base.py": "def f():\n    from ..high import top  # upward\n    return top\n",
        "fake/mid/__init__.py": "",
        "fake/mid/a.py": "from fake.mid import b\nfrom fake.low import base\n",
        "fake/mid/b.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fake.mid.a\n"
        ),
        "fake/high/__init__.py": "",
        "fake/high/top.py": "TOP = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    design = tmp_path / "design.md"
    design.write_text(
        "# Fake\n\n## Layer order\n\nBottom first:\n\n"
        "1. `low` — the bottom.\n2. `fake.mid` — the middle.\n3. `high` — the top.\n\n"
        "## Another section\n\n1. `nothing` — not a layer.\n",
        encoding="utf-8",
    )
    return design


def test_the_checker_reports_a_cycle_and_an_upward_import(tmp_path):
    design = _fake_package(tmp_path)
    found = problems(tmp_path, "fake", design)
    assert len(found) == 2, found
    upward, cycle = found
    assert upward.startswith("fake/low/base.py:2: fake.low.base (layer 1) imports fake.high.top")
    assert cycle.startswith("import cycle ['fake.mid.a', 'fake.mid.b']")
    # A listed cycle is tolerated; one listed but absent is reported.
    known = frozenset({frozenset({"fake.mid.a", "fake.mid.b"}), frozenset({"fake.x", "fake.y"})})
    found = problems(tmp_path, "fake", design, known)
    assert found[1:] == ["known cycle ['fake.x', 'fake.y'] is gone: remove it from KNOWN_CYCLES"]


def test_the_checker_reports_unplaced_modules_and_unknown_names(tmp_path):
    design = _fake_package(tmp_path)
    text = design.read_text(encoding="utf-8").replace("3. `high` — the top.", "3. `hihg` — typo.")
    design.write_text(text, encoding="utf-8")
    found = problems(tmp_path, "fake", design)
    assert "design.md: fake.hihg is no module of the package" in found
    assert "fake.high belongs to no layer of design.md" in found
    assert "fake.high.top belongs to no layer of design.md" in found
