"""The trace-reading modules agree on the formats: every format has a reader and its fields."""

from __future__ import annotations

from sim.workload import trace_formats, traces


def test_every_format_has_a_reader_and_required_fields() -> None:
    assert traces.TRACE_FORMATS == (
        "azure",
        "mooncake",
        "vidur",
        "servesim_jsonl",
        "servesim_csv",
        "llmservingsim",
    )
    assert set(trace_formats.REQUIRED_FIELDS) == set(traces.TRACE_FORMATS)
    assert trace_formats.CSV_FORMATS.issubset(traces.TRACE_FORMATS)
