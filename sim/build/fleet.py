"""A scenario's ``fleet`` section → the :class:`~sim.simulation.Simulation`: one pool of
replicas behind a router (with an autoscaler), pools of different GPUs behind one router, or a
disaggregated prefill and decode pool."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.build.engines import make_engines, pool_scenario
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.latency import (
    IterationTimeModel,
)
from sim.engine.memory import MemoryPlan
from sim.engine.request import Request
from sim.engine.scheduler import Scheduler
from sim.fleet.autoscaler import AutoscalerConfig, ScalingPolicy, ScalingRules, startup_seconds
from sim.fleet.disagg import DisaggConfig
from sim.fleet.router import Router
from sim.report.summary import SLO
from sim.scenario import DisaggregationSpec, RouterSpec, ScalingRulesSpec, Scenario
from sim.simulation import Simulation


def make_router(spec: RouterSpec, seed: np.random.SeedSequence) -> Router:
    """The router a scenario's ``fleet.router`` section describes, drawing from ``seed``."""
    return Router(
        spec.policy,
        np.random.default_rng(seed),
        load_bound=spec.load_bound,
        load_slack=spec.load_slack,
        min_match=spec.min_match,
    )


def autoscaler_config(scenario: Scenario, plan: MemoryPlan) -> AutoscalerConfig | None:
    """The scenario's HPA, with a start-up time from its weights per GPU."""
    spec = scenario.fleet.autoscaling
    if spec is None:
        return None

    def rules(r: ScalingRulesSpec) -> ScalingRules:
        policies = tuple(ScalingPolicy(p.type, p.value, p.period_s) for p in r.policies)
        return ScalingRules(r.stabilization_window_s, policies, r.select)

    return AutoscalerConfig(
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        metric=spec.metric,
        target=spec.target,
        startup_s=startup_seconds(spec.container_start_s, plan.weight_bytes, spec.weight_load_gb_s),
        percentile=spec.percentile,
        window_s=spec.window_s,
        sync_period_s=spec.sync_period_s,
        tolerance=spec.tolerance,
        scale_up=rules(spec.scale_up),
        scale_down=rules(spec.scale_down),
    )


def build_simulation(
    scenario: Scenario,
    requests: Sequence[Request],
    slo: SLO,
    latency_seed: np.random.SeedSequence,
    router_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
) -> Simulation:
    """The scenario's fleet as a Simulation of ``requests``: a prefill and a decode pool, pools
    of different GPUs behind one router, or one pool (with its autoscaler)."""
    disagg = scenario.fleet.disaggregation
    if disagg is not None:
        return _build_disaggregated(
            scenario, requests, slo, latency_seed, router_seed, coefficients, disagg
        )
    if scenario.fleet.pools is not None:
        return _build_pools(scenario, requests, slo, latency_seed, router_seed, coefficients)
    engines = make_engines(scenario, latency_seed, coefficients)
    scheduler, latency_model = engines.make_engine(0)
    return Simulation(
        requests,
        scheduler,
        latency_model,
        frontend_overhead_s=engines.frontend_overhead_s,
        max_model_len=engines.max_model_len,
        slo=slo,
        sample_interval_s=scenario.output.sample_interval_s,
        kv_capacity_tokens=engines.plan.kv_capacity_tokens,
        num_replicas=scenario.fleet.replicas,
        make_engine=engines.make_engine,
        router=make_router(scenario.fleet.router, router_seed),
        autoscaler=autoscaler_config(scenario, engines.plan),
        hardware=lambda i: engines.hardware,
    )


def _build_pools(
    scenario: Scenario,
    requests: Sequence[Request],
    slo: SLO,
    latency_seed: np.random.SeedSequence,
    router_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
) -> Simulation:
    """Pools of different GPUs or TP behind one router: replica i belongs to the pool whose
    range of ids holds i, in the order the pools are listed."""
    pools = scenario.fleet.pools
    assert pools is not None
    seeds = latency_seed.spawn(len(pools))
    engines = [
        make_engines(pool_scenario(scenario, pool), seed, coefficients, f"fleet.pools.{j}")
        for j, (pool, seed) in enumerate(zip(pools, seeds, strict=True))
    ]
    owner = [(j, k) for j, pool in enumerate(pools) for k in range(pool.replicas)]

    def make_engine(i: int) -> tuple[Scheduler, IterationTimeModel]:
        j, k = owner[i]
        return engines[j].make_engine(k)

    scheduler, latency_model = make_engine(0)
    return Simulation(
        requests,
        scheduler,
        latency_model,
        frontend_overhead_s=engines[0].frontend_overhead_s,
        max_model_len=min(e.max_model_len for e in engines),
        slo=slo,
        sample_interval_s=scenario.output.sample_interval_s,
        kv_capacity_tokens=engines[0].plan.kv_capacity_tokens,
        num_replicas=len(owner),
        make_engine=make_engine,
        router=make_router(scenario.fleet.router, router_seed),
        hardware=lambda i: engines[owner[i][0]].hardware,
    )


def _build_disaggregated(
    scenario: Scenario,
    requests: Sequence[Request],
    slo: SLO,
    latency_seed: np.random.SeedSequence,
    router_seed: np.random.SeedSequence,
    coefficients: CalibratedCoefficients | None,
    spec: DisaggregationSpec,
) -> Simulation:
    if scenario.engine.batching != "continuous":
        raise ValueError(
            "fleet.disaggregation: needs engine.batching: continuous (a decode replica admits "
            "requests whose KV arrives mid-flight)"
        )
    prefill_seed, decode_seed = latency_seed.spawn(2)
    prefill = make_engines(
        pool_scenario(scenario, spec.prefill),
        prefill_seed,
        coefficients,
        "fleet.disaggregation.prefill",
    )
    decode = make_engines(
        pool_scenario(scenario, spec.decode),
        decode_seed,
        coefficients,
        "fleet.disaggregation.decode",
    )
    prefill_router_seed, decode_router_seed = router_seed.spawn(2)
    config = DisaggConfig(
        num_prefill=spec.prefill.replicas,
        num_decode=spec.decode.replicas,
        make_prefill=prefill.make_engine,
        make_decode=decode.make_engine,
        prefill_router=make_router(scenario.fleet.router, prefill_router_seed),
        decode_router=Router(spec.decode_router, np.random.default_rng(decode_router_seed)),
        kv_bytes_per_token=prefill.plan.kv_bytes_per_token,
        link_bandwidth_bytes_per_s=spec.link_bandwidth_gb_s * 1e9,
        link_latency_s=spec.link_latency_s,
        prefill_hardware=lambda i: prefill.hardware,
        decode_hardware=lambda i: decode.hardware,
    )
    scheduler, latency_model = prefill.make_engine(0)
    return Simulation(
        requests,
        scheduler,
        latency_model,
        frontend_overhead_s=prefill.frontend_overhead_s,
        max_model_len=min(prefill.max_model_len, decode.max_model_len),
        slo=slo,
        sample_interval_s=scenario.output.sample_interval_s,
        kv_capacity_tokens=decode.plan.kv_capacity_tokens,
        disaggregation=config,
    )
