"""The data path reads top to bottom: no module imports a layer above its own.

Every ``import`` in ``qpolicy/`` is read from the source (function-level imports too, where lazy
imports would otherwise hide a dependency) and checked against the layer table below. The
simulator sits beside the daemon: it may use everything the daemon uses, but no production module
may import it; only the CLI's simulator commands (``qpolicy sim``, ``qpolicy demo``, and the sim
enforcer of ``qpolicy daemon``, which they build) reach into it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "qpolicy"

# Lower numbers are lower layers. A module may import its own package and anything of a lower
# layer. Where a package and a module inside it are both listed, the longest match wins.
LAYERS = {
    "qpolicy": 0,  # __init__: the version
    "qpolicy.errors": 0,
    "qpolicy.model": 1,
    "qpolicy.runtime": 1,
    "qpolicy.engine": 2,
    "qpolicy.nvrm": 2,
    "qpolicy.state": 3,
    "qpolicy.enforcer": 3,
    "qpolicy.instance": 3,
    "qpolicy.demand": 4,
    "qpolicy.telemetry": 4,
    "qpolicy.control": 5,
    "qpolicy.enforcers": 6,
    "qpolicy.desired": 7,
    # Kubernetes pods: derivation, cgroups, pod-resources, policy. Its pod source hands
    # candidates to admission (qpolicy.desired), so it sits a layer above it.
    "qpolicy.kube": 7,
    "qpolicy.kube.source": 8,
    "qpolicy.backends": 8,
    "qpolicy.doctor": 8,
    "qpolicy.node": 9,
    "qpolicy.daemon": 10,
    "qpolicy.sim": 10,
    "qpolicy.cli": 11,
    "qpolicy.__main__": 12,
}
# The core of the data path: it must not know which enforcer it drives.
CORE = ("qpolicy.model", "qpolicy.engine", "qpolicy.state", "qpolicy.demand", "qpolicy.control")
# Not production code: the simulator, and the CLI commands that run it.
SIMULATOR = ("qpolicy.sim", "qpolicy.cli.simulate")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # "from qpolicy import engine" imports qpolicy.engine.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "qpolicy" or name.startswith("qpolicy.")}


def layer_of(name: str) -> tuple[str, int]:
    best = max((key for key in LAYERS if name == key or name.startswith(key + ".")), key=len)
    return best, LAYERS[best]


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_module_has_a_layer() -> None:
    for name in modules():
        assert layer_of(name)[0] != "qpolicy" or name == "qpolicy", name


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_imports_a_layer_above_its_own(name: str) -> None:
    home, rank = layer_of(name)
    for imported in sorted(imports_of(modules()[name])):
        if imported not in modules() and imported.rpartition(".")[0] in modules():
            imported = imported.rpartition(".")[0]  # "from qpolicy.x import name"
        target, target_rank = layer_of(imported)
        if target == home:
            continue
        assert target_rank < rank, f"{name} (layer {rank}) imports {imported} (layer {target_rank})"


@pytest.mark.parametrize("name", sorted(n for n in modules() if not within(n, SIMULATOR)))
def test_production_code_never_imports_the_simulator(name: str) -> None:
    bad = sorted(i for i in imports_of(modules()[name]) if within(i, ("qpolicy.sim",)))
    assert not bad, f"{name} imports {', '.join(bad)}"


@pytest.mark.parametrize("name", sorted(n for n in modules() if within(n, CORE)))
def test_core_modules_import_no_enforcer(name: str) -> None:
    bad = sorted(i for i in imports_of(modules()[name]) if within(i, ("qpolicy.enforcers",)))
    assert not bad, f"{name} imports {', '.join(bad)}"


def test_the_checks_see_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from qpolicy.sim.runner import run\n    import qpolicy.cli\n")
    assert imports_of(source) == {"qpolicy.sim.runner", "qpolicy.sim.runner.run", "qpolicy.cli"}
