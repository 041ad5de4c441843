"""``servesim calibrate`` and ``servesim validate``: fit a profile to a real server, then measure
how far the simulator's predictions are from what the server does on another workload.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from live.cli import scenario_server
from sim.catalog.hardware import is_cpu_backend
from sim.console import fail, load_or_exit, progress, stderr
from sim.scenario import ProfileLatencySpec, Scenario

if TYPE_CHECKING:
    from sim.engine.coefficients import CalibratedCoefficients
    from sim.engine.profile import FitReport, Profile


def calibrate(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="engine knobs, model")],
    out: Annotated[Path, typer.Option("--out", help="profile JSON to write")],
    url: Annotated[str | None, typer.Option(help="an existing server")] = None,
    launch: Annotated[bool, typer.Option(help="start vLLM with the scenario's knobs")] = False,
    model: Annotated[str | None, typer.Option(help="model to launch (path or id)")] = None,
    budget: Annotated[str, typer.Option(help="time budget, e.g. 90s, 10m")] = "5m",
    operators: Annotated[
        str | None,
        typer.Option(
            help="fit operator timings instead of a server: a public source (llmservingsim, "
            "llmservingsim+kernel_bench, vidur, vidur+kernel_bench), 'torch' to time the "
            "model's operators here with torch (GPU node), or a directory 'torch' wrote"
        ),
    ] = None,
    device: Annotated[
        str, typer.Option(help="with --operators torch: auto, cpu or cuda[:N]")
    ] = "auto",
    records: Annotated[
        list[Path] | None,
        typer.Option(
            help="fit to per-request records instead (a servesim live run or live import: "
            "records.parquet/.jsonl/.csv or its directory) by replaying them in the simulator; "
            "repeat it to fit several workloads or loads at once, each also left out in turn "
            "(leave-one-workload-out error)"
        ),
    ] = None,
    max_simulations: Annotated[
        int, typer.Option(help="with --records: most simulations the search may run", min=1)
    ] = 60,
    assume_arrivals: Annotated[
        bool,
        typer.Option(
            "--assume-arrivals",
            help="with --records: fit records whose send times are unknown (an imported file "
            "without start_times) as if every request arrived at 0",
        ),
    ] = False,
    steps: Annotated[
        bool,
        typer.Option(
            "--steps",
            help="with --records: rebuild the engine steps from the runs' streamed token times "
            "(token_times.parquet) and fit those, instead of searching by replay",
        ),
    ] = False,
    data_dir: Annotated[
        Path, typer.Option(help="where the operator tables are (shared/data)")
    ] = Path("../shared/data"),
    vocab_size: Annotated[
        int | None,
        typer.Option(help="the model's vocabulary size (default: the scenario's model's)", min=1),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="with --url/--launch: the isolated points only, on the whole budget (no "
            "loaded replays of the scenario's requests)",
        ),
    ] = False,
) -> None:
    """Measure a server and fit a latency profile: isolated points (lone prefills, decode
    batches, mixed steps) on half the budget, then loaded replays of the scenario's requests
    (a burst, Poisson at 50% and 85% of the capacity it measures) whose engine steps, rebuilt
    from streamed token times, are fitted together with them. --quick: the isolated points only.

    With --operators, fit operator timing tables for the scenario's model, GPU and TP: public
    ones from shared/data, or ones timed here with torch (written next to the profile).
    \f
    The signature is long because typer makes each option a parameter; the body only checks that
    one source of measurements was given and hands over to one helper per source.
    """
    records = records or None  # typer gives an empty list when the option is absent
    _check_one_source(url=url, launch=launch, operators=operators, records=records)
    if quick and (records is not None or operators is not None):
        fail("--quick: keeps a server's calibration to its isolated points; give --url or --launch")
    if steps and records is None:
        fail("--steps: rebuilds steps from the token times of --records runs; give --records")
    if records is not None and steps:
        _calibrate_from_token_times(load_or_exit(scenario_path), records, out)
    elif records is not None:
        _calibrate_from_records(
            load_or_exit(scenario_path), records, max_simulations, out, assume_arrivals
        )
    elif operators is not None:
        scenario = load_or_exit(scenario_path)
        if operators == "torch" or Path(operators).is_dir():
            _calibrate_from_torch(scenario, operators, device, out)
        else:
            _calibrate_from_operators(scenario, operators, data_dir, out)
    else:
        _calibrate_from_server(scenario_path, url, launch, model, budget, out, vocab_size, quick)


def _check_one_source(
    *, url: str | None, launch: bool, operators: str | None, records: list[Path] | None
) -> None:
    """Exit with an error naming the options when more than one source of measurements is set."""
    sources = [
        name
        for name, given in (
            ("--url", url),
            ("--launch", launch or None),
            ("--operators", operators),
            ("--records", records),
        )
        if given is not None
    ]
    if len(sources) > 1:
        fail(f"{' and '.join(sources)}: give one source of measurements, not several")


def _calibrate_from_server(
    scenario_path: Path,
    url: str | None,
    launch: bool,
    model: str | None,
    budget: str,
    out: Path,
    vocab_size: int | None = None,
    quick: bool = False,
) -> None:
    """Measure a server (the one at ``url``, or one launched) within ``budget``: the isolated
    points, then (unless ``quick``) the loaded replays of :mod:`calibration.loaded`; fit, write
    the profile and print the coefficients as JSON."""
    from calibration.fit import fit_steps
    from calibration.measure_plan import MeasurementPlan, parse_budget
    from calibration.measure_runner import measure
    from calibration.profile import EngineInfo, fitted_profile
    from live.tokens import PromptTokens

    scenario = load_or_exit(scenario_path)
    try:
        budget_s = parse_budget(budget)
    except ValueError as exc:
        fail(f"--budget: {exc}")
    engine = scenario.engine
    model_arch = scenario.resolve_model()
    isolated_budget_s = budget_s if quick else ISOLATED_SHARE * budget_s
    plan = MeasurementPlan.for_budget(
        isolated_budget_s,
        max_model_len=engine.max_model_len or model_arch.max_position_embeddings,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".server.log")
    loaded: list[Any] = []
    notes: list[str] = []
    with scenario_server(scenario, url, launch, model, log, vocab_size) as (
        base_url,
        served,
        vocab,
    ):
        started = time.monotonic()
        with progress("measuring") as update:
            measurement = measure(
                base_url,
                served,
                PromptTokens(vocab),
                plan,
                block_size=engine.block_size,
                budget_s=isolated_budget_s,
                progress=update,
            )
        coefficients, report = fit_steps(measurement.observations)
        if not quick:
            loaded = _loaded_replays(
                scenario,
                coefficients,
                (base_url, served, vocab),
                replays_dir(out),
                budget_s - (time.monotonic() - started),
                notes,
            )
        version = _server_version(base_url)
    data_summary: dict[str, Any] = {
        "source": "live measurement",
        "url": base_url,
        "observations": len(measurement.observations),
        "duration_s": measurement.duration_s,
        "by_kind": _count_kinds(measurement.observations),
    }
    engine_info = EngineInfo(name="vllm", version=version)
    if loaded:
        from calibration.loaded import fit_loaded
        from calibration.observations import observations_to_json

        isolated = fitted_profile(scenario, coefficients, report, engine=engine_info)
        isolated_path = isolated.save(replays_dir(out) / "profile-isolated.json")
        points = json.dumps(observations_to_json(measurement.observations), indent=1)
        (replays_dir(out) / "isolated-points.json").write_text(points + "\n", encoding="utf-8")
        joint = fit_loaded(scenario, measurement.observations, coefficients, loaded)
        coefficients, report = joint.coefficients, joint.report
        data_summary.update(
            source="live measurement and loaded replays",
            loaded_replays=joint.replays,
            isolated_profile=str(isolated_path),
        )
    report = report.model_copy(update={"notes": [*report.notes, *notes]})
    profile = fitted_profile(
        scenario, coefficients, report, engine=engine_info, data_summary=data_summary
    )
    profile.save(out)
    stderr.print(
        f"wrote {out}: {report.num_points} points, fit error mean "
        f"{report.relative_error_mean:.1%}, p90 {report.relative_error_p90:.1%}",
        highlight=False,
    )
    for note in notes:
        stderr.print(f"  {note}", highlight=False)
    if loaded:
        _print_loaded(data_summary["loaded_replays"], report)
    typer.echo(json.dumps(asdict(profile.coefficients)))


#: The share of ``calibrate --budget`` the isolated points get when loaded replays follow.
ISOLATED_SHARE = 0.5


def replays_dir(out: Path) -> Path:
    """Where ``calibrate --out OUT`` keeps its loaded replays (records, token times, metrics)
    and the profile of the isolated points alone: ``OUT`` less ``.json``, plus ``.replays``."""
    return out.with_name(out.stem + ".replays")


def _loaded_replays(
    scenario: Scenario,
    coefficients: CalibratedCoefficients,
    server: tuple[str, str, int],
    directory: Path,
    budget_s: float,
    notes: list[str],
) -> list[Any]:
    """Run the loaded replays on the server; none (and a note) when they cannot run."""
    import secrets

    from calibration.loaded import live_runner, run_loaded
    from live.replay import ReplayError, Target

    base_url, served, vocab = server
    runner = live_runner(Target(base_url, served), vocab, salt=secrets.randbelow(2**31))
    try:
        with progress("loaded replays") as update:
            return run_loaded(
                scenario, coefficients, runner, directory, budget_s, progress=update, notes=notes
            )
    except (ReplayError, ValueError) as exc:
        notes.append(f"loaded replays stopped ({exc}); the profile is the isolated points' fit")
        return []


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}×"


def _print_loaded(replays: list[dict[str, Any]], report: FitReport) -> None:
    """Per loaded replay: its load, the steps rebuilt, and the request-level error of the
    isolated fit beside the joint one's; then the leave-one-out errors."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:+.1%}"

    for replay in replays:
        offered = replay["offered_rps"]
        load = "burst" if offered is None else f"{offered:.3g} req/s"
        isolated, joint = replay["isolated_fit"], replay["joint_fit"]
        stderr.print(
            f"  {replay['name']} ({load}, {replay['requests']} requests, completed "
            f"{replay['completed_rps'] or float('nan'):.3g} req/s): {replay['steps_rebuilt']} "
            f"steps rebuilt; sim/live − 1 on TTFT mean {pct(isolated['ttft_mean_error'])} → "
            f"{pct(joint['ttft_mean_error'])}, E2E mean {pct(isolated['e2e_mean_error'])} → "
            f"{pct(joint['e2e_mean_error'])} (isolated points → with the loaded steps)",
            highlight=False,
        )
        ratios = [fit.get("step_ratio_median") for fit in (isolated, joint)]
        if all(ratios):
            stderr.print(
                "    steps measured / predicted (median), without a prompt and with one: "
                + "; ".join(
                    f"{label} {_times(r['decode'])}, {_times(r['prompt'])}"
                    for label, r in zip(("isolated fit", "joint fit"), ratios, strict=True)
                )
                + f" ({ratios[0]['decode_steps']:,} and {ratios[0]['prompt_steps']:,} steps)",
                highlight=False,
            )
        server, simulated = replay.get("server_ttft"), replay.get("simulated_ttft")
        if server and simulated:
            stderr.print(
                f"    TTFT mean, vLLM's / simulated: {_ttft_split(server)} / "
                f"{_ttft_split(simulated)}",
                highlight=False,
            )
    for held in report.held_out:
        stderr.print(
            f"  left out {held['workload']}: steps {held['step_relative_error_mean']:.1%} mean "
            f"|error|; TTFT mean {held['ttft_mean_error']:+.1%}, E2E mean "
            f"{held['e2e_mean_error']:+.1%} (fitted on the isolated points and the others)",
            highlight=False,
        )


def _ttft_split(parts: dict[str, float]) -> str:
    """A mean TTFT as ``total = before the engine queue + queued + prefill`` in ms."""
    return (
        f"{parts['ttft'] * 1e3:.1f} = {parts['outside_engine'] * 1e3:.1f} + "
        f"{parts['queue'] * 1e3:.1f} + {parts['prefill'] * 1e3:.1f} ms"
    )


def _calibrate_from_operators(scenario: Scenario, source: str, data_dir: Path, out: Path) -> None:
    from calibration.operator_tables import operator_profile

    model = scenario.resolve_model()
    gpu = scenario.resolve_gpu()
    try:
        profile = operator_profile(
            source,
            model=model.name,
            hardware=gpu.name,
            tensor_parallel_size=scenario.engine.tensor_parallel_size,
            data_dir=data_dir,
            dtype=scenario.dtype,
        )
    except (ValueError, OSError) as exc:
        fail(f"--operators: {exc}")
    _save_and_compare(scenario, profile, out, source)


def _calibrate_from_records(
    scenario: Scenario, paths: list[Path], max_simulations: int, out: Path, assume_arrivals: bool
) -> None:
    """Search coefficients under which a replay of the records reproduces their latencies."""
    import pandas as pd

    from calibration.records import (
        arrivals_unknown,
        fit_scenario_to_replays,
        read_records,
        roofline_coefficients,
    )
    from sim.engine.profile import load_profile

    frames: dict[str, pd.DataFrame] = {}
    for path in paths:
        if str(path) in frames:
            fail(f"--records: {path} is given twice")
        try:
            frames[str(path)] = read_records(path)
        except ValueError as exc:
            fail(str(exc))
        unknown = arrivals_unknown(path)
        if unknown and not assume_arrivals:
            fail(
                f"--records {path}: {unknown}; replaying them would fit a burst that never "
                "happened. Import a file with send times (vllm bench serve --save-detailed), or "
                "pass --assume-arrivals to fit them as a burst anyway"
            )
    num_records = sum(len(f) for f in frames.values())
    if isinstance(scenario.latency, ProfileLatencySpec):
        initial = load_profile(scenario.latency.path).coefficients
        start = f"the profile {scenario.latency.path}"
    else:
        initial = roofline_coefficients(scenario)
        start = "the scenario's roofline"
    each = " of each record set" if len(frames) > 1 else ""
    stderr.print(
        f"fitting {num_records} records from {start}: at most {max_simulations} simulations"
        f"{each}" + (f", then each of the {len(frames)} left out in turn" if each else ""),
        highlight=False,
    )
    try:
        with progress("fitting: simulations") as update:
            coefficients, report, hows = fit_scenario_to_replays(
                scenario, frames, initial, max_evaluations=max_simulations, progress=update
            )
    except ValueError as exc:
        fail(f"--records: {exc}")
    profile = _engine_profile(
        scenario,
        coefficients,
        report,
        {
            "source": "per-request records",
            "records": str(paths[0]) if len(paths) == 1 else [str(p) for p in paths],
            "num_records": num_records,
            "replayed": hows[0] if len(hows) == 1 else hows,
            "started_from": start,
        },
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
    stderr.print(
        f"wrote {out}: TTFT and E2E of {num_records} requests, fit error mean "
        f"{report.relative_error_mean:.1%}, p90 {report.relative_error_p90:.1%}",
        highlight=False,
    )
    for held in report.held_out:
        stderr.print(
            f"  left out {held['workload']}: TTFT mean |error| "
            f"{held['ttft_relative_error_mean']:.1%}, E2E {held['e2e_relative_error_mean']:.1%} "
            "(fitted on the others)",
            highlight=False,
        )
    typer.echo(json.dumps(asdict(profile.coefficients)))


def _engine_profile(
    scenario: Scenario,
    coefficients: CalibratedCoefficients,
    report: FitReport,
    data_summary: dict[str, Any],
) -> Profile:
    """A profile of records from a vLLM server of the scenario's vLLM version."""
    from calibration.profile import EngineInfo, fitted_profile

    return fitted_profile(
        scenario,
        coefficients,
        report,
        engine=EngineInfo(name="vllm", version=scenario.engine.vllm_version or ""),
        data_summary=data_summary,
    )


def _calibrate_from_token_times(scenario: Scenario, paths: list[Path], out: Path) -> None:
    """Fit the steps rebuilt from the runs' streamed token times (calibration/steps.py)."""
    from calibration.fit import fit_steps
    from calibration.records import read_records
    from calibration.steps import frontend_from_idle_arrivals, read_token_times, rebuild_steps

    observations = []
    skipped: dict[str, int] = {}
    pairs = []
    for path in paths:
        if not path.is_dir():
            fail(f"--records {path}: --steps needs a run directory (records and token_times)")
        try:
            records, token_times = read_records(path), read_token_times(path)
        except ValueError as exc:
            fail(str(exc))
        rebuilt = rebuild_steps(
            records, token_times, max_num_batched_tokens=scenario.engine.max_num_batched_tokens
        )
        observations += rebuilt.observations
        for reason, count in rebuilt.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
        pairs.append((records, token_times, rebuilt.gap_s))
        stderr.print(
            f"{path}: {rebuilt.num_bursts} token bursts (tokens under "
            f"{rebuilt.gap_s * 1e3:.3g} ms apart end one step), {len(rebuilt.observations)} "
            f"steps rebuilt, {sum(rebuilt.skipped.values())} left out",
            highlight=False,
        )
    try:
        coefficients, report = fit_steps(observations, method_name="token_time_steps")
    except ValueError as exc:
        fail(f"--records: {exc}")
    estimates = [frontend_from_idle_arrivals(r, t, coefficients, gap_s=g) for r, t, g in pairs]
    used = sum(n for _, n in estimates)
    frontend = (
        sum(f * n for f, n in estimates if n) / used if used else coefficients.frontend_overhead_s
    )
    coefficients = replace(coefficients, frontend_overhead_s=frontend)
    notes = [
        *(f"left out {n} steps: {reason}" for reason, n in skipped.items()),
        f"front end from {used} requests that found the engine idle"
        if used
        else "front end: no request found the engine idle; kept at 0",
    ]
    report = report.model_copy(update={"notes": [*report.notes, *notes]})
    profile = _engine_profile(
        scenario,
        coefficients,
        report,
        {
            "source": "engine steps rebuilt from streamed token times",
            "records": [str(p) for p in paths],
            "num_steps": len(observations),
            "steps_left_out": skipped,
            "frontend_requests": used,
        },
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
    stderr.print(
        f"wrote {out}: {len(observations)} steps, fit error mean "
        f"{report.relative_error_mean:.1%}, p90 {report.relative_error_p90:.1%}; front end "
        f"{frontend * 1e3:.2f} ms from {used} idle arrivals",
        highlight=False,
    )
    typer.echo(json.dumps(asdict(profile.coefficients)))


def _calibrate_from_torch(scenario: Scenario, operators: str, device: str, out: Path) -> None:
    """Time the operators with torch (``operators == 'torch'``) or read tables it wrote."""
    from calibration.operator_tables import profiled_profile
    from calibration.operators import check_tables_match, profile_operators, read_tables

    model = scenario.resolve_model()
    if model.is_moe:
        fail(
            f"--operators: {model.name} is a mixture of experts, and the operator profiler times "
            "a dense MLP; calibrate it against a live server (--url or --launch) instead"
        )
    tp = scenario.engine.tensor_parallel_size
    try:
        if operators == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                fail("--operators torch: torch is not installed; pip install 'servesim[live]'")
            tables_dir = out.with_name(out.stem + ".operators")
            with progress("profiling") as update:
                tables = profile_operators(
                    model,
                    tensor_parallel_size=tp,
                    dtype=scenario.dtype,
                    device=device,
                    progress=update,
                )
            tables.write(tables_dir)
            stderr.print(f"wrote operator tables to {tables_dir}", highlight=False)
        else:
            tables_dir = Path(operators)
            tables = read_tables(tables_dir)
            check_tables_match(tables, model, tp)
        profile = profiled_profile(
            tables, hardware=scenario.resolve_gpu().name, source=str(tables_dir)
        )
    except ValueError as exc:
        fail(f"--operators: {exc}")
    if tables.meta.get("device") == "cpu" and not is_cpu_backend(profile.hardware):
        stderr.print(
            f"warning: the operators were timed on a CPU, but the profile is for "
            f"{profile.hardware}; its step times are the CPU's",
            highlight=False,
        )
    _save_and_compare(scenario, profile, out, "the torch operator profiler")


def _save_and_compare(scenario: Scenario, profile: Any, out: Path, source: str) -> None:
    """Write the profile and print its step times next to the roofline's."""
    from calibration.operator_tables import canonical_batches, compare_with_roofline
    from sim.engine.latency import RooflineModel

    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
    report = profile.fit
    stderr.print(
        f"wrote {out}: {report.num_points} points from {source}, fit error mean "
        f"{report.relative_error_mean:.1%}, p90 {report.relative_error_p90:.1%}",
        highlight=False,
    )
    roofline = RooflineModel(
        scenario.resolve_model(),
        scenario.resolve_gpu(),
        dtype=scenario.dtype,
        tensor_parallel_size=scenario.engine.tensor_parallel_size,
    )
    for row in compare_with_roofline(profile, roofline, canonical_batches()):
        typer.echo(
            f"{row['batch']:<28} profile {row['profile_ms']:8.2f} ms   roofline "
            f"{row['roofline_ms']:8.2f} ms   ratio {row['ratio']:.2f}"
        )


def _count_kinds(observations: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for observation in observations:
        counts[observation.kind] = counts.get(observation.kind, 0) + 1
    return counts


def _server_version(base_url: str) -> str:
    import httpx

    try:
        response = httpx.get(f"{base_url}/version", timeout=5)
        return str(response.json().get("version", ""))
    except (httpx.HTTPError, ValueError):
        return ""


def validate(
    scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO", help="held-out workload")],
    profile: Annotated[Path, typer.Option(help="calibration profile to validate")],
    out: Annotated[Path, typer.Option("--out", help="report directory")] = Path("validation"),
    url: Annotated[str | None, typer.Option(help="an existing server")] = None,
    launch: Annotated[bool, typer.Option(help="start vLLM with the scenario's knobs")] = False,
    model: Annotated[str | None, typer.Option(help="model to launch (path or id)")] = None,
    max_error: Annotated[float, typer.Option(help="bound on headline relative errors")] = 0.2,
    max_hit_rate_error: Annotated[float, typer.Option(help="bound in hit-rate points")] = 0.03,
    vocab_size: Annotated[
        int | None,
        typer.Option(help="the model's vocabulary size (default: the scenario's model's)", min=1),
    ] = None,
) -> None:
    """Simulate SCENARIO with PROFILE, run it live, print the errors; exit 1 above the bounds."""
    from calibration.validate import (
        ServerSide,
        Thresholds,
        cdf_figure_html,
        compare,
        format_table,
    )
    from live.replay import Target
    from live.run import run_live
    from live.tokens import PromptTokens, fresh_salt
    from sim.engine.profile import load_profile
    from sim.run import build

    scenario = load_or_exit(scenario_path)
    scenario = scenario.model_copy(
        update={"latency": ProfileLatencySpec(type="profile", path=str(profile))}
    )
    try:
        simulation = build(scenario)
        with progress("simulating", len(simulation.requests)) as update:
            simulated = simulation.run(progress=update)
    except ValueError as exc:
        fail(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    with scenario_server(scenario, url, launch, model, out / "server.log", vocab_size) as (
        base_url,
        served,
        vocab,
    ):
        # A fresh salt: the live half must not hit what an earlier run left in the cache.
        tokens = PromptTokens(vocab, salt=fresh_salt())
        with progress("live requests", len(simulated.records)) as update:
            live = run_live(
                scenario, Target(base_url, served), tokens, out_dir=out, progress=update
            )
    server = None
    if live.metrics is not None and live.metrics.ttft.count:
        frontend = load_profile(profile).coefficients.frontend_overhead_s
        server = ServerSide.from_metrics(live.metrics, frontend)
    report = compare(
        live.summary,
        simulated.summary,
        Thresholds(max_error, max_hit_rate_error),
        server=server,
    )
    (out / "report.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    cdf_figure_html(live.records, simulated.records, out / "cdf.html")
    typer.echo(format_table(report))
    if not report.passed:
        for failure in report.failures:
            stderr.print(f"[bold red]over bound:[/] {failure}", highlight=False)
        raise typer.Exit(code=1)
    stderr.print(f"within bounds; report in {out}", highlight=False)
