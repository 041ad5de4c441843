"""The layer rule of docs/architecture.md, as the import-linter contracts in pyproject.toml
state it: the tree as it is keeps every layer contract, and an upward import breaks one (so the
contracts are not vacuous). ``make lint`` runs the same contracts through ``lint-imports``."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

grimp = pytest.importorskip("grimp")

REPO = Path(__file__).parents[1]


def layer_contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return [c for c in contracts if c["type"] == "layers"]


def layers_of(contract: dict[str, Any]) -> list[Any]:
    """import-linter's ``a | b`` (independent siblings) as grimp layers."""
    return [
        grimp.Layer(*(name.strip() for name in layer.split("|")), independent=True)
        for layer in contract["layers"]
    ]


def illegal(graph: Any, contract: dict[str, Any]) -> set[Any]:
    containers = set(contract.get("containers", [])) or None
    result: set[Any] = graph.find_illegal_dependencies_for_layers(
        layers=layers_of(contract), containers=containers
    )
    return result


def build_graph() -> Any:
    return grimp.build_graph("servesim", "sim", "live", "calibration", "dashboards")


def test_the_tree_keeps_every_layer_contract() -> None:
    graph = build_graph()
    contracts = layer_contracts()
    assert len(contracts) >= 2
    for contract in contracts:
        assert illegal(graph, contract) == set(), contract["name"]


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("sim.engine.kv_cache", "sim.run"),  # the engine reaching up to the front door
        ("sim.workload.generate", "sim.scenario"),  # a family reading the whole scenario
        ("sim.fleet.pool", "sim.report.summary"),  # the fleet reaching into the report
        ("sim.planning.export", "live.server"),  # the arrow issue 14 removed
        ("live.run", "calibration.fit"),
    ],
)
def test_an_upward_import_breaks_a_contract(importer: str, imported: str) -> None:
    graph = build_graph()
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="x")
    broken = [c["name"] for c in layer_contracts() if illegal(graph, c)]
    assert broken, f"{importer} -> {imported} should break a layer contract"
