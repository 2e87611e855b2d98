"""Scenarios shipped with qpolicy: ``demo`` backs ``qpolicy demo``; the others are the targets the
simulator is held to (tests/unit/test_sim_targets.py, ``make bench``), and examples to start from.
``qpolicy sim NAME`` runs one by name.
"""

from importlib import resources

from qpolicy.sim.scenario import Scenario, parse_scenario_text


def names() -> list[str]:
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in resources.files(__package__).iterdir()
        if entry.name.endswith(".yaml")
    )


def text(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def builtin(name: str) -> Scenario:
    return parse_scenario_text(text(name), f"{name}.yaml")
