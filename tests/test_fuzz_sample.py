"""A seeded sample of the fuzz benchmark (benchmarks/fuzz.py, issue 17), small enough for CI.

The benchmark throws 10,000 generated scenarios and traces at ``servesim check`` and ``run``;
this runs the first cases of a fixed seed through the same generator and judge: none may crash,
break an invariant, hang or refuse without a readable line, and the sample must reach both
outcomes a user meets (a run that goes through, a clean refusal) and every family of inputs.
The judge itself is checked too: a crash planted in the build, and a leaked KV block,
timestamps out of order or a lost record planted in a finished run, are each caught, so a green
sample means something.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import sim.run
from benchmarks.fuzz import (
    FAMILIES,
    GOOD_VERDICTS,
    Case,
    Outcome,
    generate_case,
    run_case,
)
from sim.run import SimResult, Simulation
from sim.scenario import default_scenario_text

SEED = 17
NUM_CASES = 150


def _describe(outcomes: list[Outcome]) -> str:
    return "\n".join(
        f"case {o.index} ({o.family}): {o.verdict}: {o.detail} {o.where}\n"
        f"  mutations: {'; '.join(o.mutations)}\n"
        f"  reproduce: .venv/bin/python benchmarks/fuzz.py --seed {SEED} --case {o.index}"
        for o in outcomes
    )


def test_a_seeded_sample_is_accepted_or_refused_cleanly(tmp_path: Path) -> None:
    outcomes = [run_case(generate_case(SEED, i), tmp_path) for i in range(NUM_CASES)]
    bad = [o for o in outcomes if o.verdict not in GOOD_VERDICTS]
    assert not bad, _describe(bad)
    verdicts = Counter(o.verdict for o in outcomes)
    assert verdicts["accepted"] >= NUM_CASES // 10, verdicts
    assert verdicts["refused cleanly"] >= NUM_CASES // 10, verdicts
    assert {o.family for o in outcomes} == set(FAMILIES)


def test_cases_reproduce_from_the_seed_and_index() -> None:
    assert generate_case(SEED, 3) == generate_case(SEED, 3)
    assert generate_case(SEED, 3) != generate_case(SEED + 1, 3)


def _valid_case() -> Case:
    """The embedded default scenario, cut to 20 requests: a case the CLI accepts."""
    data = yaml.safe_load(default_scenario_text())
    data["workload"]["num_requests"] = 20
    return Case(0, "knobs", ("default, 20 requests",), yaml.safe_dump(data).encode())


def test_a_valid_case_is_accepted(tmp_path: Path) -> None:
    assert run_case(_valid_case(), tmp_path).verdict == "accepted"


def test_the_judge_reports_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("planted")

    monkeypatch.setattr(sim.run, "build_simulation", broken)
    outcome = run_case(_valid_case(), tmp_path)
    assert outcome.verdict == "crashed"
    assert outcome.detail.startswith("KeyError") and "Traceback" in outcome.traceback


def _leak(simulation: Simulation) -> None:
    assert simulation.fleet is not None
    simulation.fleet.replicas[0].kv.allocate_slots(0, [], 0, 40)  # request 0 has finished


def _reorder(simulation: Simulation) -> None:
    record = simulation.records[0]
    record.finish_s = record.first_token_s - 1.0


def _lose(simulation: Simulation) -> None:
    del simulation.records[-1]


@pytest.mark.parametrize(
    ("plant", "invariant"),
    [
        (_leak, "KV blocks conserved"),
        (_reorder, "timestamps ordered"),
        (_lose, "requests conserved"),
    ],
)
def test_the_judge_reports_a_broken_invariant(
    plant: Callable[[Simulation], None],
    invariant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted after the run, not inside the engine: the engine may be compiled (mypyc), whose
    # methods cannot be patched.
    real_run = Simulation.run

    def run_and_break(self: Simulation, *args: Any, **kwargs: Any) -> SimResult:
        result = real_run(self, *args, **kwargs)
        plant(self)
        return result

    monkeypatch.setattr(Simulation, "run", run_and_break)
    outcome = run_case(_valid_case(), tmp_path)
    assert outcome.verdict == "broke an invariant"
    assert outcome.detail.startswith(invariant), outcome.detail
