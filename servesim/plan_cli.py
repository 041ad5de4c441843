"""``servesim sweep`` and ``servesim plan``: many simulations at once."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sim.console import fail, load_or_exit, progress, stderr

stdout = Console(highlight=False)


def sweep(
    sweep_path: Annotated[
        Path, typer.Argument(metavar="SWEEP", help="sweep YAML (base, grid|runs, seeds)")
    ],
    out: Annotated[Path, typer.Option("--out", help="table to write (.parquet or .csv)")] = Path(
        "sweep.parquet"
    ),
    workers: Annotated[int, typer.Option(help="local processes", min=1)] = 2,
    ray: Annotated[
        str | None, typer.Option("--ray", help="run on a Ray cluster: ADDRESS, or 'local'")
    ] = None,
    records: Annotated[
        Path | None,
        typer.Option(
            "--records",
            help="each worker streams its run's records and time series to "
            "DIR/run-NNNN/{records,timeseries}.parquet (on a Ray cluster: a directory every "
            "node can write)",
        ),
    ] = None,
) -> None:
    """Run a grid of scenario overrides × seeds; one table, confidence intervals per point."""
    from sim.planning.sweep import confidence_intervals, load_sweep, run_sweep, write_table

    try:
        plan = load_sweep(sweep_path)
    except ValueError as exc:
        fail(str(exc))
    with progress("simulating", len(plan.runs)) as update:
        try:
            table = run_sweep(
                plan,
                workers=workers,
                executor="ray" if ray else "process",
                ray_address=ray,
                progress=update,
                records_dir=records,
            )
        except ValueError as exc:
            fail(str(exc))
    write_table(table, out)
    failed = table[table["error"] != ""]
    for _, row in failed.iterrows():
        stderr.print(f"[yellow]run failed:[/] {row['error']}", highlight=False)
    intervals = confidence_intervals(table)
    view = Table(title=f"{len(table)} runs → {out}", title_justify="left")
    parameters = [
        c
        for c in intervals.columns
        if not c.startswith(("replications",)) and c not in _metric_columns(intervals)
    ]
    from sim.report.html import sweep_report

    report = sweep_report(out.with_suffix(".html"), intervals, parameters)
    stderr.print(f"wrote {report}", highlight=False)
    for column in [*parameters, "n", "TTFT p90 (ms)", "TPOT p90 (ms)", "tok/s", "SLO att."]:
        view.add_column(column, justify="right")
    for _, row in intervals.iterrows():
        view.add_row(
            *(str(row[p]) for p in parameters),
            str(row["replications"]),
            _pm(row["ttft_p90_s"], row["ttft_p90_s_ci"], 1e3),
            _pm(row["tpot_p90_s"], row["tpot_p90_s_ci"], 1e3),
            _pm(row["output_tokens_per_s"], row["output_tokens_per_s_ci"], 1.0),
            _pm(row["slo_attainment"], row["slo_attainment_ci"], 100.0, "%"),
        )
    stdout.print(view)


def _planned_scenario(
    scenario: Any,
    ttft_ms: float | None,
    tpot_ms: float | None,
    e2e_ms: float | None,
    percentile: float | None,
    rate: float | None,
) -> Any:
    """The scenario with the SLOs and rate given on the command line; exit 2 naming the flag
    when one is out of range or the arrival process has no rate."""
    from sim.scenario import ScenarioError, parse_scenario

    data = scenario.model_dump(mode="json", exclude_none=True)
    slo = data.setdefault("slo", {})
    for flag, value, key in (
        ("--ttft-ms", ttft_ms, "ttft_s"),
        ("--tpot-ms", tpot_ms, "tpot_s"),
        ("--e2e-ms", e2e_ms, "e2e_s"),
    ):
        if value is not None:
            if not value > 0:
                fail(f"{flag}: must be > 0 milliseconds, got {value:g}")
            slo[key] = value / 1e3
    if percentile is not None:
        if not 0 < percentile <= 100:
            fail(f"--percentile: must be in (0, 100], got {percentile:g}")
        slo["percentile"] = percentile
    if rate is not None:
        arrival = data["workload"].get("arrival") or {}
        if "rate" not in arrival:
            fail(
                f"--rate: the scenario's arrivals ({arrival.get('type', 'a trace')}) have no "
                "single rate; edit workload.arrival, or use a trace's time_scale"
            )
        if not rate > 0:
            fail(f"--rate: must be > 0 requests/s, got {rate:g}")
        arrival["rate"] = rate
    try:
        return parse_scenario(data, "scenario with the command line's SLOs and rate")
    except ScenarioError as exc:
        fail("; ".join(exc.problems))


def _metric_columns(frame: Any) -> set[str]:
    from sim.planning.sweep import METRICS

    return {*METRICS, *(f"{m}_ci" for m in METRICS)}


def _pm(mean: float, half: float, scale: float, unit: str = "") -> str:
    if mean is None or not math.isfinite(mean):
        return "—"
    text = f"{mean * scale:,.1f}{unit}"
    if half is not None and math.isfinite(half):
        text += f" ± {half * scale:,.1f}"
    return text


def plan(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="traffic and SLOs")],
    gpus: Annotated[str, typer.Option(help="comma-separated GPU keys")] = "h100-sxm,a100-80gb-sxm",
    tp: Annotated[str, typer.Option(help="tensor parallel sizes")] = "1,2",
    dtypes: Annotated[str, typer.Option(help="weight dtypes")] = "bf16,fp8",
    max_replicas: Annotated[int, typer.Option(min=1)] = 4,
    disaggregated: Annotated[bool, typer.Option(help="also try xP:yD splits")] = False,
    breaking_load: Annotated[
        bool, typer.Option(help="bisect on load for the Pareto candidates")
    ] = False,
    workers: Annotated[int, typer.Option(min=1)] = 2,
    ttft_ms: Annotated[float | None, typer.Option(help="TTFT target (replaces slo.ttft_s)")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="TPOT target (replaces slo.tpot_s)")] = None,
    e2e_ms: Annotated[float | None, typer.Option(help="E2E target (replaces slo.e2e_s)")] = None,
    percentile: Annotated[
        float | None, typer.Option(help="the SLOs' percentile (replaces slo.percentile)")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="requests/s (replaces workload.arrival.rate)")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="print the plan as JSON instead of tables")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="directory for plan.json and candidates.csv"),
    ] = None,
) -> None:
    """The cheapest GPU × TP × weights × replicas meeting the scenario's SLOs at its load.

    A scenario with autoscaling keeps its HPA: each co-located candidate's replica count is the
    HPA's max_replicas, and its cost is what the HPA ran.
    """
    from sim.planning import planner

    scenario = _planned_scenario(
        load_or_exit(scenario_path), ttft_ms, tpot_ms, e2e_ms, percentile, rate
    )
    data = scenario.model_dump(mode="json", exclude_none=True)
    try:
        candidates = planner.grid(
            [g.strip() for g in gpus.split(",") if g.strip()],
            [int(t) for t in tp.split(",")],
            [d.strip() for d in dtypes.split(",") if d.strip()],
            list(range(1, max_replicas + 1)),
            disaggregated=disaggregated,
        )
    except ValueError as exc:
        fail(f"--tp: {exc}")
    with progress("candidates", len(candidates)) as update:
        evaluations = planner.search(data, candidates, workers=workers, progress=update)
    front = planner.pareto_front(evaluations)
    breaks: dict[str, float | None] = {}
    if breaking_load:
        with progress("breaking loads", len(front)) as update:
            for done, evaluation in enumerate(front, 1):
                label = evaluation.candidate.label
                breaks[label] = planner.breaking_load(data, evaluation.candidate)
                update(done, detail=label)
    best = planner.cheapest(evaluations)
    document = planner.plan_document(scenario.name, data, evaluations, front, breaks, best)
    if out is not None:
        from sim.report.html import plan_report

        planner.write_plan(document, out)
        plan_report(out / "report.html", document)
    if json_out:
        print(json.dumps(document, indent=2, allow_nan=False))
        if best is None:
            raise typer.Exit(code=1)
        return
    pct = f"p{scenario.slo.percentile:g}"
    view = Table(title=f"{len(candidates)} candidates for {scenario.name}", title_justify="left")
    for column in (
        "candidate",
        "meets SLO",
        "USD/hour",
        f"TTFT {pct} ms",
        f"TPOT {pct} ms",
        f"E2E {pct} ms",
        "note",
    ):
        view.add_column(column, justify="right")
    ordered = sorted(
        evaluations,
        key=lambda e: (not e.meets_slo, e.usd_per_hour if e.usd_per_hour is not None else math.inf),
    )
    on_front = {e.candidate for e in front}
    for e in ordered:
        note = "cannot run" if not e.feasible else ("HPA" if e.autoscaled else "")
        if e.candidate in on_front:
            note = ", ".join(filter(None, [note, "Pareto"])) + (
                f", breaks above {breaks[e.candidate.label]:.2g}× load"
                if breaks.get(e.candidate.label)
                else ""
            )
        view.add_row(
            e.candidate.label,
            "yes" if e.meets_slo else "no",
            "—" if e.usd_per_hour is None else f"{e.usd_per_hour:,.2f}",
            "—" if e.ttft_at_percentile_s is None else f"{e.ttft_at_percentile_s * 1e3:,.0f}",
            "—" if e.tpot_at_percentile_s is None else f"{e.tpot_at_percentile_s * 1e3:,.1f}",
            "—" if e.e2e_at_percentile_s is None else f"{e.e2e_at_percentile_s * 1e3:,.0f}",
            note,
        )
    stdout.print(view)
    for e in evaluations:
        if not e.feasible:
            stdout.print(f"cannot run {e.candidate.label}: {e.reason}", soft_wrap=True)
    if out is not None:
        stdout.print(f"plan written to {out}")
    if best is None:
        stderr.print("no candidate meets the SLOs; widen the search", highlight=False)
        raise typer.Exit(code=1)
    stdout.print(
        f"cheapest meeting the SLOs: {best.candidate.label} at ${best.usd_per_hour:,.2f}/hour"
    )
