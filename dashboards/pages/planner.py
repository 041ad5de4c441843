"""Capacity planner page: the cheapest GPU × TP × dtype × replicas meeting the SLOs."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.state import current_scenario, scenario_data
from sim.catalog.hardware import GPU_CATALOG
from sim.planning.export import kubernetes_manifests, vllm_serve_command
from sim.planning.planner import (
    Candidate,
    Evaluation,
    apply,
    breaking_load,
    cheapest,
    grid,
    pareto_front,
    search,
)
from sim.scenario import Scenario, parse_scenario


def main() -> None:
    st.title("Capacity planner")
    scenario, errors = current_scenario()
    if scenario is None:
        st.error("Fix the scenario first:\n\n" + "\n".join(f"- {e}" for e in errors))
        return
    data = scenario_data()
    _traffic_and_slos(scenario)
    candidates, requests = _search_space(scenario)
    traffic = _traffic(data, requests)
    evaluations = _evaluations(traffic, candidates, st.button("Search", key="plan_search"))
    if evaluations is None:
        return
    best = _cheapest(evaluations)
    table = _table(evaluations)
    front = pareto_front(evaluations)
    _pareto_chart(table, front, scenario)
    _breaking_points(traffic, front)
    if best is not None:
        _export(data, best)


def _traffic_and_slos(scenario: Scenario) -> None:
    st.write(
        f"Traffic and SLOs from **{scenario.name}** (TTFT ≤ {scenario.slo.ttft_s:g} s and TPOT "
        f"≤ {scenario.slo.tpot_s:g} s at p{scenario.slo.percentile:g})."
    )


def _search_space(scenario: Scenario) -> tuple[list[Candidate], int]:
    """The knobs of the search: the candidates they span, and the requests per candidate."""
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
    return candidates, requests


def _traffic(data: dict[str, Any], requests: int) -> dict[str, Any]:
    """The scenario with ``requests`` requests, if it counts them (a trace replays its own)."""
    traffic = {**data, "workload": {**data["workload"], "num_requests": requests}}
    if "num_requests" not in data["workload"]:
        traffic["workload"].pop("num_requests")
    return traffic


#: Searches already run this session, by their inputs (the traffic and the candidates).
SEARCHES = "plan_searches"
#: The inputs of the search on screen.
SHOWN = "plan_shown"
#: The most searches kept per session (each holds one evaluation per candidate).
MAX_SEARCHES = 8


def _evaluations(
    traffic: dict[str, Any], candidates: list[Candidate], asked: bool
) -> list[Evaluation] | None:
    """The search for these inputs: run only when ``asked`` (the Search button) and not
    already run for the same inputs this session; shown until the inputs change. None: nothing
    to show yet, or the inputs changed since the last search (the page says so)."""
    key = repr((traffic, candidates))
    searches: dict[str, list[Evaluation]] = st.session_state.setdefault(SEARCHES, {})
    if asked:
        if key not in searches:
            bar = st.progress(0.0, text="simulating candidates")

            def progress(done: int, total: int) -> None:
                bar.progress(done / total, text=f"{done}/{total}")

            searches[key] = search(traffic, candidates, progress=progress)
            while len(searches) > MAX_SEARCHES:
                searches.pop(next(iter(searches)))
        st.session_state[SHOWN] = key
    if st.session_state.get(SHOWN) == key and key in searches:
        return searches[key]
    if SHOWN in st.session_state:
        st.info("The search space or the scenario changed: press Search to plan again.")
    return None


def _cheapest(evaluations: list[Evaluation]) -> Evaluation | None:
    """The verdict: the cheapest candidate meeting the SLOs, or that none does."""
    best = cheapest(evaluations)
    if best is None:
        st.warning("No candidate meets the SLOs; widen the search.")
    else:
        st.success(
            f"Cheapest meeting the SLOs: **{best.candidate.label}**, ${best.usd_per_hour:,.2f}/hour"
        )
    return best


def _table(evaluations: list[Evaluation]) -> pd.DataFrame:
    table = pd.DataFrame([e.row() for e in evaluations]).sort_values(
        ["meets_slo", "usd_per_hour"], ascending=[False, True]
    )
    st.dataframe(table, key="plan_table")
    return table


def _pareto_chart(table: pd.DataFrame, front: list[Evaluation], scenario: Scenario) -> None:
    """Cost against TTFT for every feasible candidate, the Pareto front and the TTFT SLO."""
    figure = go.Figure()
    feasible = table[table["feasible"]]
    ttft = pd.to_numeric(feasible["ttft_at_percentile_s"], errors="coerce")
    unknown = feasible[ttft.isna()]
    feasible, ttft = feasible[ttft.notna()], ttft[ttft.notna()]
    if len(unknown):
        st.caption(f"Not drawn (no TTFT: no request completed): {', '.join(unknown['label'])}")
    figure.add_trace(
        go.Scatter(
            x=feasible["usd_per_hour"],
            y=ttft * 1e3,
            mode="markers",
            text=feasible["label"],
            name="candidates",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=[e.usd_per_hour for e in front],
            y=[e.ttft_at_percentile_s * 1e3 for e in front if e.ttft_at_percentile_s is not None],
            mode="lines+markers",
            name="Pareto front",
        )
    )
    figure.add_hline(y=scenario.slo.ttft_s * 1e3, line_dash="dash", annotation_text="TTFT SLO")
    figure.update_layout(xaxis_title="USD per hour", yaxis_title="TTFT at SLO percentile (ms)")
    st.plotly_chart(figure, key="plan_pareto")


def _breaking_points(traffic: dict[str, Any], front: list[Evaluation]) -> None:
    """On request, the load (× the scenario's rate) above which each Pareto candidate fails;
    kept on screen until the traffic or the front changes."""
    if not front:
        return
    key = repr((traffic, [e.candidate for e in front]))
    if st.button("Find where the Pareto candidates break", key="plan_break"):
        rows = []
        try:
            for evaluation in front:
                scale = breaking_load(traffic, evaluation.candidate)
                rows.append({"candidate": evaluation.candidate.label, "breaks above × rate": scale})
        except ValueError as exc:  # an arrival without a finite rate to scale
            st.error(str(exc))
            return
        st.session_state["plan_breaks_result"] = (key, rows)
    kept = st.session_state.get("plan_breaks_result")
    if kept is not None and kept[0] == key:
        st.dataframe(pd.DataFrame(kept[1]), key="plan_breaks")


def _export(data: dict[str, Any], best: Evaluation) -> None:
    """The cheapest candidate as a vllm serve command and Kubernetes manifests."""
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
