"""Results page: headline cards, latency CDFs with the SLO line, time series, the requests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.core import records_csv, scenario_yaml
from dashboards.state import current_scenario, replicate, run
from sim.scenario import Scenario


def _ms(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value * 1e3:,.0f} ms"


def cdf_figure(values: np.ndarray, title: str, slo_s: float | None) -> go.Figure:
    ordered = np.sort(values[np.isfinite(values)])
    figure = go.Figure()
    if ordered.size:
        fraction = np.arange(1, ordered.size + 1) / ordered.size
        figure.add_trace(go.Scatter(x=ordered * 1e3, y=fraction, mode="lines", name=title))
    if slo_s is not None:
        figure.add_vline(x=slo_s * 1e3, line_dash="dash", annotation_text="SLO")
    figure.update_layout(
        title=title,
        xaxis_title="ms",
        yaxis_title="fraction of requests",
        height=320,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return figure


#: The replication table's rows: label, metric, and how to show it (ms, or a plain number).
REPLICATED = [
    ("TTFT p90", "ttft_p90_s", "ms"),
    ("TTFT p99", "ttft_p99_s", "ms"),
    ("TPOT p90", "tpot_p90_s", "ms"),
    ("E2E p90", "e2e_p90_s", "ms"),
    ("Output tokens/s", "output_tokens_per_s", "number"),
    ("SLO attainment", "slo_attainment", "number"),
    ("Prefix hit rate", "prefix_hit_rate", "number"),
    ("USD / M output tokens", "usd_per_million_output_tokens", "number"),
]


def _replications(scenario: Scenario) -> None:
    """Seed replications: how much of a difference between two scenarios is noise."""
    st.subheader("Across seeds")
    left, right = st.columns([1, 3])
    num_seeds = left.number_input(
        "Seeds", min_value=2, max_value=20, value=5, step=1, key="replication_seeds"
    )
    right.caption(
        "Runs the scenario with this many seeds (from its own) in two processes and shows each "
        "metric's mean and 95 % Student-t interval: two scenarios whose intervals overlap are "
        "not told apart by this workload size."
    )
    if not left.button("Run seeds", key="replication_run"):
        return
    with st.spinner(f"Simulating {int(num_seeds)} seeds…"):
        try:
            replicated = replicate(scenario, int(num_seeds))
        except ValueError as exc:
            st.error(str(exc))
            return
    rows = []
    for label, metric, kind in REPLICATED:
        values = replicated["metrics"][metric]
        mean, half = values["mean"], values["half_width"]
        scale = 1e3 if kind == "ms" else 1.0
        rows.append(
            {
                "metric": label + (" (ms)" if kind == "ms" else ""),
                "mean": None if mean is None else mean * scale,
                "± 95 %": None if half is None else half * scale,
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="replication_table")


def main() -> None:
    st.title("Results")
    scenario, errors = current_scenario()
    if scenario is None:
        st.error("Fix the scenario first:\n\n" + "\n".join(f"- {e}" for e in errors))
        return
    with st.spinner("Simulating…"):
        try:
            result = run(scenario)
        except ValueError as exc:
            st.error(str(exc))
            return
    summary = result.summary
    stability = summary.get("stability", {})
    if not stability.get("stable", True):
        st.error(stability["message"])
    slo = summary["slo"]
    pct = f"p{slo['percentile']:g}"
    cost = summary.get("cost", {})
    cards = st.columns(6)
    cards[0].metric(f"TTFT {pct}", _ms(slo["ttft_at_percentile_s"]), help="time to first token")
    cards[1].metric(f"TPOT {pct}", _ms(slo["tpot_at_percentile_s"]), help="time per output token")
    attainment = summary["goodput"]["slo_attainment"]
    cards[2].metric("SLO attainment", "—" if attainment is None else f"{attainment:.1%}")
    cards[3].metric("Output tokens/s", f"{summary['throughput']['output_tokens_per_s']:,.0f}")
    per_m = cost.get("usd_per_million_output_tokens")
    cards[4].metric("USD / M output tokens", "no price" if per_m is None else f"${per_m:,.3f}")
    cards[5].metric("Prefix hit rate", f"{summary['prefix_cache']['hit_rate']:.1%}")

    records = result.records
    ok = records[records["status"] == "ok"]
    left, middle, right = st.columns(3)
    left.plotly_chart(
        cdf_figure(ok["ttft_s"].to_numpy(dtype=float), "TTFT", slo["ttft_target_s"]),
        key="cdf_ttft",
    )
    middle.plotly_chart(
        cdf_figure(ok["tpot_s"].to_numpy(dtype=float), "TPOT", slo["tpot_target_s"]),
        key="cdf_tpot",
    )
    right.plotly_chart(cdf_figure(ok["e2e_s"].to_numpy(dtype=float), "E2E", None), key="cdf_e2e")

    series: pd.DataFrame = result.timeseries
    st.subheader("Over time")
    columns = [
        ("num_requests_waiting", "waiting"),
        ("num_requests_running", "running"),
        ("kv_cache_usage", "KV use"),
        ("num_replicas", "replicas"),
        ("prefix_cache_hit_rate", "hit rate"),
        ("cost_usd_per_hour", "USD/hour"),
    ]
    chart_columns = st.columns(3)
    for i, (column, label) in enumerate(columns):
        figure = go.Figure(go.Scatter(x=series["time_s"], y=series[column], mode="lines"))
        figure.update_layout(title=label, height=240, margin={"l": 10, "r": 10, "t": 40, "b": 10})
        chart_columns[i % 3].plotly_chart(figure, key=f"ts_{column}")

    _replications(scenario)

    st.subheader("Requests")
    st.dataframe(records, height=300)
    st.download_button(
        "Download requests (CSV)", records_csv(records), "records.csv", "text/csv", key="dl_csv"
    )
    st.download_button(
        "Download scenario (YAML)", scenario_yaml(scenario), "scenario.yaml", key="dl_yaml"
    )


main()
