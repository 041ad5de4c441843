"""Results page: headline cards, latency CDFs with the SLO line, time series, the requests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.core import records_csv, scenario_yaml
from dashboards.state import current_scenario, run


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

    st.subheader("Requests")
    st.dataframe(records, height=300)
    st.download_button(
        "Download requests (CSV)", records_csv(records), "records.csv", "text/csv", key="dl_csv"
    )
    st.download_button(
        "Download scenario (YAML)", scenario_yaml(scenario), "scenario.yaml", key="dl_yaml"
    )


main()
