"""collsim is a house of floors: a module imports only from its own floor or below.

The floor map below is the one place the floors are defined (docs/architecture.md describes each).
A module belongs to the floor of the longest unit that contains it: a package (``collsim.engine``
holds every module under ``collsim/engine/``) or a top-level module. A new module is therefore
classified by its package; a new package or top-level module must be added here.

Imports are read with :mod:`ast` from every file of the package, at module level and inside
functions alike (an import inside a function still needs its target at run time, so it is part of
the layering too), ``if TYPE_CHECKING:`` blocks included.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("collsim", "collsim.units", "collsim.errors", "collsim.io", "collsim.protocols",
              "collsim.metrics", "collsim.tables", "collsim.dtypes", "collsim.channel_rates",
              "collsim.transports", "collsim.nvls")),
    ("topology", ("collsim.topology",)),
    ("collectives", ("collsim.collectives",)),
    ("engine", ("collsim.engine",)),
    ("model", ("collsim.model",)),
    ("whatif", ("collsim.whatif",)),
    ("training and calibration", ("collsim.training", "collsim.calibration")),
    ("sweep", ("collsim.sweep",)),
    ("report", ("collsim.report",)),
    ("cli", ("collsim.cli", "collsim.__main__")),
)  # fmt: skip
"""The floors, bottom up, each with its units (packages and top-level modules)."""

FUNCTION_IMPORT_LIMIT = 10
"""The most imports of collsim modules inside functions outside ``collsim/cli/``: each only to
keep start-up fast (a module that loads a heavy optional library), with a comment saying so."""


@dataclass(frozen=True)
class Import:
    """One imported collsim module: where (file, line), from which module, inside a function?"""

    source: str
    target: str
    path: Path
    line: int
    in_function: bool
    text: str


def modules(root: Path) -> dict[str, Path]:
    """Every module of the ``collsim`` package under ``root``, by dotted name."""
    out = {}
    for path in sorted((root / "collsim").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _walk(node: ast.AST, in_function: bool = False):  # type: ignore[no-untyped-def]
    """Every import statement under ``node``, with whether it sits inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function
        else:
            inside = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _walk(child, in_function or inside)


def imports(root: Path) -> list[Import]:
    """Every import of a collsim module by a collsim module, module level and inside functions."""
    mods = modules(root)
    found = []
    for name, path in mods.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        package = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
        for node, in_function in _walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from this package, up level - 1
                    up = package[: len(package) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # ``from collsim import units`` imports the module collsim.units
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            for target in dict.fromkeys(targets):
                if target == "collsim" or target.startswith("collsim."):
                    line = lines[node.lineno - 1].strip()
                    found.append(Import(name, target, path, node.lineno, in_function, line))
    return found


def unit_of(module: str) -> str:
    """The unit (package or top-level module of the floor map) that holds ``module``."""
    best = ""
    for _, units in FLOORS:
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    if best == "collsim" and module != "collsim":  # a new top-level module: place it in FLOORS
        raise AssertionError(f"{module} is on no floor: add it to FLOORS in {__file__}")
    return best


def floor_of(module: str) -> int:
    """The floor index (0 = base) of ``module``."""
    unit = unit_of(module)
    return next(i for i, (_, units) in enumerate(FLOORS) if unit in units)


def upward(root: Path) -> list[str]:
    """One line per import from a higher floor: file:line, the import, the two floors."""
    bad = []
    for imp in imports(root):
        src, dst = floor_of(imp.source), floor_of(imp.target)
        if dst > src:
            bad.append(
                f"{imp.path.relative_to(root)}:{imp.line}: {imp.text!r} imports {imp.target} "
                f"(floor {FLOORS[dst][0]!r}) from floor {FLOORS[src][0]!r}"
            )
    return bad


def unit_cycles(root: Path) -> list[str]:
    """The cycles between units (packages and top-level modules), with an import of each edge."""
    graph = nx.DiGraph()
    for imp in imports(root):
        a, b = unit_of(imp.source), unit_of(imp.target)
        if a != b and not graph.has_edge(a, b):
            graph.add_edge(a, b, where=f"{imp.path.relative_to(root)}:{imp.line}")
    out = []
    for knot in nx.strongly_connected_components(graph):
        if len(knot) > 1:
            edges = [
                f"{a} -> {b} ({d['where']})" for a, b, d in graph.subgraph(knot).edges(data=True)
            ]
            out.append("; ".join(sorted(edges)))
    return out


def test_every_module_is_on_a_floor() -> None:
    for name in modules(ROOT):
        floor_of(name)  # raises for a module no unit holds


def test_no_import_from_a_higher_floor() -> None:
    bad = upward(ROOT)
    assert not bad, "imports from a higher floor:\n" + "\n".join(bad)


def test_no_cycle_between_packages_or_top_level_modules() -> None:
    cycles = unit_cycles(ROOT)
    assert not cycles, "import cycles between units:\n" + "\n".join(cycles)


def test_function_level_imports_only_for_start_up_speed() -> None:
    inner = [i for i in imports(ROOT) if i.in_function and not i.source.startswith("collsim.cli")]
    listed = "\n".join(f"{i.path.relative_to(ROOT)}:{i.line}: {i.text}" for i in inner)
    assert len(inner) <= FUNCTION_IMPORT_LIMIT, listed
    unexplained = [i for i in inner if "# start-up:" not in i.text]
    assert not unexplained, (
        "a function-level import needs a '# start-up: <reason>' comment:\n"
        + "\n".join(f"{i.path.relative_to(ROOT)}:{i.line}: {i.text}" for i in unexplained)
    )


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("inside", [False, True], ids=["module-level", "in-function"])
def test_a_planted_upward_import_fails_naming_file_and_line(tmp_path: Path, inside: bool) -> None:
    """The engine reaching up to the training floor, at module level or hidden in a function."""
    body = (
        "def f():\n    from collsim.training import step\n"
        if inside
        else ('"""Doc."""\nfrom collsim.training import step\n')
    )
    root = _plant(
        tmp_path,
        {
            "collsim/__init__.py": "",
            "collsim/engine/__init__.py": "",
            "collsim/engine/replay.py": "from collsim.collectives.schedule import Schedule\n",
            "collsim/engine/planted.py": body,
            "collsim/collectives/__init__.py": "",
            "collsim/collectives/schedule.py": "",
            "collsim/training/__init__.py": "",
            "collsim/training/step.py": "from collsim.engine import replay\n",
        },
    )
    bad = upward(root)
    assert bad == [
        "collsim/engine/planted.py:2: 'from collsim.training import step' imports "
        "collsim.training.step (floor 'training and calibration') from floor 'engine'"
    ]
    assert unit_cycles(root) == [
        "collsim.engine -> collsim.training (collsim/engine/planted.py:2); "
        "collsim.training -> collsim.engine (collsim/training/step.py:1)"
    ]


def test_relative_and_package_imports_resolve(tmp_path: Path) -> None:
    """``from . import x``, ``from ..model import y`` and ``from collsim import units`` name the
    modules they load, so a relative import cannot slip past the check."""
    root = _plant(
        tmp_path,
        {
            "collsim/__init__.py": "",
            "collsim/units.py": "",
            "collsim/model/__init__.py": "",
            "collsim/model/tuner.py": "",
            "collsim/topology/__init__.py": "",
            "collsim/topology/graph.py": (
                "from collsim import units\nfrom . import spec\nfrom ..model import tuner\n"
            ),
            "collsim/topology/spec.py": "",
        },
    )
    got = {(i.target, i.line) for i in imports(root)}
    assert got == {("collsim.units", 1), ("collsim.topology.spec", 2), ("collsim.model.tuner", 3)}
    assert upward(root) == [
        "collsim/topology/graph.py:3: 'from ..model import tuner' imports collsim.model.tuner "
        "(floor 'model') from floor 'topology'"
    ]


def test_a_new_top_level_module_must_be_placed(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"collsim\.newthing is on no floor"):
        floor_of("collsim.newthing")
