"""The compiled engine (tools/build_native.py) against the pure-Python one: the same records.

mypyc compiles the engine's hot path in place; these tests run each scenario once on the
compiled modules (this process) and once on the Python sources (a child process whose path
starts with a copy of ``sim/`` without extensions), and compare the records bit for bit. Where
nothing is compiled (no C compiler, ``NATIVE=0``) they skip: both runs would be the same code.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

import sim
import sim.engine.scheduler
from sim.reference import reference_scenario
from sim.run import build
from sim.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[1]
COMPILED = not sim.engine.scheduler.__file__.endswith(".py")

pytestmark = pytest.mark.skipif(not COMPILED, reason="the engine is not compiled (make native)")


def scenarios() -> dict[str, dict[str, Any]]:
    """Scenarios that take the engine through its branches: prefix caching and fast-forward,
    a fleet behind the prefix-affinity router, disaggregation, autoscaling, static batching, a
    front end that streams tokens behind the engine."""
    out = {
        "default": yaml.safe_load((ROOT / "sim" / "default_scenario.yaml").read_text()),
        "R3": reference_scenario("R3", 0.02),
    }
    out["default"]["workload"]["num_requests"] = 400
    out["streaming"] = copy.deepcopy(out["default"])
    out["streaming"]["latency"] = {"type": "roofline", "per_streamed_token_s": 2e-4}
    for name in ("disaggregated_long_prompts", "fleet_autoscaling", "static_batching"):
        data = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
        data["workload"].pop("duration_s", None)
        data["workload"]["num_requests"] = 300
        out[name] = data
    return out


def digest(data: dict[str, Any]) -> str:
    """A hash of the records a scenario simulates to."""
    records = build(parse_scenario(data)).run().records
    return str(pd.util.hash_pandas_object(records).sum())


PURE_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import sim.engine.scheduler
assert sim.engine.scheduler.__file__.endswith(".py"), sim.engine.scheduler.__file__
sys.path.insert(1, sys.argv[2])
from tests.test_native import digest
print(json.dumps({name: digest(data) for name, data in json.load(sys.stdin).items()}))
"""


def test_the_compiled_engine_writes_the_same_records_as_the_python_one(tmp_path: Path) -> None:
    pure = tmp_path / "pure"
    shutil.copytree(
        ROOT / "sim", pure / "sim", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    cases = scenarios()
    child = subprocess.run(
        [sys.executable, "-c", PURE_CHILD, str(pure), str(ROOT)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    expected = json.loads(child.stdout.strip().splitlines()[-1])
    compiled = {name: digest(data) for name, data in cases.items()}
    assert compiled == expected


def test_an_edited_source_is_reported_stale(tmp_path: Path) -> None:
    copy = tmp_path / "sim"
    shutil.copytree(ROOT / "sim", copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = copy / "engine" / "scheduler.py"
    source.write_text(source.read_text() + "\n")
    child = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import sim"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert "sim/engine/scheduler.py" in child.stderr and "make native" in child.stderr
