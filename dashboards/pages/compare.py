"""Compare page: saved scenarios side by side, their CDFs overlaid, the knobs that differ."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.core import flatten, parse_data
from dashboards.state import run, saved_scenarios

METRICS = [
    ("TTFT p50 (ms)", lambda s: s["ttft_s"]["p50"] * 1e3),
    ("TTFT p90 (ms)", lambda s: s["ttft_s"]["p90"] * 1e3),
    ("TPOT p50 (ms)", lambda s: s["tpot_s"]["p50"] * 1e3),
    ("TPOT p90 (ms)", lambda s: s["tpot_s"]["p90"] * 1e3),
    ("SLO attainment", lambda s: s["goodput"]["slo_attainment"]),
    ("output tokens/s", lambda s: s["throughput"]["output_tokens_per_s"]),
    ("prefix hit rate", lambda s: s["prefix_cache"]["hit_rate"]),
    ("USD/hour", lambda s: s["cost"]["usd_per_hour"]),
    ("USD per M output tokens", lambda s: s["cost"]["usd_per_million_output_tokens"]),
]


def main() -> None:
    st.title("Compare")
    saved = saved_scenarios()
    if len(saved) < 2:
        st.info("Save two or more scenarios on the Scenario page to compare them here.")
        return
    chosen = st.multiselect("Scenarios", list(saved), default=list(saved)[:2], key="compare")
    if len(chosen) < 2:
        st.info("Pick at least two.")
        return
    results = {}
    for name in chosen:
        parsed = parse_data(saved[name], name)
        if parsed.scenario is None:
            st.error(f"{name}: " + "; ".join(parsed.errors))
            return
        results[name] = run(parsed.scenario)
    table = pd.DataFrame(
        {name: [metric(r.summary) for _, metric in METRICS] for name, r in results.items()},
        index=[label for label, _ in METRICS],
    )
    st.dataframe(table, key="compare_table")

    flat = {name: flatten(saved[name]) for name in chosen}
    keys = sorted(set().union(*flat.values()))
    differing = [k for k in keys if len({repr(flat[n].get(k)) for n in chosen}) > 1]
    st.subheader("Knobs that differ")
    if differing:
        st.dataframe(
            pd.DataFrame(
                {n: [flat[n].get(k) for k in differing] for n in chosen}, index=differing
            ).astype(str),
            key="compare_diff",
        )
    else:
        st.write("None: the scenarios are identical.")

    for column, title in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
        figure = go.Figure()
        for name, result in results.items():
            ok = result.records[result.records["status"] == "ok"][column].to_numpy(dtype=float)
            ordered = np.sort(ok[np.isfinite(ok)])
            if ordered.size:
                fraction = np.arange(1, ordered.size + 1) / ordered.size
                figure.add_trace(go.Scatter(x=ordered * 1e3, y=fraction, mode="lines", name=name))
        figure.update_layout(title=f"{title} CDF", xaxis_title="ms", height=320)
        st.plotly_chart(figure, key=f"compare_{column}")


main()
