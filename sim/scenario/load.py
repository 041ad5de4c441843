"""Reading a scenario: YAML parsing with file:line:column errors, validation into a
:class:`Scenario`, the consistency checks across sections, the embedded default scenario, and
writing a scenario back as YAML."""

from __future__ import annotations

import warnings
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sim.engine.quantization import QuantizationWarning, compute_dtype
from sim.files import safe_load_limited
from sim.scenario.errors import ScenarioError, format_errors
from sim.scenario.model import Scenario
from sim.scenario.sections import ProfileLatencySpec


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    """Validate a parsed YAML/JSON document; raise :class:`ScenarioError` listing every problem."""
    if not isinstance(data, dict):
        raise ScenarioError(
            [f"(top level): expected a mapping of sections, got {type(data).__name__}"], source
        )
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_errors(exc, data), source) from None
    problems = check_consistency(scenario)
    if problems:
        raise ScenarioError(problems, source)
    return scenario


def check_consistency(scenario: Scenario) -> list[str]:
    """Knob combinations that validate one by one but cannot work together."""
    problems: list[str] = []
    try:
        model = scenario.resolve_model()
    except ValueError as exc:
        return [f"model: {exc}"]
    try:
        gpu = scenario.resolve_gpu()
    except ValueError as exc:
        return [f"gpu: {exc}"]
    engine = scenario.engine
    tp = engine.tensor_parallel_size
    if model.num_attention_heads % tp:
        problems.append(
            f"engine.tensor_parallel_size: {tp} does not divide the model's "
            f"{model.num_attention_heads} attention heads; use a divisor"
        )
    if engine.max_model_len and engine.max_model_len > model.max_position_embeddings:
        problems.append(
            f"engine.max_model_len: {engine.max_model_len} exceeds the model's "
            f"max_position_embeddings ({model.max_position_embeddings}); vLLM refuses it"
        )
    kv_heads = model.num_key_value_heads
    if tp % kv_heads and kv_heads % tp:
        problems.append(
            f"engine.tensor_parallel_size: {tp} and the model's {kv_heads} KV heads must divide "
            "one another"
        )
    latency = scenario.latency
    if isinstance(latency, ProfileLatencySpec):
        problems += _file_problem("latency.path", "profile", latency.path)
    trace = scenario.workload.trace
    if trace is not None:
        problems += _file_problem("workload.trace.path", "file", trace.path)
    max_model_len = engine.max_model_len or model.max_position_embeddings
    if not engine.enable_chunked_prefill and engine.max_num_batched_tokens < max_model_len:
        problems.append(
            f"engine.max_num_batched_tokens: {engine.max_num_batched_tokens} is below "
            f"max_model_len={max_model_len} with chunked prefill off, so long prompts could never "
            "be scheduled; raise it, lower engine.max_model_len, or set enable_chunked_prefill"
        )
    if engine.max_num_batched_tokens < engine.max_num_seqs:
        problems.append(
            f"engine.max_num_batched_tokens: {engine.max_num_batched_tokens} is below "
            f"max_num_seqs={engine.max_num_seqs}; vLLM requires it to be at least max_num_seqs"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QuantizationWarning)
            compute_dtype(scenario.dtype, scenario.quantization, gpu)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _file_problem(field: str, noun: str, path: str) -> list[str]:
    """A one-line problem if ``path`` is not a file ([] if it is)."""
    if not path.strip():  # Path("") is the current directory
        return [f"{field}: empty; give the {noun}'s path"]
    try:
        if Path(path).is_dir():
            return [f"{field}: {path} is a directory; give the {noun}'s own file"]
        if not Path(path).is_file():
            return [f"{field}: {noun} not found: {path}"]
    except OSError as exc:  # a name longer than the file system takes, say
        return [f"{field}: cannot read {path}: {exc.strerror or exc}"]
    return []


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError([f"file not found: {path}"], str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError([f"cannot read {path}: {exc}"], str(path)) from None
    return parse_scenario(parse_yaml(text, str(path)), str(path))


def parse_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` within sim.files' size, depth and alias limits, with errors reported
    as file:line:column."""
    try:
        return safe_load_limited(text)
    except ValueError as exc:  # a limit crossed
        raise ScenarioError([f"not read as YAML: {exc}"], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if isinstance(exc, yaml.reader.ReaderError):
            # A character YAML refuses (a NUL byte): no mark, only an offset, and a second line
            # naming "<unicode string>" instead of the file.
            before = text[: exc.position]
            line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
            where = f"line {line}, column {column}: "
            problem = problem.splitlines()[0]
        problem = " ".join(problem.split())
        raise ScenarioError([f"{where}invalid YAML: {problem}"], source) from None


DEFAULT_SCENARIO_FILE = "default_scenario.yaml"


def default_scenario_text() -> str:
    """The embedded default scenario (Llama-3.1-8B on one H100 SXM, chat traffic)."""
    return resources.files("sim").joinpath(DEFAULT_SCENARIO_FILE).read_text(encoding="utf-8")


def default_scenario() -> Scenario:
    """The embedded default scenario, validated."""
    return parse_scenario(
        parse_yaml(default_scenario_text(), "default scenario"), "default scenario"
    )


def scenario_to_yaml(scenario: Scenario) -> str:
    """The scenario as YAML that :func:`load_scenario` reads back to an equal scenario."""
    return yaml.safe_dump(scenario.model_dump(mode="json", exclude_none=True), sort_keys=False)
