"""The package's shape: no import circles (module-level or inside functions), and planning never imports torch."""

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "cost_models")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> imported module, for every import anywhere in a module of the packages."""
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def test_import_graph_has_no_circles():
    graph = import_graph()
    assert graph.number_of_edges() > 50  # the walk found the imports
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], f"import circles: {cycles[:3]}"


def test_the_formulas_do_not_import_the_planner():
    graph = import_graph()
    assert not [(a, b) for a, b in graph.edges if a.startswith("cost_models") and b.startswith("planner")]


def test_planning_does_not_import_torch():
    code = ("import sys; from planner.cli import main; from planner.search.front import search; "
            "from planner.prediction.predict import predict; from planner.report.text import render_plan; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
