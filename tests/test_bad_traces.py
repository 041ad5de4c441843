"""A catalogue of bad trace files, each run through the CLI as a user would meet it.

For every format a scenario replays (``workload: {trace: {path, format: auto}}``), each bad
input ends with exit code 2 and one line naming the file, the line and the column or field; none
shows a traceback. Cases run in-process (CliRunner), where an uncaught exception would surface as
exit code 1 with ``result.exception`` set, so exit code 2 proves the error was handled. Chosen
behaviours that are not errors: timestamps that go backwards are sorted with a warning the user
sees on stderr (checked in a subprocess, as a user runs it), and duplicate timestamps are
simultaneous arrivals. Then: huge files are streamed, and hypothesis fuzzes servesim traces.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from servesim.cli import app
from sim.run import build
from sim.scenario import parse_scenario
from sim.workload.traces import TraceFormatError, TraceWarning, read_trace
from tests.test_invariants import check_invariants, time_limit, tiny_cache_scenario

runner = CliRunner()

NUM_ROWS = 5
BAD_ROW = 2  # 0-based data row that carries the bad value


@dataclass(frozen=True)
class Format:
    """How one trace format writes a request: its field names and a good row."""

    name: str
    suffix: str
    time: str
    prompt: str
    output: str
    row: Callable[[int], dict[str, object]]

    @property
    def is_csv(self) -> bool:
        return self.suffix == ".csv"

    def line_of(self, row_index: int) -> int:
        """The 1-based file line of a data row (CSV files have a header line)."""
        return row_index + (2 if self.is_csv else 1)


FORMATS = [
    Format(
        "azure",
        ".csv",
        "TIMESTAMP",
        "ContextTokens",
        "GeneratedTokens",
        lambda i: {
            "TIMESTAMP": f"2023-11-16 18:15:{i:02d}.6805900",
            "ContextTokens": 100 + i,
            "GeneratedTokens": 10 + i,
        },
    ),
    Format(
        "mooncake",
        ".jsonl",
        "timestamp",
        "input_length",
        "output_length",
        lambda i: {
            "timestamp": 1000 * i,
            "input_length": 600,
            "output_length": 10,
            "hash_ids": [2 * i, 2 * i + 1],
        },
    ),
    Format(
        "servesim_csv",
        ".csv",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        lambda i: {"arrival_s": 0.25 * i, "prompt_tokens": 100 + i, "output_tokens": 10},
    ),
    Format(
        "servesim_jsonl",
        ".jsonl",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        lambda i: {"arrival_s": 0.25 * i, "prompt_tokens": 100 + i, "output_tokens": 10},
    ),
    Format(
        "vidur",
        ".csv",
        "arrived_at",
        "num_prefill_tokens",
        "num_decode_tokens",
        lambda i: {"arrived_at": 0.25 * i, "num_prefill_tokens": 100 + i, "num_decode_tokens": 10},
    ),
    Format(
        "llmservingsim",
        ".jsonl",
        "arrival_time_ns",
        "input_toks",
        "output_toks",
        lambda i: {
            "input_toks": 20,
            "output_toks": 5,
            "arrival_time_ns": 250_000_000 * i,
            "input_tok_ids": list(range(i, i + 20)),
        },
    ),
]


def good_rows(fmt: Format) -> list[dict[str, object]]:
    return [fmt.row(i) for i in range(NUM_ROWS)]


def trace_text(fmt: Format, rows: list[dict[str, object]]) -> str:
    """CSV with the first row's columns as the header (cells as str), or one JSON per line."""
    if fmt.is_csv:
        columns = list(rows[0])
        lines = [",".join(columns)]
        lines += [",".join(str(row.get(column, "")) for column in columns) for row in rows]
    else:
        lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    return "\n".join(lines) + "\n"


def scenario_for(tmp_path: Path, trace: Path, **workload: Any) -> Path:
    """One H100 replaying ``trace`` with a constant step time (fast), as a YAML file."""
    data = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "seed": 1,
        "engine": {"max_model_len": 8192},
        "latency": {"type": "constant", "step_s": 0.005},
        "workload": {"trace": {"path": str(trace), "format": "auto"}, **workload},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def assert_one_line_error(
    result: Any, path: Path, line: int | None, field: str | None, *expected: str
) -> None:
    """Exit 2, one line, no traceback, naming the file, the line and the field."""
    output = result.output
    assert result.exit_code == 2, output
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output
    assert str(path) in output
    if line is not None:
        assert f"{path}:{line}:" in output, output
    if field is not None:
        assert f"{field!r}" in output, output
    for text in expected:
        assert text in output, (text, output)


def test_an_unknown_format_names_the_field(tmp_path: Path) -> None:
    # Found by benchmarks/fuzz.py: "unknown trace format 'csv'; ..." named no field.
    path = tmp_path / "trace.csv"
    path.write_text("prompt_tokens,output_tokens\n5,5\n")
    data = yaml.safe_load(scenario_for(tmp_path, path).read_text())
    data["workload"]["trace"]["format"] = "csv"
    data["workload"]["arrival"] = {"type": "poisson", "rate": 1}
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["check", str(scenario)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "error: workload.trace.format: unknown trace format 'csv'; use 'auto'" in result.output


@pytest.mark.parametrize("trace_format", ["azure", "auto"])
def test_a_long_header_is_listed_in_part(tmp_path: Path, trace_format: str) -> None:
    # Found by benchmarks/fuzz.py: a JSON line of 300 token ids read as a CSV header (format
    # azure) listed all its 303 "columns", a 1,762-character line; a JSON object with hundreds
    # of keys did the same. The list stops after a dozen names.
    record = {"input_toks": 300, "input_tok_ids": list(range(300))}
    record |= {f"key_{i}": i for i in range(200)}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(record) + "\n")
    scenario = yaml.safe_load(scenario_for(tmp_path, path).read_text())
    scenario["workload"]["trace"]["format"] = trace_format
    scenario["workload"]["num_requests"] = 5
    scenario_path = tmp_path / "scenario.yaml"
    scenario_path.write_text(yaml.safe_dump(scenario))
    result = runner.invoke(app, ["run", str(scenario_path)])
    assert_one_line_error(result, path, 1, None, "more")
    assert len(result.output) < 800, result.output


# --- bad values in one row ---------------------------------------------------------------------

#: (case, which field gets it, JSON value; CSV writes str(value)), expected message text.
BAD_VALUES: list[tuple[str, str, object, str]] = [
    ("non_numeric_length", "output", "many", "expected a positive integer, got"),
    ("nan_length", "prompt", math.nan, "expected a positive integer, got"),
    ("negative_length", "prompt", -5, "expected a positive integer, got"),
    ("zero_length", "output", 0, "expected a positive integer, got"),
    ("fractional_length", "prompt", 12.5, "expected a positive integer, got"),
    ("huge_length", "prompt", 10**20, "expected a positive integer, got"),
    ("empty_length", "output", "", "expected a positive integer, got"),
    ("nan_timestamp", "time", math.nan, "got"),
    ("infinite_timestamp", "time", math.inf, "got"),
    ("non_numeric_timestamp", "time", "soon", "got"),
]


def value_cases() -> list[Any]:
    return [
        pytest.param(fmt, field, value, text, id=f"{fmt.name}-{case}")
        for fmt in FORMATS
        for case, field, value, text in BAD_VALUES
        # Empty CSV cells and empty JSON strings are the same mistake; JSON has no bare "".
        if not (case == "empty_length" and not fmt.is_csv)
    ]


def write_bad_value(fmt: Format, tmp_path: Path, field: str, value: object) -> tuple[Path, str]:
    rows = good_rows(fmt)
    column = getattr(fmt, field)
    rows[BAD_ROW][column] = value
    path = tmp_path / f"trace{fmt.suffix}"
    path.write_text(trace_text(fmt, rows))
    return path, column


@pytest.mark.parametrize(("fmt", "field", "value", "text"), value_cases())
def test_bad_value_names_file_line_and_field(
    tmp_path: Path, fmt: Format, field: str, value: object, text: str
) -> None:
    path, column = write_bad_value(fmt, tmp_path, field, value)
    result = runner.invoke(app, ["run", str(scenario_for(tmp_path, path))])
    assert_one_line_error(result, path, fmt.line_of(BAD_ROW), column, text)


@pytest.mark.parametrize(("field", "value", "text"), [case[1:] for case in BAD_VALUES])
def test_check_reports_bad_values_too(tmp_path: Path, field: str, value: object, text: str) -> None:
    fmt = FORMATS[2]  # servesim_csv
    path, column = write_bad_value(fmt, tmp_path, field, value)
    result = runner.invoke(app, ["check", str(scenario_for(tmp_path, path))])
    assert_one_line_error(result, path, fmt.line_of(BAD_ROW), column, text)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda fmt: fmt.name)
def test_the_good_trace_runs(tmp_path: Path, fmt: Format) -> None:
    path = tmp_path / f"trace{fmt.suffix}"
    path.write_text(trace_text(fmt, good_rows(fmt)))
    result = runner.invoke(app, ["run", str(scenario_for(tmp_path, path)), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"]["total"] == NUM_ROWS


# --- missing columns and malformed rows --------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda fmt: fmt.name)
def test_missing_column_or_field(tmp_path: Path, fmt: Format) -> None:
    rows = good_rows(fmt)
    if fmt.is_csv:  # the header lacks it: line 1
        for row in rows:
            del row[fmt.output]
        line, expected = 1, f"missing required column(s) {fmt.output!r}; columns found:"
    else:  # one object lacks it
        del rows[BAD_ROW][fmt.output]
        line, expected = fmt.line_of(BAD_ROW), f"missing required field {fmt.output!r}"
    path = tmp_path / f"trace{fmt.suffix}"
    path.write_text(trace_text(fmt, rows))
    # A header without the column is not recognisable as this format any more: say which.
    trace_format = fmt.name if fmt.is_csv else "auto"
    data = yaml.safe_load(scenario_for(tmp_path, path).read_text())
    data["workload"]["trace"]["format"] = trace_format
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(scenario)])
    assert_one_line_error(result, path, line, None, expected)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda fmt: fmt.name)
def test_malformed_row(tmp_path: Path, fmt: Format) -> None:
    path = tmp_path / f"trace{fmt.suffix}"
    lines = trace_text(fmt, good_rows(fmt)).splitlines()
    bad_line = fmt.line_of(BAD_ROW)
    if fmt.is_csv:
        lines[bad_line - 1] += ",17"
        expected = "comma-separated values as in the header, got 4"
    else:
        lines[bad_line - 1] = lines[bad_line - 1][:-7]  # a line cut short
        expected = "malformed JSON at character"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["run", str(scenario_for(tmp_path, path))])
    assert_one_line_error(result, path, bad_line, None, expected)


# --- files that hold no requests, other encodings, binary files --------------------------------


def parquet_bytes(fmt: Format) -> bytes:
    frame = pd.DataFrame(
        [{k: v for k, v in row.items() if k != "hash_ids"} for row in good_rows(fmt)]
    )
    data = frame.drop(columns=["input_tok_ids"], errors="ignore").to_parquet(None)
    assert isinstance(data, bytes)
    return data


def latin1_bytes(fmt: Format) -> bytes:
    rows = good_rows(fmt)
    for row in rows:
        row["note"] = "ok"
    rows[BAD_ROW]["note"] = "café"
    return trace_text(fmt, rows).encode("latin-1")


#: (case, file bytes, line named or None, expected message text).
FILE_CASES: list[tuple[str, Callable[[Format], bytes], Callable[[Format], int | None], str]] = [
    ("empty", lambda fmt: b"", lambda fmt: None, "no requests"),
    ("blank_lines_only", lambda fmt: b"\n  \n\n", lambda fmt: None, "no requests"),
    (
        "header_only",
        lambda fmt: trace_text(fmt, good_rows(fmt)).split("\n")[0].encode() + b"\n",
        lambda fmt: None,
        "",
    ),
    (
        "utf16_with_bom",
        lambda fmt: trace_text(fmt, good_rows(fmt)).encode("utf-16"),
        lambda fmt: None,
        "UTF-16 text; re-encode it as UTF-8 (iconv -f utf-16 -t utf-8)",
    ),
    (
        "utf16_without_bom",
        lambda fmt: trace_text(fmt, good_rows(fmt)).encode("utf-16-le"),
        lambda fmt: 1,
        "NUL byte at byte offset 1",
    ),
    ("latin1", latin1_bytes, lambda fmt: fmt.line_of(BAD_ROW), "byte 0xe9 at byte offset"),
    (
        "gzip",
        lambda fmt: gzip.compress(trace_text(fmt, good_rows(fmt)).encode()),
        lambda fmt: None,
        "not a text trace: this is a gzip-compressed file; decompress it first",
    ),
    (
        "parquet",
        parquet_bytes,
        lambda fmt: None,
        "not a text trace: this is a Parquet file; convert it to CSV",
    ),
]


def file_cases() -> list[Any]:
    params = []
    for fmt in FORMATS:
        for case, make, line, text in FILE_CASES:
            if case == "header_only":
                if not fmt.is_csv:
                    continue  # a JSONL file has no header; its first line is a request
                text = "no requests (the file is empty or has only a header)"
            params.append(pytest.param(fmt, make, line, text, id=f"{fmt.name}-{case}"))
    return params


@pytest.mark.parametrize(("fmt", "make", "line", "text"), file_cases())
def test_unreadable_file_is_named_with_the_fix(
    tmp_path: Path,
    fmt: Format,
    make: Callable[[Format], bytes],
    line: Callable[[Format], int | None],
    text: str,
) -> None:
    path = tmp_path / f"trace{fmt.suffix}"
    path.write_bytes(make(fmt))
    result = runner.invoke(app, ["run", str(scenario_for(tmp_path, path))])
    assert_one_line_error(result, path, line(fmt), None, text)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".gz", ".parquet"])
def test_binary_garbage_under_any_name_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"trace{suffix}"
    path.write_bytes(bytes(range(256)) * 8)
    result = runner.invoke(app, ["check", str(scenario_for(tmp_path, path))])
    assert_one_line_error(result, path, 1, None, "NUL byte at byte offset 0")


# --- chosen behaviours that are not errors -----------------------------------------------------


def servesim(*args: str) -> subprocess.Popen[str]:
    """The CLI as a user runs it, started without waiting (the cases run side by side)."""
    return subprocess.Popen(
        [sys.executable, "-m", "servesim.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_backwards_timestamps_are_sorted_with_a_warning_on_stderr(tmp_path: Path) -> None:
    # The warning comes from the reader, whatever the format; two formats keep this quick.
    processes = {}
    for fmt in (FORMATS[0], FORMATS[1]):
        folder = tmp_path / fmt.name
        folder.mkdir()
        rows = good_rows(fmt)
        rows[1][fmt.time], rows[2][fmt.time] = rows[2][fmt.time], rows[1][fmt.time]
        path = folder / f"trace{fmt.suffix}"
        path.write_text(trace_text(fmt, rows))
        processes[fmt.name, path] = servesim("run", str(scenario_for(folder, path)), "--json")
    for (name, path), process in processes.items():
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, (name, stderr)
        assert json.loads(stdout)["requests"]["total"] == NUM_ROWS
        assert "Traceback" not in stderr
        assert f"{path}: 1 request(s) arrive earlier than the request on the line before" in stderr
        assert "sorted all requests by arrival time" in stderr


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda fmt: fmt.name)
def test_duplicate_timestamps_are_simultaneous_arrivals(tmp_path: Path, fmt: Format) -> None:
    rows = good_rows(fmt)
    rows[1][fmt.time] = rows[2][fmt.time] = rows[0][fmt.time]
    path = tmp_path / f"trace{fmt.suffix}"
    path.write_text(trace_text(fmt, rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)  # no "sorted" warning for ties
        result = runner.invoke(app, ["run", str(scenario_for(tmp_path, path)), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"]["total"] == NUM_ROWS


# --- huge files are streamed -------------------------------------------------------------------

HUGE_NUM_LINES = 2_000_000


@pytest.fixture(scope="module")
def huge_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-million-request servesim CSV (~30 MB) whose last line is garbage."""
    path = tmp_path_factory.mktemp("huge") / "huge.csv"
    row = "{:.3f},512,64\n"
    with path.open("w") as handle:
        handle.write("arrival_s,prompt_tokens,output_tokens\n")
        for start in range(0, HUGE_NUM_LINES, 100_000):
            handle.write("".join(map(row.format, range(start, start + 100_000))))
        handle.write("garbage,that never,gets read\n")
    return path


def test_a_huge_trace_is_read_only_as_far_as_needed(huge_trace: Path) -> None:
    size = huge_trace.stat().st_size
    tracemalloc.start()
    try:
        trace = read_trace(huge_trace, max_requests=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The garbage last line was never reached, and memory stayed far below the file's size.
    assert len(trace) == 100 and trace.arrival_s is not None
    assert trace.arrival_s[-1] == 99.0
    assert peak < size / 100, (peak, size)


def test_a_huge_trace_with_num_requests_runs_through_the_cli(
    tmp_path: Path, huge_trace: Path
) -> None:
    scenario = scenario_for(tmp_path, huge_trace, num_requests=100)
    result = runner.invoke(app, ["run", str(scenario), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"]["total"] == 100


def test_a_line_longer_than_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sim.workload.traces.MAX_LINE_BYTES", 1000)
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n" + "9" * 5000 + ",1,1\n")
    with pytest.raises(TraceFormatError, match=r"trace\.csv:3: line longer than"):
        read_trace(path)


# --- fuzzing -----------------------------------------------------------------------------------

FIELDS = ("arrival_s", "prompt_tokens", "output_tokens", "session_id")

values = st.one_of(
    st.integers(1, 300),  # valid lengths and times, most of the time
    st.integers(1, 300),
    st.floats(0, 50),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["nan", "inf", "-1", "1e400", "12.0", " 7 ", "\ufeff", 'é,"x']),
    st.none(),
    st.booleans(),
)


@st.composite
def fuzz_rows(draw: st.DrawFn) -> list[dict[str, object]]:
    """Mostly well-formed servesim rows (unsorted, ties, far-apart times), with up to three
    cells replaced by arbitrary values or removed.
    """
    has_arrival, has_session = draw(st.booleans()), draw(st.booleans())
    times = st.one_of(st.floats(-1e3, 1e3), st.integers(-(10**6), 10**6), st.just(0.5))
    rows: list[dict[str, object]] = []
    for _ in range(draw(st.integers(0, 8))):
        row: dict[str, object] = {
            "prompt_tokens": draw(st.integers(1, 400)),
            "output_tokens": draw(st.integers(1, 300)),
        }
        if has_arrival:
            row["arrival_s"] = draw(times)
        if has_session:
            row["session_id"] = draw(st.one_of(st.integers(-1, 5), st.none()))
        rows.append(row)
    for _ in range(draw(st.integers(0, 3)) if rows else 0):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        field = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()):
            row.pop(field, None)
        else:
            row[field] = draw(values)
    return rows


def fuzz_text(rows: list[dict[str, object]], as_csv: bool) -> str:
    if as_csv:
        columns = sorted({key for row in rows for key in row}, key=FIELDS.index)
        lines = [",".join(columns)] + [
            ",".join("" if row.get(c) is None else str(row.get(c)) for c in columns) for row in rows
        ]
    else:
        lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    return "\n".join(lines) + "\n"


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=fuzz_rows(), as_csv=st.booleans())
def test_fuzzed_traces_read_cleanly_or_fail_with_one_clean_line(
    tmp_path: Path, rows: list[dict[str, object]], as_csv: bool
) -> None:
    path = tmp_path / ("fuzz.csv" if as_csv else "fuzz.jsonl")
    path.write_text(fuzz_text(rows, as_csv), encoding="utf-8")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            trace = read_trace(path)
    except TraceFormatError as error:
        message = str(error)
        assert message.startswith(str(path)) and "\n" not in message, message
        event("refused by the reader")
        return
    # What reads is a valid trace: positive lengths, arrivals from 0, finite and ordered.
    assert 1 <= len(trace) <= len(rows)
    assert (trace.prompt_tokens >= 1).all() and (trace.output_tokens >= 1).all()
    data = tiny_cache_scenario(24)
    workload: dict[str, Any] = {"trace": {"path": str(path)}, "num_requests": len(trace)}
    if trace.arrival_s is None:
        workload["arrival"] = {"type": "poisson", "rate": 50}
    else:
        arrivals = trace.arrival_s
        assert arrivals[0] == 0.0 and bool((arrivals[1:] >= arrivals[:-1]).all())
        assert bool(pd.Series(arrivals).notna().all()) and math.isfinite(arrivals[-1])
        if arrivals[-1] > 100:
            # The time series samples every interval over the whole span; compress long ones.
            workload["trace"]["time_scale"] = 100 / arrivals[-1]
    data["workload"] = workload
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            simulation = build(parse_scenario(data))
    except ValueError as error:
        assert "\n" not in str(error) and str(error).startswith("workload"), str(error)
        event("refused by the scenario")
        return
    with time_limit(10):
        result = simulation.run()
    check_invariants(data, 24, simulation, result)
    event("simulated")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Integers beyond int64 used to escape as OverflowError (a traceback in the CLI).
        (f'{{"arrival_s": {10**400}, "prompt_tokens": 1, "output_tokens": 1}}\n', ":1: field"),
        # Finite times whose span is not (it used to become an arrival time of inf).
        (
            '{"arrival_s": -1e308, "prompt_tokens": 1, "output_tokens": 1}\n'
            '{"arrival_s": 1e308, "prompt_tokens": 1, "output_tokens": 1}\n',
            "check the unit of the arrival column",
        ),
    ],
    ids=["int_beyond_int64", "span_beyond_float"],
)
def test_timestamps_that_overflow_are_clean_errors(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    result = runner.invoke(app, ["run", str(scenario_for(tmp_path, path))])
    assert_one_line_error(result, path, None, None, expected)
