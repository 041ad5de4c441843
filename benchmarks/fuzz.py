"""Fuzz ``servesim check`` and ``servesim run`` with generated scenarios and traces (issue 17).

Every case starts from a valid scenario (the embedded default, the examples in scenarios/, the
speed benchmark's reference scenarios) and breaks it: a field dropped or set to a wrong type, a
negative, zero, huge, NaN or infinite number, an empty, random or 20,000-character string, a
nested list; unknown keys; sections swapped; random combinations of engine, fleet and workload
knobs; the YAML text truncated, its bytes flipped, nested past the reader's limits; small trace
files (each format sim/workload/trace_formats.py reads) with bad columns and values; a model's
config.json, a calibration profile and an empirical length table beside the scenario; and
``run``'s flags. Runs stay small (at most 50 requests and a million KV blocks) so that 10,000
cases take minutes.

Each case goes through the CLI in-process (typer's runner over ``servesim.cli.app``) as a user
meets it, ``check`` then ``run``, and ends as one verdict:

* accepted: both exit 0, and the run keeps the invariants: every request has exactly one record
  with a final status; KV blocks are conserved (each replica's cache passes its own check, no
  finished request holds a block but in a static batch still running, and a run that finished
  every request leaves every block free); timestamps are ordered (arrival ≤ scheduled ≤ first
  token ≤ finish, token times non-decreasing and one per token); ``check`` and ``run`` agree.
* refused cleanly: both exit 2 with ``error: ...`` or ``invalid FILE:`` lines, no traceback;
* refused unclearly: exit 2 but no such line, or a line over 2,000 characters;
* crashed: an exception escaped (a traceback for the user), or another exit code;
* broke an invariant, or timed out (a run still going after ``--timeout`` seconds).

Run: ``.venv/bin/python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--jobs 1] [--out DIR]``;
``--case N`` replays one case verbosely. Randomness comes from one ``numpy.random.Generator``
per case, seeded by ``(--seed, case index)``, so any case reproduces alone.
tests/test_fuzz_sample.py runs a seeded sample of the same generator in CI.

The module is longer than ~500 lines on purpose: benchmarks/ is not a package, so a script here
cannot import a sibling by the name the CI sample imports it by; generator, runner and report
stay one file.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar
from unittest import mock

import numpy as np
import yaml
from typer.testing import CliRunner, Result

import servesim.cli
from sim.build.engines import memory_plan, pool_scenario
from sim.catalog.hardware import GPU_CATALOG
from sim.catalog.models import MODEL_CATALOG
from sim.engine.request import RequestStatus
from sim.engine.static_batch import StaticBatchScheduler
from sim.reference import reference_scenario
from sim.run import Simulation, build
from sim.scenario import PoolSpec, Scenario, default_scenario_text

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
#: The most requests any generated run simulates (more only makes the benchmark slower).
MAX_CASE_REQUESTS = 50
#: The most KV blocks a generated fleet allocates (a tiny model on a large GPU with one-token
#: blocks has tens of millions, seconds and gigabytes to build).
MAX_CASE_BLOCKS = 1_000_000
#: A run still going after this many seconds is reported as timed out (a hang, or a case that
#: escaped the size caps).
DEFAULT_TIMEOUT_S = 60.0
#: A refusal line longer than this is not a line a user can read.
MAX_MESSAGE_CHARS = 2000

VERDICTS = (
    "accepted",
    "refused cleanly",
    "refused unclearly",
    "crashed",
    "broke an invariant",
    "timed out",
)
GOOD_VERDICTS = frozenset({"accepted", "refused cleanly"})
#: How a case was made (the columns of the report on the right).
FAMILIES = ("mutated", "knobs", "yaml text", "trace", "side file")


@dataclass(frozen=True)
class Case:
    """One generated input: the scenario file's bytes, the files beside it, ``run``'s flags."""

    index: int
    family: str
    mutations: tuple[str, ...]
    scenario: bytes
    files: tuple[tuple[str, bytes], ...] = ()
    run_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What a case did: its verdict, and for a bad one what went wrong and where."""

    index: int
    family: str
    verdict: str
    detail: str = ""
    where: str = ""
    traceback: str = ""
    mutations: tuple[str, ...] = ()
    longest_line: int = 0

    @property
    def key(self) -> tuple[str, str, str]:
        """Cases with the same key are (most likely) the same bug."""
        kind = self.detail.split(":", 1)[0]
        return self.verdict, kind, self.where


# ------------------------------------------------------------------------------------------
# Values


def pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    """One of ``options``, uniformly (numpy's choice would turn mixed types into an array)."""
    return options[int(rng.integers(len(options)))]


def chance(rng: np.random.Generator, p: float) -> bool:
    """True with probability ``p``."""
    return bool(rng.random() < p)


_CHARACTERS = (
    "abcxyzABC019 _-.:/\\'\"#&*!|>%@`{}[],?"
    "\t\n\r\x00\x07\x1b\u00e9\u221e\u202e\u200b\ufeff\U0001f600"
)
_YAML_WORDS = ("yes", "no", "null", "~", ".inf", ".nan", "0x10", "1_000", "2023-01-01", "*a")


def random_text(rng: np.random.Generator) -> str:
    """A short string of awkward characters, or a word YAML would read as something else."""
    if chance(rng, 0.3):
        return pick(rng, _YAML_WORDS)
    return "".join(pick(rng, _CHARACTERS) for _ in range(int(rng.integers(1, 24))))


def hostile(rng: np.random.Generator) -> tuple[str, Any]:
    """A value no field should take without a clear error: ``(what it is, the value)``."""
    kind = pick(
        rng,
        (
            "wrong type",
            "negative",
            "zero",
            "huge",
            "NaN",
            "inf",
            "empty string",
            "random string",
            "long string",
            "nested list",
            "null",
            "tiny",
            "empty container",
        ),
    )
    value: Any
    match kind:
        case "wrong type":
            value = pick(rng, ("fast", True, False, [1, 2], {"type": "x"}, "1e3", "16", 1.5))
        case "negative":
            value = pick(rng, (-1, -0.5, -16, -(10**9), -1e-300))
        case "zero":
            value = pick(rng, (0, 0.0))
        case "huge":
            value = pick(rng, (10**9, 10**12, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, 1e300))
        case "NaN":
            value = math.nan
        case "inf":
            value = pick(rng, (math.inf, -math.inf))
        case "empty string":
            value = ""
        case "random string":
            value = random_text(rng)
        case "long string":
            value = pick(rng, ("x", "llama-", "0", "h100 ")) * int(rng.integers(100, 20_000))
        case "nested list":
            value = pick(rng, (1, "x", None, 16))
            for _ in range(int(rng.integers(1, 12))):
                value = [value]
        case "null":
            value = None
        case "tiny":
            value = pick(rng, (1, 2, 7, 1e-9, 5e-324, 0.001))
        case _:
            value = pick(rng, ([], {}))
    return kind, value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------------------------------------
# Valid scenarios to start from


@cache
def base_scenarios() -> tuple[tuple[str, str], ...]:
    """``(name, YAML text)`` of every valid scenario a case starts from, each cut to at most
    :data:`MAX_CASE_REQUESTS` requests. Trace scenarios get a generated trace in their format
    instead of the public one (see :func:`trace_case`), so only synthetic ones are kept here."""
    found: list[tuple[str, dict[str, Any]]] = [("default", yaml.safe_load(default_scenario_text()))]
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        found.append((path.stem, yaml.safe_load(path.read_text())))
    for name in ("R1", "R2", "R3"):  # R4 replays the public Azure trace
        found.append((name, reference_scenario(name, scale=0.001)))
    bases = []
    for name, data in found:
        workload = data["workload"]
        if "trace" in workload:
            continue
        requested = workload.get("num_requests", MAX_CASE_REQUESTS)
        workload["num_requests"] = min(requested, MAX_CASE_REQUESTS)
        if "duration_s" in workload:
            workload["duration_s"] = min(workload["duration_s"], 60)
        bases.append((name, yaml.safe_dump(data, sort_keys=False)))
    return tuple(bases)


def _base(rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
    name, text = pick(rng, base_scenarios())
    data = yaml.safe_load(text)
    data["workload"]["num_requests"] = int(rng.integers(1, MAX_CASE_REQUESTS + 1))
    return name, data


# ------------------------------------------------------------------------------------------
# Structural mutations of a parsed document

Path_ = tuple[Any, ...]


def paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every key path in a nested document of dicts and lists."""
    found: list[Path_] = []
    items: Any = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in items:
        found.append((*prefix, key))
        found.extend(paths(value, (*prefix, key)))
    return found


def _node(data: Any, path: Path_) -> Any:
    for key in path:
        data = data[key]
    return data


def _parent(data: Any, path: Path_) -> Any:
    return _node(data, path[:-1])


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _typo(rng: np.random.Generator, word: str) -> str:
    if len(word) < 2:
        return word + "_"
    i = int(rng.integers(len(word) - 1))
    match pick(rng, ("swap", "drop", "double", "case")):
        case "swap":
            return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        case "drop":
            return word[:i] + word[i + 1 :]
        case "double":
            return word[:i] + word[i] + word[i:]
    return word.upper()


def mutate_document(rng: np.random.Generator, data: Any) -> str:
    """Break ``data`` in place one way; say how."""
    all_paths = paths(data)
    operation = pick(rng, ("drop", "set", "set", "set", "unknown key", "rename", "swap", "move"))
    if not all_paths:
        operation = "unknown key"
    if operation in ("drop", "set"):
        path = pick(rng, all_paths)
        parent = _parent(data, path)
        if operation == "drop":
            del parent[path[-1]]
            return f"drop {_dotted(path)}"
        kind, value = hostile(rng)
        parent[path[-1]] = value
        return f"set {_dotted(path)} = {kind} {_short(value)}"
    dict_paths = [p for p in all_paths if isinstance(_node(data, p), dict)]
    if operation == "unknown key":
        target_path = pick(rng, [(), *dict_paths])
        target = _node(data, target_path)
        if not isinstance(target, dict):
            return "unknown key skipped"
        keys = [k for k in target if isinstance(k, str)]
        key: Any = _typo(rng, pick(rng, keys)) if keys and chance(rng, 0.6) else random_text(rng)
        if chance(rng, 0.05):
            key = pick(rng, (1, None, True, 1.5))
        kind, value = hostile(rng)
        target[key] = value
        return f"add {_dotted((*target_path, key))} = {kind} {_short(value)}"
    if operation == "rename":
        path = pick(rng, all_paths)
        parent = _parent(data, path)
        if not isinstance(parent, dict) or not isinstance(path[-1], str):
            return "rename skipped"
        new = _typo(rng, path[-1])
        parent[new] = parent.pop(path[-1])
        return f"rename {_dotted(path)} to {new}"
    if len(dict_paths) < 2:
        return f"{operation} skipped"
    first, second = pick(rng, dict_paths), pick(rng, dict_paths)
    if first[: len(second)] == second or second[: len(first)] == first:
        return f"{operation} skipped"  # one holds the other
    a, b = _parent(data, first), _parent(data, second)
    if operation == "swap":
        a[first[-1]], b[second[-1]] = b[second[-1]], a[first[-1]]
        return f"swap {_dotted(first)} and {_dotted(second)}"
    target = b[second[-1]]  # before the pop, which may shift a list holding it
    target[first[-1]] = a.pop(first[-1])
    return f"move {_dotted(first)} into {_dotted(second)}"


# ------------------------------------------------------------------------------------------
# Knob combinations: mostly valid values, to reach many code paths of an accepted run

ENGINE_KNOBS: dict[str, tuple[Any, ...]] = {
    "block_size": (1, 8, 16, 16, 32, 64, 128),
    "max_num_seqs": (1, 2, 4, 16, 64, 256),
    "max_num_batched_tokens": (16, 64, 512, 2048, 8192, 32768),
    "enable_prefix_caching": (True, False),
    "enable_chunked_prefill": (True, True, False),
    "gpu_memory_utilization": (0.05, 0.5, 0.9, 0.95, 1.0),
    "max_model_len": (64, 512, 2048, 8192, 32768),
    "tensor_parallel_size": (1, 1, 2, 4, 8, 16),
    "pipeline_parallel_size": (1, 1, 2, 3, 4, 8),
    "scheduling_policy": ("fcfs", "priority"),
    "enable_expert_parallel": (True, False),
    "batching": ("continuous", "continuous", "static", "dynamic"),
    "async_scheduling": (True, False, None),
    "batch_window_s": (0.0, 0.01, 0.05, 0.5),
}
SMALL_MODELS = ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "llama-2-7b", "servesim-tiny-llama")
TOP_KNOBS: dict[str, tuple[Any, ...]] = {
    "model": (*SMALL_MODELS, *SMALL_MODELS, *MODEL_CATALOG),
    "gpu": tuple(GPU_CATALOG),
    "dtype": ("bf16", "fp16", "fp8", "int8", "int4"),
    "quantization": ("auto", "auto", "auto", "weight_only", "w8a8", "bitsandbytes"),
    "kv_cache_dtype": ("auto", "bf16", "fp16", "fp8"),
}
ROUTERS = ("round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity")


def _lengths(rng: np.random.Generator, largest: int) -> dict[str, Any]:
    match pick(rng, ("constant", "uniform", "lognormal", "lognormal")):
        case "constant":
            return {"type": "constant", "value": int(rng.integers(1, largest))}
        case "uniform":
            low = int(rng.integers(1, largest))
            return {"type": "uniform", "low": low, "high": low + int(rng.integers(0, largest))}
    if chance(rng, 0.5):
        mean = float(rng.uniform(2, largest))
        spread = float(rng.uniform(1.1, 4) if chance(rng, 0.9) else rng.uniform(0.5, 1.1))
        spec = {"type": "lognormal", "mean": mean, "p90": mean * spread}
    else:
        spec = {"type": "lognormal", "mu": float(rng.uniform(0, 7)), "sigma": rng.uniform(0.1, 2)}
    return {**spec, "min_tokens": int(rng.integers(1, 4)), "max_tokens": largest * 2}


def _arrival(rng: np.random.Generator) -> dict[str, Any]:
    rate = pick(rng, (0.5, 2.0, 8.0, 50.0, 400.0, math.inf))
    match pick(rng, ("poisson", "poisson", "gamma", "constant", "on_off", "piecewise", "diurnal")):
        case "poisson":
            return {"type": "poisson", "rate": rate}
        case "gamma":
            shape = {"cv": pick(rng, (0.01, 0.5, 3.0, 100))}
            if chance(rng, 0.3):
                shape = {"burstiness": pick(rng, (1e-4, 0.1, 1.0, 1e4))}
            return {"type": "gamma", "rate": rate, **shape}
        case "constant":
            return {"type": "constant", "rate": rate}
        case "on_off":
            return {"type": "on_off", "on_rate": 20.0, "on_s": 2.0, "off_s": 3.0, "off_rate": 0.5}
        case "piecewise":
            num_points = int(rng.integers(1, 5))
            points = [[float(i * 5), pick(rng, (0.0, 1.0, 10.0, 40.0))] for i in range(num_points)]
            spec: dict[str, Any] = {"type": "piecewise", "points": points}
            spec["interpolation"] = pick(rng, ("step", "linear"))
            if chance(rng, 0.3):
                spec["period_s"] = pick(rng, (5.0, 30.0))
            return spec
    return {"type": "diurnal", "mean_rate": 5.0, "amplitude": rng.uniform(0, 1), "period_s": 60}


def _prefix(rng: np.random.Generator) -> dict[str, Any]:
    match pick(rng, ("none", "shared", "shared", "multi_turn", "multi_turn")):
        case "none":
            return {"type": "none"}
        case "shared":
            return {
                "type": "shared",
                "num_groups": int(rng.integers(1, 5)),
                "prefix_tokens": int(rng.integers(1, 600)),
                "share": float(rng.uniform(0, 1)),
            }
    return {
        "type": "multi_turn",
        "turns": _lengths(rng, 6),
        "think_time_s": pick(rng, (0.0, 0.5, 5.0)),
        "system_prompt_tokens": pick(rng, (0, 0, 32, 500)),
    }


def _fleet(rng: np.random.Generator) -> dict[str, Any]:
    router: dict[str, Any] = {"policy": pick(rng, ROUTERS)}
    if router["policy"] == "prefix_affinity" and chance(rng, 0.5):
        router |= {"load_bound": 1.0, "load_slack": 0, "min_match": rng.uniform(0, 1)}
    match pick(rng, ("replicas", "autoscaling", "disaggregation", "pools")):
        case "replicas":
            return {"replicas": int(rng.integers(1, 5)), "router": router}
        case "autoscaling":
            return {
                "replicas": 1,
                "router": router,
                "autoscaling": {
                    "min_replicas": 1,
                    "max_replicas": int(rng.integers(1, 5)),
                    "metric": pick(
                        rng, ("ttft_ms", "waiting_per_replica", "running_per_replica", "kv_usage")
                    ),
                    "target": pick(rng, (0.5, 2.0, 100.0)),
                    "window_s": pick(rng, (1.0, 10.0)),
                    "sync_period_s": pick(rng, (0.5, 2.0, 15.0)),
                    "container_start_s": pick(rng, (0.0, 1.0, 30.0)),
                    "scale_down": {
                        "stabilization_window_s": pick(rng, (0.0, 5.0)),
                        "policies": [{"type": pick(rng, ("pods", "percent")), "value": 50}],
                        "select": pick(rng, ("max", "min", "disabled")),
                    },
                },
            }
        case "disaggregation":

            def pool() -> dict[str, Any]:
                spec: dict[str, Any] = {"replicas": int(rng.integers(1, 3))}
                if chance(rng, 0.3):
                    spec["gpu"] = pick(rng, TOP_KNOBS["gpu"])
                if chance(rng, 0.3):
                    spec["tensor_parallel_size"] = pick(rng, (1, 2, 4))
                return spec

            return {
                "router": router,
                "disaggregation": {
                    "prefill": pool(),
                    "decode": pool(),
                    "link_bandwidth_gb_s": pick(rng, (0.001, 25.0, 400.0)),
                    "link_latency_s": pick(rng, (0.0, 0.0005, 0.1)),
                    "decode_router": pick(rng, ROUTERS[:4]),
                },
            }
    pools = [
        {
            "replicas": int(rng.integers(1, 3)),
            "gpu": pick(rng, TOP_KNOBS["gpu"]),
            "tensor_parallel_size": pick(rng, (1, 2)),
        }
        for _ in range(int(rng.integers(1, 3)))
    ]
    return {"router": router, "pools": pools}


def _workload(rng: np.random.Generator, data: dict[str, Any]) -> None:
    workload = data["workload"]
    if chance(rng, 0.5):
        workload["arrival"] = _arrival(rng)
    if chance(rng, 0.4):
        workload["prompt_tokens"] = _lengths(rng, pick(rng, (16, 512, 4096)))
        workload["output_tokens"] = _lengths(rng, pick(rng, (4, 64, 512)))
    if chance(rng, 0.4):
        workload["prefix"] = _prefix(rng)
    if chance(rng, 0.2):
        shares = rng.dirichlet(np.ones(int(rng.integers(1, 4))))
        shares = np.round(shares, 3)
        shares[-1] = round(1 - float(shares[:-1].sum()), 3)
        classes = [{"priority": int(i * 3 - 2), "share": float(s)} for i, s in enumerate(shares)]
        workload["priority"] = {"classes": classes}
        if chance(rng, 0.8):  # what a priority workload needs; else a refusal
            data.setdefault("engine", {})["scheduling_policy"] = "priority"
    if chance(rng, 0.2):
        workload["max_concurrency"] = pick(rng, (1, 2, 8, 64))
        workload["think_time_s"] = pick(rng, (0.0, 0.0, 0.5))
    if chance(rng, 0.15):
        workload["duration_s"] = pick(rng, (0.01, 1.0, 10.0, 60.0))


def _latency(rng: np.random.Generator) -> dict[str, Any]:
    match pick(rng, ("roofline", "constant", "exponential")):
        case "constant":
            return {"type": "constant", "step_s": pick(rng, (1e-6, 0.001, 0.02))}
        case "exponential":
            return {"type": "exponential", "mean_s": pick(rng, (0.001, 0.02))}
    return {
        "type": "roofline",
        "compute_efficiency": rng.uniform(0.05, 1),
        "bandwidth_efficiency": rng.uniform(0.05, 1),
        "step_overhead_s": pick(rng, (0.0, 0.002)),
        "flash_attention": chance(rng, 0.5),
        "frontend_overhead_s": pick(rng, (0.0, 0.01)),
        "moe_overlap_exponent": pick(rng, (1.0, 1.25, 4.0)),
    }


def turn_knobs(rng: np.random.Generator, data: dict[str, Any]) -> list[str]:
    """Set a random combination of knobs, each to a value of its own domain; say which."""
    changed = []
    engine = data.setdefault("engine", {})
    for knob in rng.permutation(list(ENGINE_KNOBS))[: int(rng.integers(0, 6))]:
        engine[str(knob)] = pick(rng, ENGINE_KNOBS[str(knob)])
        changed.append(f"engine.{knob}={engine[str(knob)]}")
    for knob in rng.permutation(list(TOP_KNOBS))[: int(rng.integers(0, 3))]:
        data[str(knob)] = pick(rng, TOP_KNOBS[str(knob)])
        changed.append(f"{knob}={data[str(knob)]}")
    sections: dict[str, Callable[[], None]] = {
        "fleet": lambda: data.__setitem__("fleet", _fleet(rng)),
        "workload": lambda: _workload(rng, data),
        "latency": lambda: data.__setitem__("latency", _latency(rng)),
        "output": lambda: data.__setitem__(
            "output",
            {
                "sample_interval_s": pick(rng, (0.001, 0.05, 1.0, 10.0)),
                "record_token_times": chance(rng, 0.4),
                "prometheus": chance(rng, 0.3),
                "percentiles": pick(rng, ([99.9], [1, 50], [])),
            },
        ),
        "simulator": lambda: data.__setitem__(
            "simulator",
            {
                "fast_forward": chance(rng, 0.7),
                "max_waiting_requests": pick(rng, (1, 5, 100_000)),
                "max_simulated_s": pick(rng, (0.001, 1.0, 30.0, None)),
            },
        ),
        "slo": lambda: data.__setitem__(
            "slo",
            {"ttft_s": 0.2, "tpot_s": 0.01, "percentile": pick(rng, (50, 99.9, 100)), "e2e_s": 5},
        ),
        "cost": lambda: data.__setitem__(
            "cost", {"gpu_hour_usd": {pick(rng, TOP_KNOBS["gpu"]): 2}}
        ),
    }
    for name in rng.permutation(list(sections))[: int(rng.integers(1, 4))]:
        sections[str(name)]()
        changed.append(f"{name} varied")
    return changed


def keep_small(data: Any) -> list[str]:
    """Keep a valid scenario small, saying how: at most :data:`MAX_CASE_REQUESTS` requests
    (num_requests, whichever of it and duration_s ends first), and at most
    :data:`MAX_CASE_BLOCKS` KV blocks over the fleet (GPU memory utilization lowered, since
    every block is an object of the simulator). An invalid scenario is left alone: it is
    refused before it builds anything."""
    notes: list[str] = []
    try:
        scenario = Scenario.model_validate(data)
    except Exception:  # whatever the validation does with hostile input, the CLI will show it
        return notes
    requested = scenario.workload.num_requests
    if requested is None or requested > MAX_CASE_REQUESTS:
        data["workload"]["num_requests"] = MAX_CASE_REQUESTS
        notes.append(f"capped workload.num_requests at {MAX_CASE_REQUESTS}")
    for _ in range(8):
        try:
            scenario = Scenario.model_validate(data)
            blocks = fleet_cache_blocks(scenario)
        except Exception:  # a model that does not fit, a file not written yet: the CLI says
            break
        if blocks <= MAX_CASE_BLOCKS:
            break
        utilization = scenario.engine.gpu_memory_utilization / 4
        data.setdefault("engine", {})["gpu_memory_utilization"] = utilization
        notes.append(f"{blocks:,} KV blocks: gpu_memory_utilization {utilization:.3g}")
    return notes


def fleet_cache_blocks(scenario: Scenario) -> int:
    """The KV blocks of every replica the scenario may run (each allocates its own)."""
    fleet = scenario.fleet
    pools: list[PoolSpec]
    if fleet.disaggregation is not None:
        pools = [fleet.disaggregation.prefill, fleet.disaggregation.decode]
    elif fleet.pools is not None:
        pools = fleet.pools
    else:
        count = fleet.replicas if fleet.autoscaling is None else fleet.autoscaling.max_replicas
        pools = [PoolSpec(replicas=count)]
    total = 0
    for pool in pools:
        engine = pool_scenario(scenario, pool)
        plan = memory_plan(engine, engine.resolve_model(), engine.resolve_gpu())
        total += pool.replicas * plan.num_blocks
    return total


# ------------------------------------------------------------------------------------------
# Raw text: the YAML reader's limits and syntax errors


def mutate_text(rng: np.random.Generator, text: bytes) -> tuple[str, bytes]:
    """Break the file's bytes one way: ``(how, the new bytes)``."""
    match pick(
        rng,
        (
            "truncate",
            "flip bytes",
            "deep nesting",
            "deep nesting",
            "aliases",
            "tag",
            "documents",
            "tabs",
            "encoding",
            "empty",
            "top level",
            "huge",
        ),
    ):
        case "truncate":
            cut = int(rng.integers(len(text) + 1))
            return f"truncate at byte {cut}", text[:cut]
        case "flip bytes":
            flipped = bytearray(text)
            for _ in range(int(rng.integers(1, 6))):
                flipped[int(rng.integers(len(flipped)))] = int(rng.integers(256))
            return "flip bytes", bytes(flipped)
        case "deep nesting":
            depth = pick(rng, (30, 63, 64, 65, 200, 5000, 100_000))
            opening, closing = pick(rng, (("[", "]"), ("{a: ", "}")))
            value = opening * depth + "1" + closing * depth
            line = f"{pick(rng, ('seed', 'engine', 'workload', 'nested'))}: {value}\n"
            if chance(rng, 0.3):  # block style: one more indent per level
                line = "nested:\n" + "".join(
                    f"{'  ' * (i + 1)}k:\n" for i in range(min(depth, 200))
                )
            return f"nest {depth} levels", text + line.encode()
        case "aliases":
            count = pick(rng, (10, 256, 257, 5000))
            lines = "anchor: &a [1, 2]\nmany: [" + ", ".join(["*a"] * count) + "]\n"
            if chance(rng, 0.5):  # a billion laughs
                lines = "a0: &a0 [x, x]\n" + "".join(
                    f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}]\n" for i in range(1, 12)
                )
            return f"{count} aliases", text + lines.encode()
        case "tag":
            tag = pick(
                rng,
                (
                    '!!python/object/apply:os.system ["true"]',
                    "!!binary aGVsbG8=",
                    "!!timestamp 2001-12-14",
                    "!!set {a, b}",
                    "!custom 3",
                    "*undefined",
                ),
            )
            return f"tag {tag}", text + f"seed: {tag}\n".encode()
        case "documents":
            return "two documents", text + b"\n---\n" + text
        case "tabs":
            return "tab indentation", text.replace(b"  ", b"\t", 1)
        case "encoding":
            how = pick(rng, ("bom", "crlf", "utf-16", "latin-1", "nul"))
            changed = {
                "bom": b"\xef\xbb\xbf" + text,
                "crlf": text.replace(b"\n", b"\r\n"),
                "utf-16": text.decode("utf-8", "replace").encode("utf-16"),
                "latin-1": text + "name: caf\u00e9\n".encode("latin-1"),
                "nul": text + b"\x00",
            }[how]
            return f"encoding {how}", changed
        case "empty":
            return "empty file", pick(rng, (b"", b"   \n", b"# only a comment\n", b"~\n"))
        case "top level":
            return "not a mapping", pick(rng, (b"- 1\n- 2\n", b"42\n", b"hello\n", b"[]\n"))
    # Over the 16 MiB a YAML document may hold (rare: it costs a 16 MiB write).
    if chance(rng, 0.1):
        return "over 16 MiB", text + b"#" + b"x" * (16 * 2**20) + b"\n"
    return "a long comment", text + b"#" + b"x" * 100_000 + b"\n"


# ------------------------------------------------------------------------------------------
# Trace files

TRACE_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    # format: (suffix, columns of a valid file)
    "azure": (".csv", ("TIMESTAMP", "ContextTokens", "GeneratedTokens")),
    "vidur": (".csv", ("arrived_at", "num_prefill_tokens", "num_decode_tokens")),
    "servesim_csv": (".csv", ("arrival_s", "prompt_tokens", "output_tokens", "session_id")),
    "mooncake": (".jsonl", ("timestamp", "input_length", "output_length", "hash_ids")),
    "llmservingsim": (".jsonl", ("arrival_time_ns", "input_toks", "output_toks", "input_tok_ids")),
    "servesim_jsonl": (".jsonl", ("arrival_s", "prompt_tokens", "output_tokens", "hash_ids")),
}
#: Hostile cells: CSV text, and JSON values.
BAD_CELLS = ("-5", "0", "nan", "inf", "-inf", "1e30", str(2**63), "1.5", "", "abc", " 12 ", "12.0")
BAD_JSON: tuple[Any, ...] = (-5, 0, math.nan, math.inf, 1e30, 2**63, 2**70, 1.5, "", "12", None)
BAD_JSON += ([], {}, True, [1, "a"], [-1], [2**64], [[1]])


def _trace_rows(rng: np.random.Generator, trace_format: str, num_rows: int) -> list[dict[str, Any]]:
    """``num_rows`` valid requests in ``trace_format``'s columns."""
    times = np.sort(rng.uniform(0, num_rows / pick(rng, (0.5, 5.0, 50.0)), num_rows))
    rows = []
    for i, start in enumerate(times):
        prompt = int(np.exp(rng.uniform(0, 7.5)))
        output = int(np.exp(rng.uniform(0, 5.5)))
        blocks = [int(rng.integers(4)) if b < 2 else int(rng.integers(10**6)) for b in range(9)]
        match trace_format:
            case "azure":
                second = 46 + float(start)
                stamp = f"2023-11-16 18:{15 + int(second // 60):02d}:{second % 60:010.7f}"
                row: dict[str, Any] = {
                    "TIMESTAMP": stamp,
                    "ContextTokens": prompt,
                    "GeneratedTokens": output,
                }
            case "vidur":
                row = {"arrived_at": float(start), "num_prefill_tokens": prompt}
                row["num_decode_tokens"] = output
            case "servesim_csv":
                row = {"arrival_s": round(float(start), 6), "prompt_tokens": prompt}
                row |= {"output_tokens": output, "session_id": pick(rng, ("", i % 3, -1))}
            case "mooncake":
                row = {"timestamp": int(start * 1000), "input_length": prompt}
                row |= {"output_length": output, "hash_ids": blocks[: -(-prompt // 512)]}
            case "llmservingsim":
                prompt = min(prompt, 300)
                row = {"arrival_time_ns": int(start * 1e9), "input_toks": prompt}
                row |= {"output_toks": output, "output_tok_ids": [1] * min(output, 4)}
                row["input_tok_ids"] = [int(t) for t in rng.integers(0, 4, prompt)]
            case _:
                row = {"arrival_s": float(start), "prompt_tokens": prompt, "output_tokens": output}
                row |= {"hash_ids": blocks[: -(-prompt // 16)], "session_id": i % 4}
                if chance(rng, 0.2):
                    row["priority"] = int(rng.integers(-2, 3))
        rows.append(row)
    return rows


def _serialise(trace_format: str, columns: list[str], rows: list[dict[str, Any]]) -> bytes:
    if TRACE_FORMATS[trace_format][0] == ".jsonl":
        lines = [json.dumps(row) for row in rows]
    else:
        lines = [",".join(columns)] + [
            ",".join("" if row.get(c) is None else str(row[c]) for c in columns) for row in rows
        ]
    return ("\n".join(lines) + "\n").encode() if lines else b""


def mutate_trace(
    rng: np.random.Generator, trace_format: str, columns: list[str], rows: list[dict[str, Any]]
) -> str:
    """Break a trace's rows or columns in place one way; say how."""
    is_json = TRACE_FORMATS[trace_format][0] == ".jsonl"
    operation = pick(
        rng, ("cell", "cell", "cell", "unsort", "duplicate time", "drop column", "drop cell")
    )
    if not rows:
        operation = "drop column"
    if operation in ("extra column", "drop column") or not columns:
        if not columns:
            return "no columns left"
        column = pick(rng, columns)
        columns.remove(column)
        for row in rows:
            row.pop(column, None)
        return f"drop column {column}"
    row = pick(rng, rows)
    match operation:
        case "cell":
            column = pick(rng, columns)
            row[column] = pick(rng, BAD_JSON) if is_json else pick(rng, BAD_CELLS)
            return f"{column} = {_short(row[column])}"
        case "unsort":
            order = rng.permutation(len(rows))
            rows[:] = [rows[i] for i in order]
            return "unsorted timestamps"
        case "duplicate time":
            time_column = columns[0]
            for other in rows:
                other[time_column] = rows[0].get(time_column)
            return "every timestamp equal"
    column = pick(rng, columns)
    row.pop(column, None)
    return f"drop {column} on one line"


def mutate_trace_bytes(rng: np.random.Generator, content: bytes) -> tuple[str, bytes]:
    """Break a trace file's bytes: ``(how, the new bytes)``."""
    match pick(rng, ("empty", "header only", "blank lines", "bom", "binary", "truncate", "crlf")):
        case "empty":
            return "empty file", b""
        case "header only":
            return "header only", content.split(b"\n", 1)[0] + b"\n"
        case "blank lines":
            return "blank lines", content.replace(b"\n", b"\n\n\n", 2)
        case "bom":
            return "byte-order mark", b"\xef\xbb\xbf" + content
        case "binary":
            prefix = pick(rng, (b"\x1f\x8b\x08", b"PAR1", b"\xff\xfe", b"\x00\x01", b"\xc3\x28"))
            where = int(rng.integers(len(content) + 1))
            return f"bytes {prefix!r}", content[:where] + prefix + content[where:]
        case "truncate":
            cut = int(rng.integers(len(content) + 1))
            return f"truncate at byte {cut}", content[:cut]
    return "CRLF line ends", content.replace(b"\n", b"\r\n")


def trace_case(rng: np.random.Generator) -> tuple[list[str], dict[str, Any], tuple[str, bytes]]:
    """A scenario replaying a small generated trace: ``(mutations, scenario, trace file)``."""
    trace_format = pick(rng, list(TRACE_FORMATS))
    suffix, valid_columns = TRACE_FORMATS[trace_format]
    columns = list(valid_columns)
    if trace_format in ("vidur", "servesim_csv") and chance(rng, 0.3):
        columns.remove(columns[0])  # a length-only trace
    if trace_format == "servesim_jsonl" and chance(rng, 0.3):
        columns.remove("arrival_s")
    num_rows = pick(rng, (0, 1, 2, 5, 20, 40))
    rows = _trace_rows(rng, trace_format, num_rows)
    for row in rows:
        for key in set(row) - set(columns) - {"priority", "session_id", "output_tok_ids"}:
            del row[key]
    mutations = [f"trace {trace_format}, {num_rows} rows"]
    for _ in range(pick(rng, (0, 0, 1, 1, 2, 3))):
        mutations.append(mutate_trace(rng, trace_format, columns, rows))
    if trace_format in ("servesim_csv", "vidur") and chance(rng, 0.15):
        columns.append("priority" if trace_format == "servesim_csv" else "extra")
        for row in rows:
            row[columns[-1]] = int(rng.integers(-3, 3))
        mutations.append(f"column {columns[-1]}")
    content = _serialise(trace_format, columns, rows)
    if chance(rng, 0.15):
        how, content = mutate_trace_bytes(rng, content)
        mutations.append(how)
    name = "trace" + pick(rng, (suffix, suffix, suffix, ".txt", ".json"))
    _, data = _base(rng)
    has_times = trace_format not in ("vidur", "servesim_csv", "servesim_jsonl") or any(
        c in columns for c in ("arrived_at", "arrival_s")
    )
    spec: dict[str, Any] = {"path": name}
    if chance(rng, 0.3):
        spec["format"] = pick(rng, (trace_format, trace_format, *TRACE_FORMATS, "csv"))
    if chance(rng, 0.2):
        spec["time_scale"] = pick(rng, (0.001, 0.5, 4.0, 1000.0))
    workload: dict[str, Any] = {"trace": spec, "num_requests": data["workload"]["num_requests"]}
    if has_times == chance(rng, 0.05):
        workload["arrival"] = _arrival(rng)
    if chance(rng, 0.15):
        workload["duration_s"] = pick(rng, (0.5, 5.0, 600.0))
    if chance(rng, 0.05):
        spec["path"] = pick(rng, ("missing.csv", ".", "scenario.yaml", ""))
    data["workload"] = workload
    if chance(rng, 0.5):
        data.setdefault("engine", {})["scheduling_policy"] = "priority"
    if chance(rng, 0.3):
        mutations.append(mutate_document(rng, data))
    return mutations, data, (name, content)


# ------------------------------------------------------------------------------------------
# Side files: a model's config.json, a calibration profile, an empirical length table

#: Llama-3.1-8B's dimensions: a smaller model would have millions of KV blocks on the H100 of
#: the default scenario (its blocks cannot be capped before the file exists, see keep_small).
HF_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "_name_or_path": "fuzz-llama",
}
PROFILE = ROOT / "profiles" / "h100-sxm_llama-3.1-8b_tp1.json"


def side_file_case(rng: np.random.Generator) -> tuple[list[str], dict[str, Any], tuple[str, bytes]]:
    """The default scenario with one file beside it, broken or not: ``(mutations, scenario,
    the file)``."""
    data = yaml.safe_load(dict(base_scenarios())["default"])
    data["workload"]["num_requests"] = int(rng.integers(1, MAX_CASE_REQUESTS + 1))
    kind = pick(rng, ("hf_config", "profile", "lengths"))
    document: Any
    match kind:
        case "hf_config":
            document = dict(HF_CONFIG)
            if chance(rng, 0.3):
                document |= {"num_local_experts": 4, "num_experts_per_tok": 2}
            name = "config.json"
            data["model"] = {"hf_config": pick(rng, (name, name, ".", "missing.json"))}
        case "profile":
            document = json.loads(PROFILE.read_text())
            name = "profile.json"
            data["latency"] = pick(rng, ({"profile": name}, {"type": "profile", "path": name}))
        case _:
            values = [int(v) for v in np.exp(rng.uniform(0, 7, int(rng.integers(0, 30))))]
            document = {"tokens": values}
            name = "lengths.csv"
            which = pick(rng, ("prompt_tokens", "output_tokens"))
            data["workload"][which] = {"type": "empirical", "path": name, "column": "tokens"}
            if chance(rng, 0.2):
                data["workload"][which]["column"] = pick(rng, ("Tokens", "", "0"))
    mutations = [f"side file {name}"]
    for _ in range(pick(rng, (0, 1, 1, 2))):
        if kind == "lengths" and document["tokens"]:
            i = int(rng.integers(len(document["tokens"])))
            document["tokens"][i] = pick(rng, BAD_CELLS)
            mutations.append(f"tokens[{i}] = {document['tokens'][i]!r}")
        elif kind != "lengths":
            mutations.append(mutate_document(rng, document))
    if kind == "lengths":
        content = ("tokens\n" + "".join(f"{v}\n" for v in document["tokens"])).encode()
    else:
        content = json.dumps(document, indent=1).encode()
    if chance(rng, 0.15):
        how, content = mutate_trace_bytes(rng, content)
        mutations.append(how)
    return mutations, data, (name, content)


# ------------------------------------------------------------------------------------------
# A case


def run_flags(rng: np.random.Generator) -> tuple[str, ...]:
    """Flags of ``servesim run``: mostly none; sometimes JSON, files, a seed or percentiles."""
    match pick(rng, ("none",) * 14 + ("json", "json", "out", "seed", "percentiles")):
        case "json":
            return ("--json",)
        case "out":
            return ("--out", "out", "--format", pick(rng, ("csv", "parquet", "vllm-bench")))
        case "seed":
            return ("--seed", str(pick(rng, (0, 7, 2**32, 2**64, -1))))
        case "percentiles":
            return ("--percentiles", pick(rng, ("99.9", "1,50,99.99", "abc", "0,100", "50,,90")))
    return ()


def generate_case(seed: int, index: int) -> Case:
    """Case ``index`` of the run seeded ``seed`` (the same pair always gives the same case)."""
    rng = np.random.default_rng([seed, index])
    family = pick(rng, ("mutated",) * 10 + ("knobs",) * 5 + ("yaml text",) * 2 + ("trace",) * 4)
    if family != "trace" and chance(rng, 0.1):
        family = "side file"
    files: tuple[tuple[str, bytes], ...] = ()
    if family == "trace":
        mutations, data, trace = trace_case(rng)
        files = (trace,)
    elif family == "side file":
        mutations, data, side = side_file_case(rng)
        files = (side,)
    else:
        name, data = _base(rng)
        mutations = [f"base {name}"]
        if family == "knobs":
            mutations += turn_knobs(rng, data)
        else:
            if chance(rng, 0.3):
                mutations += turn_knobs(rng, data)
            if family == "mutated":
                count = pick(rng, (1, 1, 1, 2, 2, 3, 4))
                mutations += [mutate_document(rng, data) for _ in range(count)]
    mutations += keep_small(data)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
    if family == "yaml text":
        how, text = mutate_text(rng, text)
        mutations.append(how)
    return Case(index, family, tuple(mutations), text, files, run_flags(rng))


# ------------------------------------------------------------------------------------------
# Running a case through the CLI


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException, so no ``except Exception`` in the code swallows it."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class _Capture:
    """Stands in for ``build`` inside the CLI, keeping the Simulation it returns."""

    simulation: Simulation | None = None
    scenario: Scenario | None = None

    def build(self, scenario: Scenario, **options: Any) -> Simulation:
        self.scenario = scenario
        self.simulation = build(scenario, **options)
        return self.simulation


_RUNNER = CliRunner()


def invoke(args: Sequence[str]) -> tuple[Result, _Capture]:
    """``servesim ARGS`` in-process, exactly as the command line runs it; and what it built."""
    capture = _Capture()
    with mock.patch.object(servesim.cli, "build", capture.build):
        result = _RUNNER.invoke(servesim.cli.app, list(args))
    return result, capture


@contextlib.contextmanager
def _in_directory(path: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def run_case(case: Case, workdir: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> Outcome:
    """Write the case into a fresh folder of ``workdir``, run ``check`` and ``run`` on it from
    there (its files' relative paths resolve beside the scenario), and judge what they did."""
    folder = workdir / f"case-{case.index}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "scenario.yaml").write_bytes(case.scenario)
    for name, content in case.files:
        (folder / name).write_bytes(content)
    try:
        with _in_directory(folder), _time_limit(timeout_s):
            check, _ = invoke(["check", "scenario.yaml"])
            ran, capture = invoke(["run", "scenario.yaml", *case.run_flags])
    except _Timeout:
        return _outcome(case, "timed out", f"Timeout: not done after {timeout_s:g} s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return judge(case, check, ran, capture)


def _outcome(case: Case, verdict: str, detail: str = "", **extra: Any) -> Outcome:
    return Outcome(case.index, case.family, verdict, detail, mutations=case.mutations, **extra)


def _crash(result: Result) -> tuple[str, str, str] | None:
    """``(detail, where, traceback)`` when an exception escaped or the exit code is not 0 or 2."""
    exception = result.exception
    if exception is None or isinstance(exception, SystemExit):
        if result.exit_code in (0, 2):
            return None
        return f"ExitCode: {result.exit_code}: {result.output[-300:]}", "", ""
    assert result.exc_info is not None
    frames = traceback.extract_tb(result.exc_info[2])
    ours = [f for f in frames if str(ROOT) in f.filename and "/.venv/" not in f.filename]
    last = (ours or frames)[-1] if frames else None
    where = "" if last is None else f"{Path(last.filename).name}:{last.lineno} in {last.name}"
    message = " ".join(str(exception).split())[:300]
    text = "".join(traceback.format_exception(*result.exc_info))
    return f"{type(exception).__name__}: {message}", where, text


def _refusal_problem(output: str) -> str | None:
    """Why an exit-2 output is not a clean refusal (None if it is)."""
    lines = [line for line in output.splitlines() if line.strip()]
    if "Traceback" in output:
        return "a traceback in the message"
    if not any(line.startswith(("error:", "invalid ")) for line in lines):
        return f"no error line: {output[:200]!r}"
    longest = max(len(line) for line in lines)
    if longest > MAX_MESSAGE_CHARS:
        return f"a line of {longest:,} characters"
    return None


def judge(case: Case, check: Result, ran: Result, capture: _Capture) -> Outcome:
    """The verdict on one case from what ``check`` and ``run`` did (see the module doc)."""
    for result in (check, ran):
        crash = _crash(result)
        if crash is not None:
            detail, where, text = crash
            return _outcome(case, "crashed", detail, where=where, traceback=text)
    longest = max((len(line) for line in (check.output + ran.output).splitlines()), default=0)
    if check.exit_code == ran.exit_code == 2:
        problem = _refusal_problem(check.output) or _refusal_problem(ran.output)
        if problem is not None:
            return _outcome(case, "refused unclearly", problem, longest_line=longest)
        last_line = ran.output.strip().splitlines()[-1][:200]
        return _outcome(case, "refused cleanly", last_line, longest_line=longest)
    if check.exit_code == 0 and ran.exit_code == 2 and _flag_refused(case, ran.output):
        return _outcome(case, "refused cleanly", ran.output.strip()[:200])
    if check.exit_code != ran.exit_code:
        detail = (
            f"check and run disagree: check exit {check.exit_code}, run exit {ran.exit_code}: "
            f"{(check.output + ran.output).strip()[:300]}"
        )
        return _outcome(case, "broke an invariant", detail)
    simulation = capture.simulation
    if simulation is None:
        return _outcome(case, "broke an invariant", "run exit 0 without a simulation")
    problem = invariant_problem(simulation, ran.stdout if "--json" in case.run_flags else None)
    if problem is not None:
        return _outcome(case, "broke an invariant", problem)
    return _outcome(case, "accepted")


def _flag_refused(case: Case, output: str) -> bool:
    """A ``run`` flag the command refused, which ``check`` does not take."""
    return bool(case.run_flags) and case.run_flags[0].lstrip("-") in output


# ------------------------------------------------------------------------------------------
# The invariants of an accepted run

FINAL = frozenset(status.value for status in RequestStatus)


def invariant_problem(simulation: Simulation, summary_json: str | None = None) -> str | None:
    """The first invariant the finished run breaks, in words; None when it keeps them all."""
    records = simulation.records
    requests = simulation.requests
    ids = [r.request_id for r in records]
    recording = simulation.scheduler.options.record_token_times
    if len(records) != len(requests) or sorted(ids) != sorted(r.request_id for r in requests):
        return f"requests conserved: {len(requests)} requests, {len(records)} records"
    if len(set(ids)) != len(ids):
        return "requests conserved: a request has two records"
    for record in records:
        if record.status is None or record.status.value not in FINAL:
            return f"requests conserved: request {record.request_id} has no final status"
        problem = _timestamp_problem(record, recording)
        if problem is not None:
            return f"timestamps ordered: request {record.request_id} ({record.status}): {problem}"
    problem = _kv_problem(simulation)
    if problem is not None:
        return f"KV blocks conserved: {problem}"
    if summary_json is not None:
        try:
            total = json.loads(summary_json)["requests"]["total"]
        except (ValueError, KeyError, TypeError) as exc:
            return f"--json: not a summary ({type(exc).__name__}: {exc})"
        if total != len(records):
            return f"requests conserved: the summary counts {total} of {len(records)}"
    return None


def _timestamp_problem(record: Any, recording: bool) -> str | None:
    times = (record.arrival_s, record.scheduled_s, record.first_token_s, record.finish_s)
    never_sent = record.status == RequestStatus.CANCELLED and all(math.isnan(t) for t in times)
    if not math.isfinite(record.arrival_s) and not never_sent:  # a later turn never released
        return f"arrival_s is {record.arrival_s}"
    present = [t for t in times if not math.isnan(t)]
    if present != sorted(present):
        return "arrival, scheduled, first token, finish out of order: " + ", ".join(
            f"{t:.9g}" for t in times
        )
    if record.status == RequestStatus.OK:
        if math.isnan(record.first_token_s) or math.isnan(record.finish_s):
            return "ok without a first token or finish time"
    elif record.status == RequestStatus.REJECTED and not math.isnan(record.first_token_s):
        return "rejected after its first token"
    tokens = record.token_times_s or []
    if recording and record.status == RequestStatus.OK and len(tokens) != record.output_tokens:
        return f"{len(tokens)} token times for {record.output_tokens} tokens"
    if tokens:
        if any(b < a for a, b in itertools.pairwise(tokens)):
            return "token times go backwards"
        if tokens[0] != record.first_token_s:
            return f"first token time {tokens[0]} is not first_token_s {record.first_token_s}"
        if record.status == RequestStatus.OK and tokens[-1] != record.finish_s:
            return f"last token time {tokens[-1]} is not finish_s {record.finish_s}"
    return None


def _kv_problem(simulation: Simulation) -> str | None:
    fleet = simulation.fleet
    if fleet is None:
        return "the run left no fleet"
    finished = [
        r.request_id
        for r in simulation.records
        if r.status is not None and r.status != RequestStatus.CANCELLED
    ]
    everything_finished = len(finished) == len(simulation.records)
    for replica in fleet.replicas:
        replica.sync()
        kv = replica.kv
        try:
            kv.check_invariants()
        except AssertionError as exc:
            return f"replica {replica.replica_id}: the cache's own check failed ({exc!r})"
        holding = [i for i in finished if kv.num_blocks_of(i)]
        scheduler = replica.scheduler
        if isinstance(scheduler, StaticBatchScheduler):
            # A static batch frees its members' blocks together, when the last one finishes.
            members = {seq.request_id for seq in scheduler.batch}
            holding = [i for i in holding if i not in members]
        if holding:
            return (
                f"replica {replica.replica_id}: finished request {holding[0]} still holds "
                f"{kv.num_blocks_of(holding[0])} blocks"
            )
        if everything_finished and kv.num_free_blocks != kv.num_blocks:
            return (
                f"replica {replica.replica_id}: {kv.num_blocks - kv.num_free_blocks} of "
                f"{kv.num_blocks} blocks held after every request finished"
            )
    return None


# ------------------------------------------------------------------------------------------
# Many cases, and the report


@dataclass
class Tally:
    """Verdicts so far, by verdict and by family, and the bad outcomes."""

    counts: Counter[str] = field(default_factory=Counter)
    by_family: Counter[tuple[str, str]] = field(default_factory=Counter)
    bad: list[Outcome] = field(default_factory=list)
    longest_refusal: tuple[int, int] = (0, -1)  # characters, case

    def add(self, outcome: Outcome) -> None:
        """Count one outcome."""
        self.counts[outcome.verdict] += 1
        self.by_family[outcome.family, outcome.verdict] += 1
        if outcome.verdict not in GOOD_VERDICTS:
            self.bad.append(outcome)
        elif outcome.longest_line > self.longest_refusal[0]:
            self.longest_refusal = (outcome.longest_line, outcome.index)

    @property
    def total(self) -> int:
        """Cases counted."""
        return sum(self.counts.values())


def fuzz(
    seed: int,
    indices: Sequence[int],
    workdir: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    jobs: int = 1,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Tally:
    """Generate and run cases ``indices`` of ``seed``, in ``jobs`` processes."""
    tally = Tally()
    work = [(seed, index, workdir, timeout_s) for index in indices]
    if jobs <= 1:
        outcomes: Iterator[Outcome] = map(_generate_and_run, work)
        for outcome in outcomes:
            tally.add(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
        return tally
    context = multiprocessing.get_context("fork")  # the workers inherit the imported modules
    with context.Pool(jobs, maxtasksperchild=500) as pool:
        for outcome in pool.imap_unordered(_generate_and_run, work, chunksize=8):
            tally.add(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    return tally


def _generate_and_run(work: tuple[int, int, Path, float]) -> Outcome:
    seed, index, workdir, timeout_s = work
    try:
        case = generate_case(seed, index)
    except Exception as exc:  # a bug of the generator, not of servesim: report it all the same
        text = traceback.format_exc()
        return Outcome(
            index, "generator", "crashed", f"generator {type(exc).__name__}: {exc}", "", text
        )
    return run_case(case, workdir, timeout_s)


def report(tally: Tally, seed: int, wall_s: float, jobs: int) -> str:
    """The table of verdicts, then the first few distinct bad outcomes with how to reproduce."""
    total = max(tally.total, 1)
    lines = [
        f"fuzz: {tally.total:,} cases (seed {seed}, {jobs} job{'s' * (jobs > 1)}) in "
        f"{wall_s:,.0f} s, {wall_s / total * 1e3:,.0f} ms per case",
        "",
        f"{'verdict':<20}{'cases':>8}{'share':>8}  target  "
        + "".join(f"{f:>11}" for f in FAMILIES),
    ]
    for verdict in VERDICTS:
        count = tally.counts[verdict]
        target = "" if verdict in GOOD_VERDICTS else "0"
        families = "".join(f"{tally.by_family[f, verdict]:>11,}" for f in FAMILIES)
        lines.append(f"{verdict:<20}{count:>8,}{count / total:>8.1%}  {target:<6}  {families}")
    families = "".join(f"{sum(tally.by_family[f, v] for v in VERDICTS):>11,}" for f in FAMILIES)
    lines.append(f"{'cases':<20}{tally.total:>8,}{1:>8.0%}  {'':<6}  {families}")
    size, index = tally.longest_refusal
    if index >= 0:
        lines.append(f"\nlongest clean refusal line kept: {size} characters (case {index})")
    distinct: dict[tuple[str, str, str], list[Outcome]] = {}
    for outcome in sorted(tally.bad, key=lambda o: o.index):
        distinct.setdefault(outcome.key, []).append(outcome)
    if distinct:
        lines.append(f"\n{len(distinct)} distinct problems (first case of each, up to 10):")
    for (verdict, _, where), outcomes in list(distinct.items())[:10]:
        first = outcomes[0]
        lines += [
            f"- {verdict} in {len(outcomes)} case(s), first case {first.index}: {first.detail}",
            *([f"  at {where}"] if where else []),
            f"  mutations: {'; '.join(first.mutations)}",
            f"  reproduce: .venv/bin/python benchmarks/fuzz.py --seed {seed} --case {first.index}",
        ]
    return "\n".join(lines)


def save_case(case: Case, outcome: Outcome, out: Path) -> Path:
    """Write a failing case where a person can rerun it: ``cd DIR && servesim run
    scenario.yaml``, with ``outcome.json`` and the traceback beside it."""
    folder = out / f"{outcome.verdict.replace(' ', '-')}-{case.index}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scenario.yaml").write_bytes(case.scenario)
    for name, content in case.files:
        (folder / name).write_bytes(content)
    document = {**asdict(outcome), "run_flags": list(case.run_flags)}
    (folder / "outcome.json").write_text(json.dumps(document, indent=2) + "\n")
    return folder


def replay(seed: int, index: int, timeout_s: float) -> int:
    """Print one case, what the CLI said, and its verdict; exit 1 if it is a bad one."""
    case = generate_case(seed, index)
    print(f"case {index} of seed {seed} ({case.family}): {'; '.join(case.mutations)}")
    print(f"run flags: {' '.join(case.run_flags) or '(none)'}")
    for name, content in (("scenario.yaml", case.scenario), *case.files):
        print(f"--- {name} ({len(content):,} bytes)")
        print(content[:3000].decode("utf-8", "replace"))
    with tempfile.TemporaryDirectory(prefix="servesim-fuzz-") as work:
        outcome = run_case(case, Path(work), timeout_s)
    print(f"--- verdict: {outcome.verdict} {outcome.detail}")
    if outcome.traceback:
        print(outcome.traceback)
    return 0 if outcome.verdict in GOOD_VERDICTS else 1


def main() -> None:
    """The benchmark's command line (see the module doc)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="save failing cases here")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per case, s")
    parser.add_argument("--case", type=int, default=None, help="replay this one case verbosely")
    args = parser.parse_args()
    if args.case is not None:
        sys.exit(replay(args.seed, args.case, args.timeout))
    started = time.perf_counter()
    seen = Counter[str]()

    def progress(outcome: Outcome) -> None:
        seen[outcome.verdict] += 1
        done = sum(seen.values())
        if done % 500 == 0:
            elapsed = time.perf_counter() - started
            counts = ", ".join(f"{v} {seen[v]}" for v in VERDICTS if seen[v])
            print(f"{done:,}/{args.cases:,} in {elapsed:,.0f} s: {counts}", file=sys.stderr)
        if args.out is not None and outcome.verdict not in GOOD_VERDICTS:
            save_case(generate_case(args.seed, outcome.index), outcome, args.out)

    with tempfile.TemporaryDirectory(prefix="servesim-fuzz-") as work:
        tally = fuzz(
            args.seed,
            range(args.cases),
            Path(work),
            timeout_s=args.timeout,
            jobs=args.jobs,
            on_outcome=progress,
        )
    print(report(tally, args.seed, time.perf_counter() - started, args.jobs))
    sys.exit(0 if not tally.bad else 1)


if __name__ == "__main__":
    main()
