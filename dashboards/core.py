"""What the pages share, free of Streamlit so it can be tested directly: presets, turning
uploads into scenarios (safely, with size caps and errors as text), the scenario's content
hash, and running it through the simulator.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.files import safe_load_limited
from sim.run import SimResult, build
from sim.scenario import (
    Scenario,
    ScenarioError,
    default_scenario_text,
    parse_scenario,
)
from sim.workload.traces import TraceFormatError, read_trace

#: Largest scenario YAML and trace accepted from an upload.
MAX_SCENARIO_BYTES = 256 * 1024
MAX_TRACE_BYTES = 50 * 1024 * 1024


def default_data() -> dict[str, Any]:
    """The embedded default scenario as a plain dict."""
    data: dict[str, Any] = yaml.safe_load(default_scenario_text())
    return data


def _with(base: dict[str, Any], **sections: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for key, value in sections.items():
        data[key] = value
    return data


def presets() -> dict[str, dict[str, Any]]:
    """Starting points a planner picks from: each a whole scenario dict."""
    base = default_data()
    chat = _with(base, name="chat")
    rag = _with(
        base,
        name="rag-long-prompts",
        workload={
            "arrival": {"type": "poisson", "rate": 2},
            "prompt_tokens": {"type": "lognormal", "mean": 6000, "p90": 12000, "max_tokens": 30000},
            "output_tokens": {"type": "lognormal", "mean": 300, "p90": 600},
            "prefix": {"type": "shared", "num_groups": 8, "prefix_tokens": 2000, "share": 0.6},
            "num_requests": 600,
        },
        engine={**base.get("engine", {}), "max_model_len": 32768},
        slo={"ttft_s": 2.0, "tpot_s": 0.05, "percentile": 90},
    )
    code = _with(
        base,
        name="code-completion",
        workload={
            "arrival": {"type": "gamma", "rate": 20, "cv": 2},
            "prompt_tokens": {"type": "lognormal", "mean": 1500, "p90": 3000, "max_tokens": 8000},
            "output_tokens": {"type": "lognormal", "mean": 40, "p90": 80},
            "num_requests": 2000,
        },
        slo={"ttft_s": 0.2, "tpot_s": 0.03, "percentile": 90},
    )
    agent = _with(
        base,
        name="agentic-multi-turn",
        workload={
            "arrival": {"type": "poisson", "rate": 1},
            "prompt_tokens": {"type": "lognormal", "mean": 300, "p90": 650, "max_tokens": 4000},
            "output_tokens": {"type": "lognormal", "mean": 150, "p90": 330, "max_tokens": 1500},
            "prefix": {
                "type": "multi_turn",
                "turns": {"type": "uniform", "low": 3, "high": 8},
                "think_time_s": 8,
                "system_prompt_tokens": 1500,
            },
            "num_requests": 800,
        },
        fleet={"replicas": 2, "router": {"policy": "prefix_affinity"}},
        slo={"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90},
    )
    return {"Chat": chat, "RAG, long prompts": rag, "Code completion": code, "Agentic": agent}


@dataclass(frozen=True)
class Parsed:
    """A scenario from user input, or the lines saying what is wrong with it."""

    scenario: Scenario | None
    errors: list[str]


def parse_yaml_text(text: str, source: str = "scenario") -> Parsed:
    """Parse and validate scenario YAML (``yaml.safe_load`` only; no tags, no objects)."""
    if len(text.encode("utf-8")) > MAX_SCENARIO_BYTES:
        return Parsed(None, [f"{source}: larger than {MAX_SCENARIO_BYTES // 1024} KB"])
    try:
        data = safe_load_limited(text)
    except ValueError as exc:  # nested too deep or too many aliases
        return Parsed(None, [f"{source}: not read as YAML: {exc}"])
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return Parsed(None, [f"{source}: not valid YAML{where}: {getattr(exc, 'problem', exc)}"])
    return parse_data(data, source)


def parse_data(data: Any, source: str = "scenario") -> Parsed:
    """Validate a scenario dict; the simulator's own checks, errors as lines."""
    if not isinstance(data, dict):
        return Parsed(None, [f"{source}: must be a mapping of sections (model, gpu, workload…)"])
    try:
        return Parsed(parse_scenario(data, source), [])
    except ScenarioError as exc:
        return Parsed(None, exc.problems)


def parse_upload(content: bytes, source: str = "upload") -> Parsed:
    """An uploaded scenario file: size-capped, UTF-8, then :func:`parse_yaml_text`."""
    if len(content) > MAX_SCENARIO_BYTES:
        return Parsed(None, [f"{source}: larger than {MAX_SCENARIO_BYTES // 1024} KB"])
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return Parsed(None, [f"{source}: not UTF-8 text"])
    return parse_yaml_text(text, source)


def store_trace(content: bytes, suffix: str, directory: Path) -> tuple[Path | None, str]:
    """Check an uploaded trace and keep it under ``directory`` by its content hash (the
    uploader's file name never becomes a path); (path, "") or (None, what is wrong)."""
    if len(content) > MAX_TRACE_BYTES:
        return None, f"trace: larger than {MAX_TRACE_BYTES // 2**20} MB"
    if suffix not in (".csv", ".jsonl"):
        return None, "trace: upload a .csv or .jsonl file in a format servesim reads"
    digest = hashlib.sha256(content).hexdigest()[:16]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"trace-{digest}{suffix}"
    path.write_bytes(content)
    try:
        trace = read_trace(path, "auto", max_requests=None)
    except TraceFormatError as exc:
        path.unlink(missing_ok=True)
        return None, str(exc).replace(str(path), "the uploaded trace")
    if len(trace) == 0:
        return None, "trace: no requests in the file"
    return path, ""


def upload_directory() -> Path:
    """Where uploaded traces are kept for this process (a private temporary directory)."""
    global _UPLOADS
    if _UPLOADS is None:
        _UPLOADS = Path(tempfile.mkdtemp(prefix="servesim-uploads-"))
    return _UPLOADS


_UPLOADS: Path | None = None


def content_key(scenario: Scenario) -> str:
    """A hash of everything the simulation depends on (the cache key)."""
    canonical = json.dumps(scenario.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def simulate(scenario: Scenario) -> SimResult:
    """Run the scenario; ValueError (impossible setup) passes through for the page to show."""
    return build(scenario).run()


def scenario_yaml(scenario: Scenario | dict[str, Any]) -> str:
    """The scenario as YAML for download (in memory; nothing is written)."""
    data = (
        scenario.model_dump(mode="json", exclude_none=True)
        if isinstance(scenario, Scenario)
        else scenario
    )
    return yaml.safe_dump(data, sort_keys=False)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"engine.max_num_seqs": 256, …}`` from nested sections (lists kept whole)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def records_csv(records: pd.DataFrame) -> bytes:
    """The per-request table as CSV bytes for download."""
    buffer = io.StringIO()
    records.to_csv(buffer, index=False)
    return buffer.getvalue().encode()
