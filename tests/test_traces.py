"""Trace readers: every real file in shared/data, plus malformed and adjusted input."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.request import SourceNamespace, block_keys, source_id
from sim.workload.traces import (
    TRACE_FORMATS,
    Trace,
    TraceFormatError,
    TraceWarning,
    detect_format,
    read_trace,
)

AZURE_CODE = "azure_llm_2023/AzureLLMInferenceTrace_code.csv"
AZURE_CONV = "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
MOONCAKE_CONVERSATION = "mooncake/conversation_trace.jsonl"
MOONCAKE_SYNTHETIC = "mooncake/synthetic_trace.jsonl"
VIDUR_CODE = "vidur/processed_traces/splitwise_code.csv"
VIDUR_CONV = "vidur/processed_traces/splitwise_conv.csv"
VIDUR_ARXIV = "vidur/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
VIDUR_SHAREGPT = "vidur/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
LLMSERVINGSIM = "vllm_real_runs/llmservingsim_workload_sharegpt-llama-3.1-8b-300-sps10.jsonl"

# (file, format, rows per SOURCES.md, first prompt, first output, has arrivals, has segments)
REAL_FILES = [
    (AZURE_CODE, "azure", 8819, 4808, 10, True, False),
    (AZURE_CONV, "azure", 19366, 374, 44, True, False),
    (MOONCAKE_CONVERSATION, "mooncake", 12031, 6758, 500, True, True),
    (MOONCAKE_SYNTHETIC, "mooncake", 3993, 40160, 6, True, True),
    (VIDUR_CODE, "vidur", 8819, 4808, 10, True, False),
    (VIDUR_CONV, "vidur", 19366, 374, 44, True, False),
    (VIDUR_ARXIV, "vidur", 28257, 3772, 54, False, False),
    (VIDUR_SHAREGPT, "vidur", 30731, 74, 918, False, False),
    (LLMSERVINGSIM, "llmservingsim", 300, 2358, 531, True, True),
]


@pytest.fixture(scope="module")
def real_traces(shared_data: Path) -> dict[str, Trace]:
    """Each real file read once (with automatic detection); reading them must not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return {name: read_trace(shared_data / name) for name, *_ in REAL_FILES}


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, records: Sequence[Mapping[str, object]]) -> Path:
    return write(path, "".join(json.dumps(record) + "\n" for record in records))


# --------------------------------------------------------------------------------------------
# Real files


@pytest.mark.parametrize(
    ("name", "trace_format", "num_rows", "first_prompt", "first_output", "timed", "segmented"),
    REAL_FILES,
)
def test_real_file_rows_and_first_values(
    real_traces: dict[str, Trace],
    shared_data: Path,
    name: str,
    trace_format: str,
    num_rows: int,
    first_prompt: int,
    first_output: int,
    timed: bool,
    segmented: bool,
) -> None:
    trace = real_traces[name]
    assert detect_format(shared_data / name) == trace_format
    assert trace.format == trace_format
    assert trace.path == str(shared_data / name)
    assert len(trace) == num_rows
    assert (trace.prompt_tokens[0], trace.output_tokens[0]) == (first_prompt, first_output)
    assert trace.prompt_tokens.dtype == np.int64 and trace.output_tokens.dtype == np.int64
    assert trace.prompt_tokens.min() >= 1 and trace.output_tokens.min() >= 1
    assert trace.session_ids is None
    assert (trace.segments is not None) == segmented
    assert (trace.arrival_s is not None) == timed
    if trace.arrival_s is not None:
        assert trace.arrival_s.dtype == np.float64
        assert trace.arrival_s[0] == 0.0
        assert np.all(np.diff(trace.arrival_s) >= 0)
    if trace.segments is not None:
        sums = [sum(length for _, length in segments) for segments in trace.segments]
        assert sums == trace.prompt_tokens.tolist()


def test_azure_conv_timestamps_are_exact(real_traces: dict[str, Trace]) -> None:
    trace = real_traces[AZURE_CONV]
    assert trace.arrival_s is not None
    # 18:15:50.9951690 - 18:15:46.6805900
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert trace.arrival_s[1] == 4.314579  # integer nanoseconds, so exact to the last digit
    assert (trace.prompt_tokens[1], trace.output_tokens[1]) == (396, 109)
    # Last row: 2023-11-16 19:14:08.4025270, 197, 183.
    assert trace.arrival_s[-1] == 3501.721937
    assert (trace.prompt_tokens[-1], trace.output_tokens[-1]) == (197, 183)


@pytest.mark.parametrize(("azure", "vidur"), [(AZURE_CODE, VIDUR_CODE), (AZURE_CONV, VIDUR_CONV)])
def test_azure_matches_vidurs_reprocessing_of_it(
    real_traces: dict[str, Trace], azure: str, vidur: str
) -> None:
    from_azure, from_vidur = real_traces[azure], real_traces[vidur]
    assert from_azure.arrival_s is not None and from_vidur.arrival_s is not None
    np.testing.assert_allclose(from_azure.arrival_s, from_vidur.arrival_s, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(from_azure.prompt_tokens, from_vidur.prompt_tokens)
    np.testing.assert_array_equal(from_azure.output_tokens, from_vidur.output_tokens)


@pytest.mark.parametrize("name", [MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC])
def test_mooncake_segments_follow_hash_ids(
    real_traces: dict[str, Trace], shared_data: Path, name: str
) -> None:
    trace = real_traces[name]
    assert trace.segments is not None and trace.arrival_s is not None
    with (shared_data / name).open() as handle:
        rows = [json.loads(line) for line in handle]
    first_ms = rows[0]["timestamp"]
    for index, (row, segments) in enumerate(zip(rows, trace.segments, strict=True)):
        assert [segment_id for segment_id, _ in segments] == [
            source_id(SourceNamespace.TRACE_BLOCK, hash_id) for hash_id in row["hash_ids"]
        ]
        assert all(length == 512 for _, length in segments[:-1])
        assert 1 <= segments[-1][1] <= 512
        assert sum(length for _, length in segments) == row["input_length"]
        assert trace.arrival_s[index] == (row["timestamp"] - first_ms) / 1000


def test_mooncake_shared_first_hash_id_means_shared_first_segment(
    real_traces: dict[str, Trace],
) -> None:
    segments = real_traces[MOONCAKE_CONVERSATION].segments
    assert segments is not None
    # Lines 1 and 2 of the file: hash_ids [0, 1, ...] and [0, 14, ...].
    assert segments[0][0] == segments[1][0]
    assert segments[0][1] != segments[1][1]
    # And the shared block survives re-blocking at the scenario's block size.
    keys_0 = block_keys(segments[0], 16, 1024)
    keys_1 = block_keys(segments[1], 16, 1024)
    assert keys_0[:32] == keys_1[:32]
    assert keys_0[32] != keys_1[32]


def test_llmservingsim_shared_token_prefix_gives_equal_segments(
    real_traces: dict[str, Trace], shared_data: Path
) -> None:
    trace = real_traces[LLMSERVINGSIM]
    assert trace.segments is not None and trace.arrival_s is not None
    with (shared_data / LLMSERVINGSIM).open() as handle:
        rows = [json.loads(line) for line in handle]
    assert trace.arrival_s[1] == (rows[1]["arrival_time_ns"] - rows[0]["arrival_time_ns"]) / 1e9
    # Requests 17 and 79 share their first 859 token ids: 53 whole pieces of 16, then differ.
    first, second = rows[17]["input_tok_ids"], rows[79]["input_tok_ids"]
    assert first[:859] == second[:859] and first[859] != second[859]
    assert trace.segments[17][:53] == trace.segments[79][:53]
    assert trace.segments[17][53] != trace.segments[79][53]
    assert all(length == 16 for _, length in trace.segments[17][:-1])
    # Prompts that start differently share nothing.
    assert trace.segments[0][0] != trace.segments[1][0]


def test_max_requests_stops_early(real_traces: dict[str, Trace], shared_data: Path) -> None:
    for name in (AZURE_CONV, MOONCAKE_CONVERSATION, VIDUR_ARXIV, LLMSERVINGSIM):
        head = read_trace(shared_data / name, max_requests=10)
        full = real_traces[name]
        assert len(head) == 10
        np.testing.assert_array_equal(head.prompt_tokens, full.prompt_tokens[:10])
        if head.arrival_s is not None and full.arrival_s is not None:
            np.testing.assert_array_equal(head.arrival_s, full.arrival_s[:10])
        if head.segments is not None and full.segments is not None:
            assert head.segments == full.segments[:10]
    with pytest.raises(ValueError, match="max_requests"):
        read_trace(shared_data / AZURE_CONV, max_requests=0)


def test_explicit_format_and_read_only_arrays(shared_data: Path) -> None:
    trace = read_trace(str(shared_data / VIDUR_CONV), "vidur", max_requests=3)
    assert trace.format == "vidur"
    with pytest.raises(ValueError, match="read-only"):
        trace.prompt_tokens[0] = 5
    with pytest.raises(ValueError, match="unknown trace format 'splitwise'"):
        read_trace(shared_data / VIDUR_CONV, "splitwise")


# --------------------------------------------------------------------------------------------
# Malformed input: the message names the file, the line and the column


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure_rows(num_rows: int) -> list[str]:
    return [f"2023-11-16 18:15:{i:02d}.0000000,{100 + i},{10 + i}\n" for i in range(num_rows)]


@pytest.mark.parametrize("bad", ["abc", "-3", "0", "nan", "", "12.5", "1e400"])
def test_bad_length_in_csv_names_file_line_and_column(tmp_path: Path, bad: str) -> None:
    rows = azure_rows(20)
    rows[15] = f"2023-11-16 18:15:15.0000000,{bad},5\n"  # data row 15 -> line 17
    path = write(tmp_path / "trace.csv", AZURE_HEADER + "".join(rows))
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:17: column 'ContextTokens': expected a positive integer")
    assert repr(bad) in message


def test_integral_float_lengths_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "lengths.csv", "prompt_tokens,output_tokens\n12.0,3\n")
    trace = read_trace(path)
    assert trace.format == "servesim_csv" and trace.arrival_s is None
    assert trace.prompt_tokens.tolist() == [12]


@pytest.mark.parametrize(
    "bad", ["2023-11-16", "2023-13-01 00:00:00.0", "2023-11-16 25:00:00.0", "yesterday"]
)
def test_bad_azure_timestamp(tmp_path: Path, bad: str) -> None:
    path = write(tmp_path / "t.csv", AZURE_HEADER + f"{bad},5,5\n")
    with pytest.raises(TraceFormatError, match=r"t\.csv:2: column 'TIMESTAMP'"):
        read_trace(path, "azure")


def test_azure_timestamps_parse_exactly_across_midnight(tmp_path: Path) -> None:
    path = write(
        tmp_path / "midnight.csv",
        AZURE_HEADER + "2023-11-16 23:59:59.9999999,5,5\n2023-11-17 00:00:00.0000001,5,5\n"
        "2023-11-17 00:00:01,5,5\n",
    )
    trace = read_trace(path)
    assert trace.arrival_s is not None
    assert trace.arrival_s.tolist() == [0.0, 2e-7, 1.0000001]


def test_missing_column_names_it_and_the_columns_found(tmp_path: Path) -> None:
    path = write(tmp_path / "short.csv", "arrived_at,num_prefill_tokens\n0.0,5\n")
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path, "vidur")
    message = str(caught.value)
    assert str(path) in message
    assert "'num_decode_tokens'" in message
    assert "columns found: 'arrived_at', 'num_prefill_tokens'" in message


def test_row_with_wrong_number_of_values(tmp_path: Path) -> None:
    path = write(tmp_path / "ragged.csv", "prompt_tokens,output_tokens\n5,5\n5\n")
    with pytest.raises(TraceFormatError, match=r"ragged\.csv:3: expected 2 comma-separated"):
        read_trace(path)


def test_malformed_json_line(tmp_path: Path) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + '{"timestamp": 5,\n')
    with pytest.raises(TraceFormatError, match=r"broken\.jsonl:3: malformed JSON"):
        read_trace(path)
    path.write_text(json.dumps(good) + "\n[1, 2]\n")
    with pytest.raises(TraceFormatError, match=r"broken\.jsonl:2: expected one JSON object"):
        read_trace(path, "mooncake")


def test_missing_json_field_names_line_field_and_fields_found(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "m.jsonl",
        [
            {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]},
            {"timestamp": 1, "input_length": 10, "hash_ids": [1]},
        ],
    )
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: missing required field 'output_length'")
    assert "'timestamp', 'input_length', 'hash_ids'" in message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("input_length", -4, "expected a positive integer, got -4"),
        ("output_length", 0, "expected a positive integer, got 0"),
        ("output_length", True, "expected a positive integer, got True"),
        ("input_length", "12", None),  # a numeric string is accepted
        ("timestamp", None, "expected a finite number, got None"),
        ("timestamp", "NaN", "expected a finite number, got 'NaN'"),
        ("hash_ids", [1, "2"], "expected a list of integers"),
        ("hash_ids", 7, "expected a list of integers, got 7"),
    ],
)
def test_bad_mooncake_values(
    tmp_path: Path, field: str, value: object, expected: str | None
) -> None:
    rows: list[dict[str, object]] = [
        {"timestamp": t, "input_length": 12, "output_length": 2, "hash_ids": [t]} for t in range(4)
    ]
    rows[2][field] = value
    path = jsonl(tmp_path / "bad.jsonl", rows)
    if expected is None:
        assert read_trace(path).prompt_tokens[2] == 12
        return
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    assert str(caught.value).startswith(f"{path}:3: field {field!r}: {expected}")


def test_llmservingsim_token_count_must_match_ids(tmp_path: Path) -> None:
    row = {"input_toks": 3, "output_toks": 2, "arrival_time_ns": 0, "input_tok_ids": [1, 2]}
    path = jsonl(tmp_path / "ids.jsonl", [row])
    with pytest.raises(TraceFormatError, match=r"ids\.jsonl:1: field 'input_tok_ids': has 2"):
        read_trace(path)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("empty.csv", ""),
        ("empty.jsonl", "\n\n"),
        ("header_only.csv", AZURE_HEADER),
    ],
)
def test_no_requests(tmp_path: Path, name: str, text: str) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(TraceFormatError, match="no requests") as caught:
        read_trace(path)
    assert str(path) in str(caught.value)
    explicit = "azure" if name.endswith(".csv") else "mooncake"
    with pytest.raises(TraceFormatError, match="no requests"):
        read_trace(path, explicit)


def test_latin1_bytes_name_file_line_and_offset(tmp_path: Path) -> None:
    header = b"prompt_tokens,output_tokens,comment\n"
    first = b"5,5,ok\n"
    path = tmp_path / "latin1.csv"
    path.write_bytes(header + first + "7,7,caf\u00e9\n".encode("latin-1"))
    offset = len(header) + len(first) + len(b"7,7,caf")
    with pytest.raises(TraceFormatError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: byte 0xe9 at byte offset {offset} is not valid UTF-8")
    path.write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(TraceFormatError, match=r"latin1\.csv:1: byte 0xe9"):
        detect_format(path)


def test_undetectable_format_lists_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path / "odd.csv", "a,b\n1,2\n")
    with pytest.raises(TraceFormatError) as caught:
        detect_format(path)
    message = str(caught.value)
    assert str(path) in message and "'a', 'b'" in message
    assert all(name in message for name in TRACE_FORMATS)
    path = jsonl(tmp_path / "odd.log", [{"x": 1}])
    with pytest.raises(TraceFormatError, match="from the keys 'x'"):
        detect_format(path)


def test_detection_by_content_for_other_extensions(tmp_path: Path) -> None:
    row = {"prompt_tokens": 5, "output_tokens": 2}
    assert detect_format(jsonl(tmp_path / "requests.txt", [row])) == "servesim_jsonl"
    assert detect_format(write(tmp_path / "r.txt", "prompt_tokens,output_tokens\n5,2\n")) == (
        "servesim_csv"
    )


def test_blank_lines_crlf_and_bom_keep_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "windows.csv"
    path.write_bytes(b"\xef\xbb\xbfprompt_tokens,output_tokens\r\n5,5\r\n\r\n6,6\r\nx,6\r\n")
    with pytest.raises(TraceFormatError, match=r"windows\.csv:5: column 'prompt_tokens'"):
        read_trace(path)
    path.write_bytes(b"\xef\xbb\xbfprompt_tokens,output_tokens\r\n5,5\r\n\r\n6,6\r\n")
    assert read_trace(path).prompt_tokens.tolist() == [5, 6]


# --------------------------------------------------------------------------------------------
# Adjusted input: out-of-order arrivals and block ids that disagree with the length


def test_unsorted_timestamps_are_sorted_stably_with_a_warning(tmp_path: Path) -> None:
    path = write(
        tmp_path / "unsorted.csv",
        "arrival_s,prompt_tokens,output_tokens,session_id\n"
        "10.0,1,1,\n12.0,2,2,7\n11.0,3,3,\n12.0,4,4,\n9.5,5,5,\n",
    )
    with pytest.warns(TraceWarning, match="2 request"):
        trace = read_trace(path)
    assert trace.arrival_s is not None and trace.session_ids is not None
    assert trace.arrival_s.tolist() == [0.0, 0.5, 1.5, 2.5, 2.5]
    assert trace.prompt_tokens.tolist() == [5, 1, 3, 2, 4]  # ties at 12.0 keep file order
    assert trace.output_tokens.tolist() == [5, 1, 3, 2, 4]
    assert trace.session_ids.tolist() == [-1, -1, -1, 7, -1]


def test_unsorted_mooncake_moves_segments_too(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 2000, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 100, "output_length": 2, "hash_ids": [3]},
    ]
    with pytest.warns(TraceWarning, match="1 request"):
        trace = read_trace(jsonl(tmp_path / "late.jsonl", rows))
    assert trace.arrival_s is not None and trace.segments is not None
    assert trace.arrival_s.tolist() == [0.0, 1.0]
    assert trace.prompt_tokens.tolist() == [100, 600]
    assert trace.segments[0] == ((source_id(SourceNamespace.TRACE_BLOCK, 3), 100),)


def test_duplicate_timestamps_do_not_warn(tmp_path: Path) -> None:
    path = write(
        tmp_path / "same.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens\n5,1,1\n5,2,2\n6,3,3\n",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = read_trace(path)
    assert trace.arrival_s is not None
    assert trace.arrival_s.tolist() == [0.0, 0.0, 1.0]


def test_mooncake_block_ids_that_disagree_with_the_length(tmp_path: Path) -> None:
    block = source_id(SourceNamespace.TRACE_BLOCK, 1)
    rows = [
        # Exact: ceil(1000 / 512) = 2 ids.
        {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]},
        # Too many ids: the length wins and the third id is dropped.
        {"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2, 3]},
        # Too few: the uncovered 300 tokens become content private to this request.
        {"timestamp": 2, "input_length": 812, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 3, "input_length": 812, "output_length": 1, "hash_ids": []},
    ]
    with pytest.warns(TraceWarning, match=r"3 request\(s\).*first on line 2"):
        trace = read_trace(jsonl(tmp_path / "mismatch.jsonl", rows))
    assert trace.segments is not None
    exact, extra, short, none = trace.segments
    assert extra == exact
    assert [length for _, length in exact] == [512, 488]
    assert short[0] == (block, 512) and short[1][1] == 300
    assert none[0][1] == 812
    private_ids = {short[1][0], none[0][0]}
    assert len(private_ids) == 2
    assert not private_ids & {segment_id for segment_id, _ in exact}


# --------------------------------------------------------------------------------------------
# Our own formats


def test_servesim_jsonl_full_schema(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {
            "arrival_s": 3.0,
            "prompt_tokens": 40,
            "output_tokens": 5,
            "session_id": 9,
            "hash_ids": [7, 8, 9],
            "extra": "ignored",
        },
        {
            "arrival_s": 3.5,
            "prompt_tokens": 20,
            "output_tokens": 1,
            "block_keys": [7, 4],
            "block_tokens": 10,
            "session_id": None,
        },
    ]
    trace = read_trace(jsonl(tmp_path / "ours.jsonl", rows))
    assert trace.format == "servesim_jsonl"
    assert trace.arrival_s is not None and trace.session_ids is not None
    assert trace.arrival_s.tolist() == [0.0, 0.5]
    assert trace.session_ids.tolist() == [9, -1]
    assert trace.segments == [
        tuple(
            (source_id(SourceNamespace.TRACE_BLOCK, h), n) for h, n in [(7, 16), (8, 16), (9, 8)]
        ),
        tuple((source_id(SourceNamespace.TRACE_BLOCK, h), 10) for h in [7, 4]),
    ]


def test_servesim_jsonl_length_only_and_all_or_none(tmp_path: Path) -> None:
    trace = read_trace(
        jsonl(tmp_path / "lengths.jsonl", [{"prompt_tokens": 4, "output_tokens": 2}])
    )
    assert trace.arrival_s is None and trace.segments is None and trace.session_ids is None
    path = jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 2},
            {"prompt_tokens": 4, "output_tokens": 2},
        ],
    )
    with pytest.raises(TraceFormatError, match=r"mixed\.jsonl:2: field 'arrival_s': the first"):
        read_trace(path)
    path = jsonl(
        tmp_path / "both.jsonl",
        [{"prompt_tokens": 4, "output_tokens": 2, "hash_ids": [1], "block_keys": [1]}],
    )
    with pytest.raises(TraceFormatError, match=r"both\.jsonl:1: has both"):
        read_trace(path)
    path = jsonl(tmp_path / "s.jsonl", [{"prompt_tokens": 4, "output_tokens": 2, "session_id": -2}])
    with pytest.raises(TraceFormatError, match=r"s\.jsonl:1: field 'session_id': expected an"):
        read_trace(path)


request_rows = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
        st.integers(min_value=1, max_value=100_000),
        st.integers(min_value=1, max_value=10_000),
        st.integers(min_value=-1, max_value=1000),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=request_rows, as_csv=st.booleans())
def test_servesim_round_trip(
    tmp_path: Path, rows: list[tuple[float, int, int, int]], as_csv: bool
) -> None:
    rows = sorted(rows, key=lambda row: row[0])
    if as_csv:
        path = write(
            tmp_path / "round.csv",
            "arrival_s,prompt_tokens,output_tokens,session_id\n"
            + "".join(f"{a!r},{p},{o},{s}\n" for a, p, o, s in rows),
        )
    else:
        path = jsonl(
            tmp_path / "round.jsonl",
            [
                {"arrival_s": a, "prompt_tokens": p, "output_tokens": o, "session_id": s}
                for a, p, o, s in rows
            ],
        )
    trace = read_trace(path)
    assert trace.format == ("servesim_csv" if as_csv else "servesim_jsonl")
    assert trace.arrival_s is not None
    assert trace.arrival_s.tolist() == [a - rows[0][0] for a, *_ in rows]
    assert trace.prompt_tokens.tolist() == [p for _, p, _, _ in rows]
    assert trace.output_tokens.tolist() == [o for *_, o, _ in rows]
    if as_csv or any(s != -1 for *_, s in rows):
        assert trace.session_ids is not None
        assert trace.session_ids.tolist() == [s for *_, s in rows]
    else:
        assert trace.session_ids is None
    assert all(math.isfinite(a) for a in trace.arrival_s)
