"""Validation: how far the simulator's predictions are from what a real server then does.

Both sides are records in the same schema (sim/ simulates a scenario, live/ runs the same
requests against a server), so the comparison is column by column: mean/p50/p90/p99 of TTFT,
TPOT and E2E, output throughput, prefix-cache hit rate and preemptions, each with its absolute
and relative error. A run fails when a headline error exceeds the user's threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: Latency distributions compared, and the statistics of each.
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
STATISTICS = ("mean", "p50", "p90", "p99")
#: Rows held to the relative-error threshold: the numbers a capacity plan is read from.
HEADLINE = {("ttft_s", "mean"), ("ttft_s", "p90"), ("tpot_s", "mean"), ("tpot_s", "p90")}


@dataclass(frozen=True)
class Thresholds:
    """Largest acceptable errors: relative for headline latencies, points for the hit rate.

    ``statistics`` picks which headline statistics are enforced (mean and p90 by default).
    """

    relative: float = 0.2
    hit_rate_points: float = 0.03
    statistics: tuple[str, ...] = ("mean", "p90")


@dataclass
class ValidationReport:
    """One row per compared number; ``passed`` when every checked row is within bounds."""

    rows: list[dict[str, Any]]
    thresholds: Thresholds
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every checked error is within its threshold."""
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (report.json)."""
        return {
            "passed": self.passed,
            "thresholds": {
                "relative": self.thresholds.relative,
                "hit_rate_points": self.thresholds.hit_rate_points,
            },
            "failures": self.failures,
            "rows": [{k: _finite(v) for k, v in row.items()} for row in self.rows],
        }


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _row(metric: str, live: float | None, sim: float | None, checked: str) -> dict[str, Any]:
    live_v = math.nan if live is None else float(live)
    sim_v = math.nan if sim is None else float(sim)
    absolute = sim_v - live_v
    relative = absolute / live_v if live_v else math.nan
    return {
        "metric": metric,
        "live": live_v,
        "sim": sim_v,
        "abs_error": absolute,
        "rel_error": relative,
        "checked": checked,
    }


def compare(
    live_summary: Mapping[str, Any],
    sim_summary: Mapping[str, Any],
    thresholds: Thresholds | None = None,
    *,
    server: ServerSide | None = None,
) -> ValidationReport:
    """Side-by-side errors from two summaries (``servesim run`` and ``servesim live run``).

    With ``server`` (vLLM's own ``/metrics`` over the live run), informational rows split the
    TTFT error into what the engine did and what happened between the client and the engine
    (see :class:`ServerSide`).
    """
    thresholds = thresholds or Thresholds()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for latency in LATENCIES:
        for stat in STATISTICS:
            headline = (latency, stat) in HEADLINE and stat in thresholds.statistics
            checked = "relative" if headline else ""
            row = _row(
                f"{latency} {stat}",
                live_summary[latency][stat],
                sim_summary[latency][stat],
                checked,
            )
            rows.append(row)
            error = abs(row["rel_error"])
            if checked and not (error <= thresholds.relative):
                failures.append(
                    f"{row['metric']}: relative error {row['rel_error']:+.1%} exceeds "
                    f"{thresholds.relative:.0%}"
                )
    live_tput = live_summary["throughput"]["output_tokens_per_s"]
    sim_tput = sim_summary["throughput"]["output_tokens_per_s"]
    rows.append(_row("output tokens/s", live_tput, sim_tput, ""))
    hit = _row(
        "prefix hit rate",
        live_summary["prefix_cache"]["hit_rate"],
        sim_summary["prefix_cache"]["hit_rate"],
        "points",
    )
    rows.append(hit)
    if not abs(hit["abs_error"]) <= thresholds.hit_rate_points:
        failures.append(
            f"prefix hit rate: off by {hit['abs_error'] * 100:+.1f} points "
            f"(bound {thresholds.hit_rate_points * 100:.0f})"
        )
    rows.append(_row("preemptions", live_summary["preemptions"], sim_summary["preemptions"], ""))
    if server is not None:
        rows.extend(server.rows(live_summary, sim_summary))
    return ValidationReport(rows, thresholds, failures)


@dataclass(frozen=True)
class ServerSide:
    """Means from vLLM's histograms over a live run, and the simulator's front-end overhead.

    vLLM's ``time_to_first_token_seconds`` runs from when its front end has parsed a request to
    when the first token leaves the engine, so it leaves out the HTTP exchange and the streaming
    back to the client; the simulator's counterpart is its TTFT less ``frontend_overhead_s``.
    The difference between client-side and server-side TTFT is the client↔engine path (HTTP,
    the front end, streaming, and a load generator that shares the machine): when that row's
    error is large and the server-side one small, the engine model is right and the path is
    what the profile misjudges.
    """

    ttft_mean_s: float
    tpot_mean_s: float
    queue_mean_s: float
    frontend_overhead_s: float = 0.0

    @classmethod
    def from_metrics(cls, metrics: Any, frontend_overhead_s: float) -> ServerSide:
        """From a :class:`live.scrape.MetricsDelta`."""
        return cls(
            metrics.ttft.mean, metrics.tpot.mean, metrics.queue_time.mean, frontend_overhead_s
        )

    def rows(
        self, live_summary: Mapping[str, Any], sim_summary: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        sim_ttft = sim_summary["ttft_s"]["mean"]
        frontend = self.frontend_overhead_s
        return [
            _row("server ttft_s mean", self.ttft_mean_s, sim_ttft - frontend, ""),
            _row("server tpot_s mean", self.tpot_mean_s, sim_summary["tpot_s"]["mean"], ""),
            _row("server queue_s mean", self.queue_mean_s, sim_summary["queue_s"]["mean"], ""),
            _row(
                "path ttft_s mean",
                live_summary["ttft_s"]["mean"] - self.ttft_mean_s,
                frontend,
                "",
            ),
        ]


def format_table(report: ValidationReport) -> str:
    """The report as an aligned text table (what the CLI prints)."""
    lines = [f"{'metric':<24}{'live':>12}{'sim':>12}{'abs err':>12}{'rel err':>10}  check"]
    for row in report.rows:
        scale = 1e3 if any(word.endswith("_s") for word in row["metric"].split()) else 1.0
        unit_live = row["live"] * scale
        unit_sim = row["sim"] * scale
        unit_abs = row["abs_error"] * scale
        rel = f"{row['rel_error']:+.1%}" if math.isfinite(row["rel_error"]) else "—"
        mark = ""
        if row["checked"] == "relative":
            mark = "ok" if abs(row["rel_error"]) <= report.thresholds.relative else "FAIL"
        elif row["checked"] == "points":
            mark = "ok" if abs(row["abs_error"]) <= report.thresholds.hit_rate_points else "FAIL"
        name = row["metric"].replace("_s ", " (ms) ") if scale != 1.0 else row["metric"]
        lines.append(
            f"{name:<24}{unit_live:>12.3f}{unit_sim:>12.3f}{unit_abs:>12.3f}{rel:>10}  {mark}"
        )
    return "\n".join(lines)


def cdf_figure_html(live: pd.DataFrame, sim: pd.DataFrame, path: str | Path) -> Path:
    """Overlaid live and simulated CDFs of TTFT, TPOT and E2E, written as a standalone HTML file."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (s)", "TPOT (s)", "E2E (s)"))
    for column, latency in enumerate(LATENCIES, start=1):
        for name, frame, colour in (("live", live, "#1f77b4"), ("sim", sim, "#d62728")):
            ok = frame[frame["status"] == "ok"][latency].to_numpy(dtype=np.float64)
            values = np.sort(ok[np.isfinite(ok)])
            if not values.size:
                continue
            probability = np.arange(1, values.size + 1) / values.size
            figure.add_scatter(
                x=values,
                y=probability,
                mode="lines",
                name=name,
                line={"color": colour},
                legendgroup=name,
                showlegend=column == 1,
                row=1,
                col=column,
            )
    figure.update_layout(title="live vs simulated latency CDFs", template="plotly_white")
    path = Path(path)
    figure.write_html(path, include_plotlyjs=True)  # readable offline
    return path
