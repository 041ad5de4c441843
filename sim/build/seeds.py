"""The scenario's random streams: one seed sequence per component, spawned from its seed."""

from __future__ import annotations

import numpy as np

from sim.scenario import Scenario


def scenario_seeds(
    scenario: Scenario,
) -> tuple[np.random.SeedSequence, np.random.SeedSequence, np.random.SeedSequence]:
    """The workload's, the latency model's and the router's seeds, spawned from the scenario's
    seed (the first two are what they were before routers existed, so results are stable)."""
    workload_seed, latency_seed, router_seed = np.random.SeedSequence(scenario.seed).spawn(3)
    return workload_seed, latency_seed, router_seed
