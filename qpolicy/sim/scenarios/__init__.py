"""Scenarios shipped with qpolicy (``demo.yaml`` backs ``qpolicy demo``)."""

from importlib import resources

from qpolicy.sim.scenario import Scenario, parse_scenario_text


def builtin(name: str) -> Scenario:
    text = resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return parse_scenario_text(text, f"{name}.yaml")
