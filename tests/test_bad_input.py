"""Bad scenarios, catalogued: each gets one clear line naming the field and the fix, exit code 2,
never a traceback; and overloaded scenarios end, saying they were unstable.

(Bad traces and profiles: tests/test_bad_traces.py and tests/test_bad_profiles.py. The live
executor's faults: tests/test_client.py, tests/test_resume.py and tests/live/.)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from servesim.cli import app
from sim.engine.request import RequestStatus
from sim.run import build
from sim.scenario import ScenarioError, parse_scenario
from sim.simulation import MAX_SAMPLES
from tests.factories import scenario_dict
from tests.test_invariants import check_invariants, time_limit

runner = CliRunner()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(data: dict[str, Any]) -> Any:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        return data

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(data: dict[str, Any]) -> Any:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        del node[leaf]
        return data

    return mutate


def _odd_heads(data: dict[str, Any]) -> Any:
    data["model"] = {
        "name": "odd",
        "num_layers": 4,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "intermediate_size": 2048,
        "vocab_size": 32000,
    }
    data["engine"]["tensor_parallel_size"] = 8
    return data


def _endless_sessions(data: dict[str, Any]) -> Any:
    workload = data["workload"]
    del workload["num_requests"]
    workload["duration_s"] = 1e6
    workload["prefix"] = {
        "type": "multi_turn",
        "turns": {"type": "constant", "value": 1000},
        "think_time_s": 0,
    }
    return data


#: (case, how to break the default small scenario, words the one-line error must contain)
CASES: list[tuple[str, Callable[[dict[str, Any]], Any], tuple[str, ...]]] = [
    ("wrong type", _set("workload.arrival.rate", "fast"), ("workload.arrival.rate", "number")),
    ("negative rate", _set("workload.arrival.rate", -1), ("workload.arrival.rate", "> 0")),
    ("zero size", _set("engine.max_num_seqs", 0), ("engine.max_num_seqs", ">= 1")),
    ("negative length", _set("workload.prompt_tokens.value", -5), ("prompt_tokens", ">= 1")),
    ("unknown key", _set("engine.max_num_seq", 4), ("engine.max_num_seq", "max_num_seqs")),
    ("unknown section", _set("enigne", {}), ("enigne", "engine")),
    ("missing field", _delete("model"), ("model", "missing")),
    ("missing workload limit", _delete("workload.num_requests"), ("num_requests", "duration_s")),
    (
        "no chunking and a short budget",
        _set("engine", {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}),
        ("engine.max_num_batched_tokens", "enable_chunked_prefill"),
    ),
    ("TP not dividing the heads", _odd_heads, ("tensor_parallel_size", "12 attention heads")),
    ("model does not fit", _set("model", "llama-3.1-70b"), ("does not fit", "tensor_parallel")),
    ("10^9 requests", _set("workload.num_requests", 10**9), ("workload.num_requests", "<=")),
    (
        "an endless horizon",
        lambda d: _set("workload.duration_s", 1e12)(_delete("workload.num_requests")(d)),
        ("workload.duration_s", "shorten duration_s"),
    ),
    ("sessions without end", _endless_sessions, ("prefix.turns", "lower")),
    ("unknown model", _set("model", "llama-9"), ("model", "llama")),
    ("unknown GPU", _set("gpu", "h900"), ("gpu",)),
    ("a section that is not a mapping", _set("workload", None), ("workload",)),
]


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def assert_clean_error(output: str, exit_code: int, words: tuple[str, ...]) -> None:
    assert exit_code == 2, output
    assert "Traceback" not in output
    problems = [line for line in output.splitlines() if line.strip()]
    assert len(problems) <= 3, output  # a heading and one line per problem
    for word in words:
        assert word in output, (word, output)


@pytest.mark.parametrize(("case", "mutate", "words"), CASES, ids=[c[0] for c in CASES])
def test_each_bad_scenario_is_one_clear_line_and_exit_2(
    case: str,
    mutate: Callable[[dict[str, Any]], Any],
    words: tuple[str, ...],
    tmp_path: Path,
) -> None:
    data = mutate(scenario_dict())
    path = _write(tmp_path, data)
    result = runner.invoke(app, ["run", str(path)])
    assert_clean_error(result.output, result.exit_code, words)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", ("top level", "mapping")),
        (b"- 1\n- 2\n", ("top level", "mapping")),
        (b"model: [unclosed\n", ("line 2", "invalid YAML")),
        (b'model: !!python/object/apply:os.system ["true"]\n', ("invalid YAML", "tag")),
        (b"\xff\xfe\x00m\x00o", ("cannot read", "utf-8")),
        # Found by benchmarks/fuzz.py: two lines, the second naming "<unicode string>".
        (b"model: x\nseed: 1\x00\n", ("line 2, column 8", "unacceptable character")),
    ],
    ids=["empty", "a list", "broken YAML", "a python tag", "UTF-16 bytes", "a NUL byte"],
)
def test_files_that_are_not_scenarios(
    content: bytes, words: tuple[str, ...], tmp_path: Path
) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_bytes(content)
    result = runner.invoke(app, ["run", str(path)])
    assert_clean_error(result.output, result.exit_code, words)


def test_a_directory_or_a_missing_file(tmp_path: Path) -> None:
    for target, words in ((tmp_path, ("cannot read",)), (tmp_path / "no.yaml", ("not found",))):
        result = runner.invoke(app, ["run", str(target)])
        assert_clean_error(result.output, result.exit_code, words)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("engine.max_num_seqs", "engine.max_num_seqs"),  # a number
        ("workload.arrival", "workload.arrival"),  # a section
        ("workload.prompt_tokens.type", "workload.prompt_tokens"),  # a union's tag
        ("dtype", "dtype"),  # one of a few words
    ],
)
def test_a_huge_value_is_named_by_its_start_and_length(
    path: str, field: str, tmp_path: Path
) -> None:
    # Found by benchmarks/fuzz.py: each error line repeated the whole value given, so 20,000
    # characters in a number's place made a 20,000-character line.
    data = _set(path, "0" * 20_000)(scenario_dict())
    result = runner.invoke(app, ["check", str(_write(tmp_path, data))])
    assert_clean_error(result.output, result.exit_code, (field, "(20,002 characters)"))
    assert max(len(line) for line in result.output.splitlines()) < 300, result.output


def test_a_bad_empirical_length_table_is_named_by_its_field(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: an empty table said only pandas' "No columns to parse from
    # file", without the field it came from.
    (tmp_path / "lengths.csv").write_bytes(b"")
    data = scenario_dict()
    data["workload"]["output_tokens"] = {
        "type": "empirical",
        "path": str(tmp_path / "lengths.csv"),
        "column": "tokens",
    }
    result = runner.invoke(app, ["check", str(_write(tmp_path, data))])
    assert_clean_error(
        result.output, result.exit_code, ("workload.output_tokens.path:", "not a CSV table")
    )


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("gpu", "h100 " * 4000, ("gpu:", "unknown gpu", "characters cut", "known:")),
        ("model", "llama-" * 4000, ("model:", "unknown model", "characters cut")),
        ("workload.trace", {"path": "x" * 300}, ("workload.trace.path", "cannot read")),
    ],
    ids=["GPU name", "model name", "trace file name"],
)
def test_a_huge_name_ends_in_one_readable_line(
    path: str, value: Any, words: tuple[str, ...], tmp_path: Path
) -> None:
    # Found by benchmarks/fuzz.py: a catalogue lookup repeated a 20,000-character name whole,
    # and a file name longer than the file system takes was an OSError traceback.
    data = _set(path, value)(scenario_dict())
    if path == "workload.trace":
        for key in ("arrival", "prompt_tokens", "output_tokens"):
            del data["workload"][key]
    result = runner.invoke(app, ["check", str(_write(tmp_path, data))])
    assert_clean_error(result.output, result.exit_code, words)
    assert max(len(line) for line in result.output.splitlines()) < 1100, result.output


def test_an_unknown_key_with_invisible_characters_is_shown_escaped(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: a key holding a right-to-left override was printed as it
    # is, so the terminal showed the line reordered; a zero-width space was invisible.
    data = scenario_dict()
    data["engine"]["max_\u202enum_seqs\u200b"] = 4
    result = runner.invoke(app, ["check", str(_write(tmp_path, data))])
    assert_clean_error(
        result.output, result.exit_code, ("engine.max_\\u202enum_seqs\\u200b: unknown key",)
    )
    assert "\u202e" not in result.output and "\u200b" not in result.output


def test_a_duration_in_which_no_request_arrives_is_refused(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: an autoscaled run of no request was a ValueError traceback
    # (the fleet summary's max() over no samples); without autoscaling, an empty report.
    data = scenario_dict(fleet={"replicas": 1, "autoscaling": {"target": 500}})
    data["workload"].update({"arrival": {"type": "constant", "rate": 0.5}, "duration_s": 0.001})
    del data["workload"]["num_requests"]
    path = _write(tmp_path, data)
    for command in ("check", "run"):
        result = runner.invoke(app, [command, str(path)])
        words = ("workload.duration_s: no request arrives within 0.001 s",)
        assert_clean_error(result.output, result.exit_code, words)


def test_check_lists_every_problem_one_per_line(tmp_path: Path) -> None:
    data = scenario_dict()
    data["workload"]["arrival"]["rate"] = -1
    data["engine"]["max_num_seqs"] = 0
    data["engine"]["block_size"] = 7
    result = runner.invoke(app, ["check", str(_write(tmp_path, data))])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("  ")]
    assert len(lines) == 3
    assert {"workload.arrival.rate", "engine.max_num_seqs", "engine.block_size"} == {
        line.split(":")[0].strip() for line in lines
    }


# -- overload ------------------------------------------------------------------------------------
def overloaded(**simulator: Any) -> dict[str, Any]:
    """Arrivals at several times what one H100 can serve of 2,000-token prompts."""
    data = scenario_dict()
    data["workload"] = {
        "arrival": {"type": "poisson", "rate": 60},
        "prompt_tokens": {"type": "constant", "value": 2000},
        "output_tokens": {"type": "constant", "value": 300},
        "num_requests": 3000,
    }
    data["simulator"] = simulator
    return data


def test_an_overloaded_run_says_it_is_unstable_and_misses_its_slo() -> None:
    result = build(parse_scenario(overloaded())).run()
    stability = result.summary["stability"]
    assert stability["stable"] is False
    assert stability["arrival_rate_per_s"] == pytest.approx(60, rel=0.1)
    assert stability["capacity_per_s"] < stability["arrival_rate_per_s"] / 2
    assert stability["diverging_since_s"] < 30
    assert stability["message"].startswith("unstable: arrival rate ")
    assert result.summary["slo"]["met"] is False
    assert (result.records["status"] == "ok").all()  # it ran to the end: no bound was hit


def test_a_stable_run_says_so() -> None:
    data = overloaded()
    data["workload"]["arrival"]["rate"] = 2
    data["workload"]["num_requests"] = 300
    stability = build(parse_scenario(data)).run().summary["stability"]
    assert stability["stable"] is True and stability["message"] == ""


@pytest.mark.parametrize(
    ("simulator", "reason"),
    [
        ({"max_waiting_requests": 300}, "simulator.max_waiting_requests=300"),
        ({"max_simulated_s": 20}, "simulator.max_simulated_s"),
    ],
)
def test_a_bound_stops_the_run_and_every_request_keeps_a_status(
    simulator: dict[str, Any], reason: str
) -> None:
    result = build(parse_scenario(overloaded(**simulator))).run()
    records = result.records
    assert len(records) == 3000
    cancelled = records[records["status"] == RequestStatus.CANCELLED.value]
    assert len(cancelled) > 1000
    assert cancelled["error"].str.contains(reason, regex=False).all()
    stability = result.summary["stability"]
    assert stability["stable"] is False and reason in stability["stopped"]
    assert result.summary["sim"]["simulated_s"] < 200  # stopped, not run to the end


def test_the_cli_prints_the_unstable_line(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["run", str(_write(tmp_path, overloaded(max_waiting_requests=300)))]
    )
    assert result.exit_code == 0
    assert "unstable: arrival rate" in " ".join(result.output.split())


# -- fuzzing ---------------------------------------------------------------------------------------
#: Where to poke a valid scenario, and hostile values to poke it with.
FIELDS = [
    "seed", "dtype", "kv_cache_dtype", "engine.max_num_seqs", "engine.max_num_batched_tokens",
    "engine.block_size", "engine.max_model_len", "engine.tensor_parallel_size",
    "engine.pipeline_parallel_size", "engine.gpu_memory_utilization", "engine.batching",
    "engine.scheduling_policy", "engine.enable_chunked_prefill", "fleet.replicas",
    "fleet.router", "workload.arrival.rate", "workload.arrival.type",
    "workload.prompt_tokens.value", "workload.output_tokens.value", "workload.num_requests",
    "workload.prefix", "slo.ttft_s", "slo.percentile", "latency", "output.sample_interval_s",
    "simulator.max_waiting_requests", "unknown_section",
]  # fmt: skip
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, 2, 3, 7, 16, 64, 1000, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["bf16", "fp8", "int4", "continuous", "static", "priority", "none"]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["type", "value", "policy", "rate"]), st.integers(0, 5)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(FIELDS), HOSTILE), min_size=1, max_size=4))
def test_fuzzed_scenarios_fail_cleanly_or_run_with_the_invariants(
    pokes: list[tuple[str, Any]],
) -> None:
    data = scenario_dict()
    data["workload"]["num_requests"] = 30
    for path, value in pokes:
        data = _set(path, copy.deepcopy(value))(data)
    try:
        scenario = parse_scenario(data)
        if (scenario.workload.num_requests or 0) > 200:
            return  # valid but too big for a unit test
        simulation = build(scenario)
    except ScenarioError as exc:
        assert exc.problems and all("\n" not in p for p in exc.problems)
        return
    except ValueError as exc:  # an impossible setup: one line naming what to change
        assert str(exc) and "\n" not in str(exc).strip()
        return
    with time_limit(20):
        result = simulation.run()
    # The invariants read the engine knobs in force: the scenario with its defaults filled in.
    # (A scenario's dump leaves out the batch limits it filled in; its engine's has them.)
    effective = scenario.model_dump(mode="json")
    effective["engine"] = scenario.engine.model_dump(mode="json")
    effective["engine"]["max_model_len"] = simulation.max_model_len
    check_invariants(effective, simulation.scheduler.kv.num_blocks, simulation, result)


def test_a_length_past_32_bits_is_refused_and_a_sampled_tail_past_them_is_rejected() -> None:
    # Found by the fuzz above: a constant length of 2**31 wrapped to -2**31 in the workload's
    # int32 columns and stopped the run with an assertion.
    data = scenario_dict()
    data["workload"]["prompt_tokens"] = {"type": "constant", "value": 2**31}
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data)
    assert caught.value.problems == [
        "workload.prompt_tokens.value: must be <= 2147483647, got 2147483648"
    ]
    data["workload"]["num_requests"] = 20
    data["workload"]["prompt_tokens"] = {"type": "lognormal", "mu": 30, "sigma": 1}  # ~1e13
    records = build(parse_scenario(data)).run().records
    assert (records["status"] == RequestStatus.REJECTED.value).all()
    assert (records["prompt_tokens"] > 0).all()


@pytest.mark.parametrize("router", ["round_robin", "prefix_affinity"])
def test_turns_longer_than_any_context_are_rejected_without_their_block_keys(router: str) -> None:
    # 2**31 - 1 tokens a turn: the fleet used to hash every block of them (134 million keys,
    # gigabytes) before the replica rejected the request.
    data = scenario_dict(fleet={"replicas": 2, "router": {"policy": router}})
    data["workload"] = {
        "arrival": {"type": "poisson", "rate": 5},
        "prompt_tokens": {"type": "constant", "value": 2**31 - 1},
        "output_tokens": {"type": "constant", "value": 4},
        "prefix": {"type": "multi_turn", "turns": {"type": "constant", "value": 3},
                   "think_time_s": 1.0, "system_prompt_tokens": 64},
        "num_requests": 4,
    }  # fmt: skip
    records = build(parse_scenario(data)).run().records
    assert len(records) and (records["status"] == RequestStatus.REJECTED.value).all()
    assert records["error"].str.contains("exceed max_model_len").all()


def test_a_long_span_sampled_finely_stretches_the_interval_with_a_warning() -> None:
    data = scenario_dict()
    data["workload"] = {
        "arrival": {"type": "constant", "rate": 0.01},
        "prompt_tokens": {"type": "constant", "value": 64},
        "output_tokens": {"type": "constant", "value": 4},
        "num_requests": 5,  # arrivals 400 s apart
    }
    data["output"] = {"sample_interval_s": 0.001}  # 400,000+ samples asked for
    with pytest.warns(UserWarning, match="output.sample_interval_s"):
        result = build(parse_scenario(data)).run()
    times = result.timeseries["time_s"]
    assert times.diff().iloc[1] == pytest.approx(500 / MAX_SAMPLES)  # the last arrival at 500 s
    assert len(times) <= MAX_SAMPLES + 100  # and a few while the last request finishes
    assert (result.records["status"] == "ok").all()
