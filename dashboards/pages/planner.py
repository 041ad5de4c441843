"""Capacity planner page: the cheapest GPU × TP × dtype × replicas meeting the SLOs."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.state import current_scenario, scenario_data
from sim.catalog.hardware import GPU_CATALOG
from sim.planning.export import kubernetes_manifests, vllm_serve_command
from sim.planning.planner import apply, breaking_load, cheapest, grid, pareto_front, search
from sim.scenario import parse_scenario


def main() -> None:
    st.title("Capacity planner")
    scenario, errors = current_scenario()
    if scenario is None:
        st.error("Fix the scenario first:\n\n" + "\n".join(f"- {e}" for e in errors))
        return
    data = scenario_data()
    st.write(
        f"Traffic and SLOs from **{scenario.name}** (TTFT ≤ {scenario.slo.ttft_s:g} s and TPOT "
        f"≤ {scenario.slo.tpot_s:g} s at p{scenario.slo.percentile:g})."
    )
    priced = [k for k, g in GPU_CATALOG.items() if g.hourly_cost_usd is not None]
    priced += [k for k in scenario.cost.gpu_hour_usd if k not in priced]
    gpus = st.multiselect("GPUs", list(GPU_CATALOG), default=priced, key="plan_gpus")
    tps = st.multiselect("Tensor parallel sizes", [1, 2, 4, 8], default=[1, 2], key="plan_tp")
    dtypes = st.multiselect(
        "Weights", ["bf16", "fp8", "int4"], default=["bf16", "fp8"], key="plan_dt"
    )
    max_replicas = int(st.number_input("Up to replicas", 1, 64, 4, key="plan_max"))
    requests = int(
        st.number_input(
            "Requests simulated per candidate",
            50,
            100_000,
            400,
            key="plan_requests",
            help="fewer is faster; the rate and lengths are the scenario's",
        )
    )
    split = st.toggle("Also try prefill/decode splits (xP:yD)", False, key="plan_pd")
    candidates = grid(gpus, tps, dtypes, list(range(1, max_replicas + 1)), disaggregated=split)
    st.caption(f"{len(candidates)} candidates")
    if not st.button("Search", key="plan_search") and "plan_results" not in st.session_state:
        return
    traffic = {**data, "workload": {**data["workload"], "num_requests": requests}}
    if "num_requests" not in data["workload"]:
        traffic["workload"].pop("num_requests")
    if st.session_state.get("plan_key") != (repr(traffic), repr(candidates)):
        bar = st.progress(0.0, text="simulating candidates")
        evaluations = search(
            traffic,
            candidates,
            progress=lambda done, total: bar.progress(done / total, text=f"{done}/{total}"),
        )
        st.session_state["plan_results"] = evaluations
        st.session_state["plan_key"] = (repr(traffic), repr(candidates))
    evaluations = st.session_state["plan_results"]
    best = cheapest(evaluations)
    if best is None:
        st.warning("No candidate meets the SLOs; widen the search.")
    else:
        st.success(
            f"Cheapest meeting the SLOs: **{best.candidate.label}**, ${best.usd_per_hour:,.2f}/hour"
        )
    table = pd.DataFrame([e.row() for e in evaluations]).sort_values(
        ["meets_slo", "usd_per_hour"], ascending=[False, True]
    )
    st.dataframe(table, key="plan_table")
    front = pareto_front(evaluations)
    figure = go.Figure()
    feasible = table[table["feasible"]]
    figure.add_trace(
        go.Scatter(
            x=feasible["usd_per_hour"],
            y=feasible["ttft_at_percentile_s"] * 1e3,
            mode="markers",
            text=feasible["label"],
            name="candidates",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=[e.usd_per_hour for e in front],
            y=[(e.ttft_at_percentile_s or 0) * 1e3 for e in front],
            mode="lines+markers",
            name="Pareto front",
        )
    )
    figure.add_hline(y=scenario.slo.ttft_s * 1e3, line_dash="dash", annotation_text="TTFT SLO")
    figure.update_layout(xaxis_title="USD per hour", yaxis_title="TTFT at SLO percentile (ms)")
    st.plotly_chart(figure, key="plan_pareto")
    if front and st.button("Find where the Pareto candidates break", key="plan_break"):
        rows = []
        for evaluation in front:
            scale = breaking_load(traffic, evaluation.candidate)
            rows.append({"candidate": evaluation.candidate.label, "breaks above × rate": scale})
        st.dataframe(pd.DataFrame(rows), key="plan_breaks")
    if best is not None:
        chosen = parse_scenario(apply(data, best.candidate))
        st.subheader("Export the cheapest")
        st.code(vllm_serve_command(chosen), language="bash")
        st.download_button(
            "Kubernetes manifests",
            kubernetes_manifests(chosen),
            "servesim-k8s.yaml",
            key="plan_k8s",
        )


main()
