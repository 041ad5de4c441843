"""Scenario → simulation → result: the front door of ``sim``.

``build(scenario)`` returns a :class:`~sim.simulation.Simulation` wired by :mod:`sim.build`;
``Simulation.run()`` returns a :class:`~sim.simulation.SimResult` with per-request records, a
time series and the summary. ``run`` does both; ``summary_or_error`` validates and runs a
scenario dict for the planner and sweeps; ``scenario_requests`` gives the requests a live
replay sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.build.fleet import build_simulation
from sim.build.seeds import scenario_seeds
from sim.build.workload import request_source, scenario_requests
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.request import Request
from sim.report.outputs import write_outputs
from sim.report.record_sink import STREAM_ABOVE
from sim.report.summary import with_defaults
from sim.scenario import Scenario, ScenarioError, parse_scenario
from sim.simulation import SimResult, Simulation
from sim.workload.generate import SyntheticRequests

__all__ = [
    "SimResult",
    "Simulation",
    "build",
    "run",
    "scenario_requests",
    "summary_or_error",
    "write_outputs",
]


def build(
    scenario: Scenario,
    *,
    requests: Sequence[Request] | None = None,
    coefficients: CalibratedCoefficients | None = None,
) -> Simulation:
    """Everything a scenario describes, wired together. Raises ValueError on impossible setups,
    naming the scenario field to change.

    ``requests`` replaces the scenario's workload (a replay of recorded requests) and
    ``coefficients`` its latency section (a calibrated model being fitted).
    """
    workload_seed, latency_seed, router_seed = scenario_seeds(scenario)
    if requests is None:
        requests = request_source(scenario.workload, workload_seed)
        prioritised = not isinstance(requests, SyntheticRequests) and any(
            r.priority for r in requests
        )
        if scenario.engine.scheduling_policy != "priority" and prioritised:
            raise ValueError(
                "engine.scheduling_policy: the trace sets request priorities; set it to "
                "priority (vLLM refuses a priority under fcfs)"
            )
    slo = scenario.slo.target()
    simulation = build_simulation(scenario, requests, slo, latency_seed, router_seed, coefficients)
    simulation.max_waiting_requests = scenario.simulator.max_waiting_requests
    simulation.max_simulated_s = scenario.simulator.max_simulated_s
    simulation.max_concurrency = scenario.workload.max_concurrency
    simulation.client_think_s = scenario.workload.think_time_s
    simulation.percentiles = with_defaults(scenario.output.percentiles)
    return simulation


def summary_or_error(
    data: dict[str, Any], source: str = "scenario", records_dir: str | Path | None = None
) -> tuple[dict[str, Any], str]:
    """Validate and simulate a scenario dict: ``(summary, "")``, or ``({}, why it cannot run)``
    (its validation problems, or the impossible setup ``build`` reports).

    Only the summary is kept: with ``records_dir`` the records and the time series are
    streamed there (``records.parquet``, ``timeseries.parquet``), and a run of more than
    :data:`STREAM_ABOVE` requests streams its records anyway (nowhere without
    ``records_dir``), so its memory stays flat."""
    try:
        simulation = build(parse_scenario(data, source))
        stream = records_dir is not None or len(simulation.requests) > STREAM_ABOVE
        return simulation.run(stream=stream, out_dir=records_dir).summary, ""
    except ScenarioError as exc:
        return {}, "; ".join(exc.problems)
    except ValueError as exc:
        return {}, str(exc)


def run(scenario: Scenario) -> SimResult:
    """Build and run a scenario."""
    return build(scenario).run()
