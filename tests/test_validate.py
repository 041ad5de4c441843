"""Validation report: errors computed right, thresholds enforced, CDF plot written."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.validate import ServerSide, Thresholds, cdf_figure_html, compare, format_table
from sim.run import run
from sim.scenario import parse_scenario
from tests.factories import scenario_dict


def summaries() -> tuple[dict, dict]:  # type: ignore[type-arg]
    live = run(parse_scenario(scenario_dict(seed=1))).summary
    sim = run(parse_scenario(scenario_dict(seed=1))).summary
    return live, sim


def test_identical_runs_have_zero_error_and_pass() -> None:
    live, sim = summaries()
    report = compare(live, sim)
    assert report.passed
    by_metric = {row["metric"]: row for row in report.rows}
    assert by_metric["ttft_s p90"]["rel_error"] == 0.0
    assert by_metric["prefix hit rate"]["abs_error"] == 0.0
    assert "ttft (ms) p90" in format_table(report)


def test_errors_beyond_the_threshold_fail_naming_the_metric() -> None:
    live, sim = summaries()
    sim["ttft_s"]["p90"] = live["ttft_s"]["p90"] * 1.3
    sim["prefix_cache"]["hit_rate"] = live["prefix_cache"]["hit_rate"] + 0.05
    report = compare(live, sim, Thresholds(relative=0.2, hit_rate_points=0.03))
    assert not report.passed
    assert any(f.startswith("ttft_s p90: relative error +30.0%") for f in report.failures)
    assert any(f.startswith("prefix hit rate: off by +5.0 points") for f in report.failures)
    row = next(r for r in report.rows if r["metric"] == "ttft_s p90")
    assert row["rel_error"] == pytest.approx(0.3)
    assert report.as_dict()["passed"] is False
    # Non-headline rows are reported but not enforced.
    assert compare(live, live).passed


def test_cdf_plot_is_written(tmp_path: Path) -> None:
    records = run(parse_scenario(scenario_dict())).records
    path = cdf_figure_html(records, records, tmp_path / "cdf.html")
    html = path.read_text()
    assert "TTFT (s)" in html and "plotly" in html.lower()


def test_only_the_chosen_statistics_are_enforced() -> None:
    live, sim = summaries()
    sim["ttft_s"]["p90"] = live["ttft_s"]["p90"] * 2
    assert not compare(live, sim, Thresholds(relative=0.5)).passed
    assert compare(live, sim, Thresholds(relative=0.5, statistics=("mean",))).passed


def test_server_side_rows_split_the_ttft_error() -> None:
    live, sim = summaries()
    # The engine took what the simulator said (server-side TTFT = sim TTFT − 5 ms front end),
    # but the client saw 40 ms more: the error is in the client↔engine path, not the engine.
    frontend = 0.005
    engine_ttft = sim["ttft_s"]["mean"] - frontend
    live["ttft_s"]["mean"] = engine_ttft + 0.040
    server = ServerSide(
        ttft_mean_s=engine_ttft,
        tpot_mean_s=sim["tpot_s"]["mean"],
        queue_mean_s=sim["queue_s"]["mean"],
        frontend_overhead_s=frontend,
    )
    report = compare(live, sim, server=server)
    rows = {row["metric"]: row for row in report.rows}
    assert rows["server ttft_s mean"]["rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert rows["server tpot_s mean"]["rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert rows["path ttft_s mean"]["live"] == pytest.approx(0.040)
    assert rows["path ttft_s mean"]["sim"] == pytest.approx(frontend)
    # Informational: the server rows never fail a run on their own.
    assert all(not rows[m]["checked"] for m in rows if m.startswith(("server", "path")))
    assert "server ttft (ms) mean" in format_table(report)
