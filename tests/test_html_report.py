"""The HTML reports of run, sweep and plan: what each chart holds, and that the file is whole."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("plotly")

from sim.report.html import latency_cdfs, plan_report, run_report, sweep_report
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import scenario_dict


def test_latency_cdfs_are_sorted_over_completed_requests_with_the_slo_lines() -> None:
    records = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "rejected"],
            "ttft_s": [0.3, 0.1, 0.2, math.nan],
            "tpot_s": [0.01, 0.03, 0.02, math.nan],
            "e2e_s": [1.0, 3.0, 2.0, math.nan],
        }
    )
    figure = latency_cdfs(records, {"ttft_s": 0.25, "tpot_s": 0.05, "e2e_s": None})
    traces = {trace.xaxis: trace for trace in figure.data}
    assert list(traces["x"].x) == pytest.approx([100.0, 200.0, 300.0])
    assert list(traces["x"].y) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert list(traces["x3"].x) == pytest.approx([1000.0, 2000.0, 3000.0])
    lines = [shape.x0 for shape in figure.layout.shapes]
    assert lines == pytest.approx([250.0, 50.0])  # no line for an unset E2E SLO


def test_a_run_report_is_one_file_with_plotly_embedded_once(tmp_path: Path) -> None:
    scenario = parse_scenario(scenario_dict())
    result = build(scenario).run()
    path = run_report(
        tmp_path / "r.html",
        scenario.name,
        result.records,
        result.timeseries,
        result.summary,
        scenario.slo.model_dump(),
    )
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert text.count('class="plotly-graph-div"') == 2
    # plotly.js inlined once (it is ~4 MB): no network needed, no second copy.
    assert text.count("plotly.js v") == 1
    assert "SLO attainment" in text


def test_a_sweep_report_draws_one_line_per_other_parameter(tmp_path: Path) -> None:
    intervals = pd.DataFrame(
        {
            "fleet.replicas": [1, 2, 1, 2],
            "dtype": ["bf16", "bf16", "fp8", "fp8"],
            "ttft_p90_s": [0.2, 0.1, 0.15, 0.08],
            "ttft_p90_s_ci": [0.01, 0.01, np.nan, 0.02],
            "slo_attainment": [0.8, 1.0, 0.9, 1.0],
        }
    )
    path = sweep_report(tmp_path / "s.html", intervals, ["fleet.replicas", "dtype"])
    text = path.read_text()
    assert "dtype=bf16" in text and "dtype=fp8" in text


def test_a_plan_report_draws_the_front_by_cost(tmp_path: Path) -> None:
    def candidate(label: str, cost: float, ttft: float | None, pareto: bool) -> dict[str, object]:
        return {
            "label": label,
            "feasible": ttft is not None,
            "meets_slo": ttft is not None and ttft < 0.5,
            "usd_per_hour": cost,
            "ttft_at_percentile_s": ttft,
            "pareto": pareto,
        }

    document = {
        "scenario": "s",
        "slo": {"ttft_s": 0.5},
        "rate_rps": 4.0,
        "cheapest": candidate("b", 2.0, 0.3, True),
        "candidates": [
            candidate("c", 4.0, 0.1, True),
            candidate("b", 2.0, 0.3, True),
            candidate("a", 1.0, None, False),  # nothing completed: never drawn at 0
        ],
    }
    text = plan_report(tmp_path / "p.html", document).read_text()
    assert "b at $2.00/h" in text and "Pareto front" in text


def test_a_large_run_is_drawn_at_a_bounded_number_of_points() -> None:
    from sim.report.html import MAX_POINTS, time_series

    size = 5 * MAX_POINTS + 7
    values = np.random.default_rng(0).exponential(0.1, size)
    records = pd.DataFrame(
        {"status": "ok", "ttft_s": values, "tpot_s": values / 10, "e2e_s": values * 10}
    )
    figure = latency_cdfs(records, {})
    for trace, scale in zip(figure.data, (1.0, 0.1, 10.0), strict=True):
        assert len(trace.x) == MAX_POINTS
        assert trace.x[0] == pytest.approx(values.min() * scale * 1e3)
        assert trace.x[-1] == pytest.approx(values.max() * scale * 1e3)
        assert trace.y[-1] == 1.0
    samples = pd.DataFrame({"time_s": np.arange(size), "num_requests_running": np.ones(size)})
    assert len(time_series(samples).data[0].x) <= MAX_POINTS
