"""Self-contained HTML reports (Plotly charts, plotly.js inlined so they open offline) of a run,
a sweep and a plan: what ``servesim run``, ``sweep`` and ``plan`` write beside their tables.

Each report is a list of figures under a title and a few lines of context; the figures are pure
functions of the run's tables, so the dashboard and the CLI could share them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: The latencies a report draws CDFs of: record column, title, and the SLO key that bounds it.
LATENCIES = (("ttft_s", "TTFT", "ttft_s"), ("tpot_s", "TPOT", "tpot_s"), ("e2e_s", "E2E", "e2e_s"))
#: The most points a report draws per curve: a CDF is drawn at this many evenly spaced
#: quantiles, a time series every n-th sample, so a ten-million-request run's report stays a
#: few megabytes.
MAX_POINTS = 2000

#: Time-series panels: column, title (the fleet's samples, sim/fleet/timeseries.py).
SERIES = (
    ("num_requests_waiting", "waiting requests"),
    ("num_requests_running", "running requests"),
    ("kv_cache_usage", "KV cache usage"),
    ("output_tokens_per_s", "output tokens/s"),
    ("num_replicas", "replicas"),
)


def write_report(
    path: str | Path, title: str, lines: Sequence[str], figures: Sequence[Any]
) -> Path:
    """One HTML file: the title, the context ``lines`` and each figure; plotly.js is embedded
    once, in the first figure, so the file needs no network."""
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em} p{margin:.2em 0}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *(f"<p>{html.escape(line)}</p>" for line in lines),
    ]
    for index, figure in enumerate(figures):
        parts.append(figure.to_html(full_html=False, include_plotlyjs=index == 0))
    parts.append("</body></html>")
    path = Path(path)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def latency_cdfs(records: pd.DataFrame, slo: dict[str, Any]) -> go.Figure:
    """CDFs of TTFT, TPOT and E2E over completed requests, each with its SLO as a line."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=3, subplot_titles=[f"{t} (ms)" for _, t, _ in LATENCIES])
    ok = records[records["status"] == "ok"]
    for column, (name, title, slo_key) in enumerate(LATENCIES, start=1):
        values = pd.to_numeric(ok[name], errors="coerce").to_numpy(dtype=np.float64)
        values = np.sort(values[np.isfinite(values)]) * 1e3
        if values.size:
            shares = np.arange(1, values.size + 1) / values.size
            if values.size > MAX_POINTS:  # the quantiles, first and last included
                keep = np.linspace(0, values.size - 1, MAX_POINTS).round().astype(int)
                values, shares = values[keep], shares[keep]
            figure.add_scatter(
                x=values,
                y=shares,
                mode="lines",
                name=title,
                showlegend=False,
                row=1,
                col=column,
            )
        target = slo.get(slo_key)
        if target:
            figure.add_vline(x=float(target) * 1e3, line_dash="dash", row=1, col=column)
    figure.update_yaxes(title_text="share of requests", range=[0, 1], row=1, col=1)
    figure.update_layout(title="latency CDFs (dashed: the SLO)", template="plotly_white")
    return figure


def time_series(timeseries: pd.DataFrame) -> go.Figure:
    """The fleet's samples over time, one panel per series it has."""
    from plotly.subplots import make_subplots

    panels = [(c, t) for c, t in SERIES if c in timeseries.columns]
    stride = max(1, -(-len(timeseries) // MAX_POINTS))
    timeseries = timeseries.iloc[::stride]
    figure = make_subplots(
        rows=len(panels) or 1, cols=1, shared_xaxes=True, subplot_titles=[t for _, t in panels]
    )
    for row, (column, title) in enumerate(panels, start=1):
        figure.add_scatter(
            x=timeseries["time_s"],
            y=timeseries[column],
            mode="lines",
            name=title,
            showlegend=False,
            row=row,
            col=1,
        )
    figure.update_xaxes(title_text="time (s)", row=len(panels) or 1, col=1)
    figure.update_layout(
        title="fleet over time", template="plotly_white", height=180 * max(len(panels), 2)
    )
    return figure


def run_report(
    path: str | Path,
    name: str,
    records: pd.DataFrame,
    timeseries: pd.DataFrame,
    summary: dict[str, Any],
    slo: dict[str, Any],
) -> Path:
    """``servesim run``'s report: headline numbers, latency CDFs and the fleet over time."""
    lines = []
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        stats = summary.get(key) or {}
        cells = [
            f"{stat} {stats[stat] * 1e3:,.1f} ms"
            for stat in ("mean", "p50", "p90", "p99")
            if isinstance(stats.get(stat), float) and math.isfinite(stats[stat])
        ]
        if cells:
            lines.append(f"{label}: " + ", ".join(cells))
    attainment = (summary.get("goodput") or {}).get("slo_attainment")
    if isinstance(attainment, float):
        lines.append(f"SLO attainment {attainment:.1%}")
    counts = summary.get("requests") or {}
    if counts:
        lines.append("requests: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    figures = [latency_cdfs(records, slo), time_series(timeseries)]
    return write_report(path, f"servesim run: {name}", lines, figures)


#: Sweep metrics drawn against the swept parameter: column, title and scale to display units.
SWEEP_METRICS = (
    ("ttft_p90_s", "TTFT p90 (ms)", 1e3),
    ("tpot_p90_s", "TPOT p90 (ms)", 1e3),
    ("output_tokens_per_s", "output tokens/s", 1.0),
    ("slo_attainment", "SLO attainment", 1.0),
)


def sweep_report(path: str | Path, intervals: pd.DataFrame, parameters: Sequence[str]) -> Path:
    """``servesim sweep``'s report: each metric's mean and confidence interval against the
    first swept parameter, one line per combination of the others."""
    from plotly.subplots import make_subplots

    metrics = [m for m in SWEEP_METRICS if m[0] in intervals.columns]
    figure = make_subplots(
        rows=1, cols=len(metrics) or 1, subplot_titles=[t for _, t, _ in metrics]
    )
    x_name = parameters[0] if parameters else None
    others = list(parameters[1:])
    groups = intervals.groupby(others, dropna=False) if others else [((), intervals)]
    for key, group in groups:
        values = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{p}={v}" for p, v in zip(others, values, strict=False))
        group = group.sort_values(x_name) if x_name else group
        x = group[x_name].astype(str) if x_name else np.arange(len(group))
        for column, (metric, _, scale) in enumerate(metrics, start=1):
            ci = group.get(f"{metric}_ci")
            figure.add_scatter(
                x=x,
                y=group[metric] * scale,
                error_y=None if ci is None else {"type": "data", "array": ci * scale},
                mode="lines+markers",
                name=label or "runs",
                legendgroup=label,
                showlegend=column == 1 and bool(label),
                row=1,
                col=column,
            )
    if x_name:
        figure.update_xaxes(title_text=x_name)
    figure.update_layout(title="sweep (bars: confidence interval)", template="plotly_white")
    lines = [f"{len(intervals)} points over {', '.join(parameters) or 'seeds'}"]
    return write_report(path, "servesim sweep", lines, [figure])


def plan_report(path: str | Path, document: dict[str, Any]) -> Path:
    """``servesim plan``'s report: every candidate's cost against its TTFT at the SLO percentile,
    the Pareto front and the TTFT SLO, and which is cheapest."""
    import plotly.graph_objects as go

    candidates = pd.DataFrame(document["candidates"])
    slo = document.get("slo") or {}
    figure = go.Figure()
    if not candidates.empty:
        ran = candidates[candidates["feasible"] & candidates["ttft_at_percentile_s"].notna()]
        for meets, group in ran.groupby("meets_slo"):
            figure.add_scatter(
                x=group["usd_per_hour"],
                y=group["ttft_at_percentile_s"] * 1e3,
                mode="markers",
                text=group["label"],
                name="meets the SLOs" if meets else "misses the SLOs",
            )
        front = ran[ran["pareto"]].sort_values("usd_per_hour")
        figure.add_scatter(
            x=front["usd_per_hour"],
            y=front["ttft_at_percentile_s"] * 1e3,
            mode="lines",
            name="Pareto front",
        )
    if slo.get("ttft_s"):
        figure.add_hline(y=float(slo["ttft_s"]) * 1e3, line_dash="dash")
    figure.update_layout(
        title="cost against TTFT at the SLO percentile (dashed: the TTFT SLO)",
        xaxis_title="USD per hour",
        yaxis_title="TTFT (ms)",
        template="plotly_white",
    )
    cheapest = document.get("cheapest")
    lines = [
        f"{len(candidates)} candidates for {document.get('scenario')} at "
        f"{document.get('rate_rps')} req/s",
        "cheapest meeting the SLOs: "
        + (
            "none"
            if cheapest is None
            else f"{cheapest['label']} at ${cheapest['usd_per_hour']:,.2f}/h"
        ),
    ]
    return write_report(path, f"servesim plan: {document.get('scenario')}", lines, [figure])
