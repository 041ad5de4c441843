"""The scenario file: a YAML document validated with pydantic (the boundary of the simulator).

Engine knobs carry vLLM's names and meanings, so a chosen configuration pastes into ``vllm
serve``. Every problem in a file is reported as one line naming the field, e.g.
``workload.arrival.rate: must be > 0, got -3``; unknown keys are errors with a "did you mean"
hint. :func:`load_scenario` raises :class:`ScenarioError` holding those lines.

The schema stays one import away: every name below is importable from ``sim.scenario``. Inside,
:mod:`~sim.scenario.base` holds the section base class, :mod:`~sim.scenario.workload` the
``workload:`` section, :mod:`~sim.scenario.sections` the other sections,
:mod:`~sim.scenario.model` the top-level :class:`Scenario`, :mod:`~sim.scenario.errors` the
one-line error messages, and :mod:`~sim.scenario.load` reading, checking and writing scenarios
(the default scenario file stays package data of ``sim``).
"""

from sim.scenario.base import Fraction, PositiveFloat, PositiveInt, Spec
from sim.scenario.errors import ScenarioError, format_errors
from sim.scenario.load import (
    DEFAULT_SCENARIO_FILE,
    check_consistency,
    default_scenario,
    default_scenario_text,
    load_scenario,
    parse_scenario,
    parse_yaml,
    scenario_to_yaml,
)
from sim.scenario.model import Dtype, Scenario
from sim.scenario.sections import (
    AutoscalingSpec,
    ConstantLatencySpec,
    CostSpec,
    CustomGPUSpec,
    CustomModelSpec,
    DisaggregationSpec,
    EngineSpec,
    ExponentialLatencySpec,
    FleetSpec,
    HFConfigModelSpec,
    LatencySpec,
    OutputSpec,
    PoolSpec,
    ProfileLatencySpec,
    RooflineLatencySpec,
    RouterSpec,
    ScalingPolicySpec,
    ScalingRulesSpec,
    SimulatorSpec,
    SLOSpec,
)
from sim.scenario.workload import (
    ArrivalSpec,
    ConstantArrivalSpec,
    ConstantLengthSpec,
    DiurnalArrivalSpec,
    EmpiricalLengthSpec,
    GammaArrivalSpec,
    LengthSpec,
    LogNormalLengthSpec,
    MultiTurnSpec,
    NoPrefixSpec,
    OnOffArrivalSpec,
    PiecewiseArrivalSpec,
    PoissonArrivalSpec,
    PrefixSpec,
    SharedPrefixSpec,
    TraceSpec,
    UniformLengthSpec,
    WorkloadSpec,
)

__all__ = [
    "DEFAULT_SCENARIO_FILE",
    "ArrivalSpec",
    "AutoscalingSpec",
    "ConstantArrivalSpec",
    "ConstantLatencySpec",
    "ConstantLengthSpec",
    "CostSpec",
    "CustomGPUSpec",
    "CustomModelSpec",
    "DisaggregationSpec",
    "DiurnalArrivalSpec",
    "Dtype",
    "EmpiricalLengthSpec",
    "EngineSpec",
    "ExponentialLatencySpec",
    "FleetSpec",
    "Fraction",
    "GammaArrivalSpec",
    "HFConfigModelSpec",
    "LatencySpec",
    "LengthSpec",
    "LogNormalLengthSpec",
    "MultiTurnSpec",
    "NoPrefixSpec",
    "OnOffArrivalSpec",
    "OutputSpec",
    "PiecewiseArrivalSpec",
    "PoissonArrivalSpec",
    "PoolSpec",
    "PositiveFloat",
    "PositiveInt",
    "PrefixSpec",
    "ProfileLatencySpec",
    "RooflineLatencySpec",
    "RouterSpec",
    "SLOSpec",
    "ScalingPolicySpec",
    "ScalingRulesSpec",
    "Scenario",
    "ScenarioError",
    "SharedPrefixSpec",
    "SimulatorSpec",
    "Spec",
    "TraceSpec",
    "UniformLengthSpec",
    "WorkloadSpec",
    "check_consistency",
    "default_scenario",
    "default_scenario_text",
    "format_errors",
    "load_scenario",
    "parse_scenario",
    "parse_yaml",
    "scenario_to_yaml",
]
