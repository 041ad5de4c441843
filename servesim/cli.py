"""The ``servesim`` command line: run a scenario, inspect a model on a GPU, list catalogues.

Bad input ends with one line per problem on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from sim.catalog.hardware import GPU_CATALOG, dtype_spelling, get_gpu
from sim.catalog.models import MODEL_CATALOG, get_model
from sim.console import fail, load_or_exit, milliseconds, progress, stderr, warnings_on_stderr
from sim.engine.latency import BatchShape, RooflineModel, prefill_chunk_pairs
from sim.engine.memory import kv_dtype_for, plan_memory
from sim.report.outputs import json_text
from sim.report.record_sink import STREAM_ABOVE
from sim.report.sketch import RANK_ERROR
from sim.run import build
from sim.scenario import (
    Scenario,
    default_scenario_text,
)

app = typer.Typer(
    help="servesim: what will this LLM deployment do under this traffic?",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
stdout = Console()


def _print_summary(scenario: Scenario, summary: dict[str, Any]) -> None:
    table = Table(title=f"{scenario.name}: latency (ms)", title_justify="left")
    table.add_column("metric")
    columns = list(summary["ttft_s"])  # mean, then every percentile the run reports
    for column in columns:
        table.add_column(column, justify="right")
    for key, label in (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("itl_s", "ITL"),
        ("e2e_s", "E2E"),
        ("queue_s", "queueing"),
    ):
        row = summary[key]
        table.add_row(label, *(milliseconds(row.get(c)) for c in columns))
    stdout.print(table)

    slo = summary["slo"]
    throughput = summary["throughput"]
    requests = summary["requests"]
    facts = Table(show_header=False, title="throughput, SLO, cache", title_justify="left")
    facts.add_column("what")
    facts.add_column("value", justify="right")
    facts.add_row("requests/s", f"{throughput['requests_per_s']:.2f}")
    facts.add_row("output tokens/s", f"{throughput['output_tokens_per_s']:,.0f}")
    facts.add_row("total tokens/s", f"{throughput['total_tokens_per_s']:,.0f}")
    per_gpu = throughput.get("output_tokens_per_s_per_gpu")
    per_user = throughput.get("output_tokens_per_s_per_user")
    facts.add_row("output tokens/s per GPU", "—" if per_gpu is None else f"{per_gpu:,.0f}")
    facts.add_row("output tokens/s per user", "—" if per_user is None else f"{per_user:,.1f}")
    pct = f"p{slo['percentile']:g}"
    facts.add_row(
        f"SLO TTFT {pct} ≤ {milliseconds(slo['ttft_target_s'])} ms",
        f"{milliseconds(slo['ttft_at_percentile_s'])} ms",
    )
    facts.add_row(
        f"SLO TPOT {pct} ≤ {milliseconds(slo['tpot_target_s'])} ms",
        f"{milliseconds(slo['tpot_at_percentile_s'])} ms",
    )
    if slo.get("e2e_target_s") is not None:
        facts.add_row(
            f"SLO E2E {pct} ≤ {milliseconds(slo['e2e_target_s'])} ms",
            f"{milliseconds(slo['e2e_at_percentile_s'])} ms",
        )
    facts.add_row("SLO met", "yes" if slo["met"] else "[bold red]no[/]")
    attainment = summary["goodput"]["slo_attainment"]
    facts.add_row("SLO attainment", "—" if attainment is None else f"{attainment:.1%}")
    facts.add_row("goodput requests/s", f"{summary['goodput']['requests_per_s']:.2f}")
    facts.add_row("prefix-cache hit rate", f"{summary['prefix_cache']['hit_rate']:.1%}")
    facts.add_row("preemptions", str(summary["preemptions"]))
    facts.add_row("KV capacity (tokens)", f"{summary['kv_capacity_tokens']:,}")
    cost = summary.get("cost")
    if cost is not None:
        facts.add_row("GPU-hours", f"{cost['gpu_hours']:,.2f}")
        if cost["total_usd"] is None:
            facts.add_row("cost", f"no price for {', '.join(cost['missing_prices'])}")
        else:
            per_hour = cost["usd_per_hour"]  # None when no time passed (all rejected at t = 0)
            facts.add_row("cost (USD/hour)", "—" if per_hour is None else f"{per_hour:,.2f}")
            per_m = cost["usd_per_million_output_tokens"]
            facts.add_row(
                "USD per million output tokens", "—" if per_m is None else f"{per_m:,.3f}"
            )
    statuses = ", ".join(f"{k} {v}" for k, v in requests.items() if k != "total" and v)
    facts.add_row("requests", f"{requests['total']:,} ({statuses})")
    sim = summary["sim"]
    facts.add_row("simulated / wall", f"{sim['simulated_s']:,.1f} s / {sim['wall_s']:.2f} s")
    if sim.get("percentiles") == "t-digest":
        facts.add_row("percentiles", f"t-digest (rank error ≤ {RANK_ERROR:.1%})")
    stdout.print(facts)
    if "fleet" in summary:
        _print_fleet(summary["fleet"])
    stability = summary.get("stability", {})
    if not stability.get("stable", True):
        stdout.print(f"[bold red]{stability['message']}[/]", highlight=False)


def _print_fleet(fleet: dict[str, Any]) -> None:
    table = Table(
        title=f"fleet: {fleet['replicas']} replicas, {fleet['router']} routing",
        title_justify="left",
    )
    for column in ("replica", "requests", "hit rate", "busy", "preemptions", "up (s)"):
        table.add_column(column, justify="right")
    for replica in fleet["per_replica"]:
        hit, busy = replica["prefix_cache_hit_rate"], replica["busy_fraction"]
        stopped = replica["stopped_s"]
        table.add_row(
            str(replica["replica_id"]),
            str(replica["requests"]),
            "—" if hit is None else f"{hit:.1%}",
            "—" if busy is None else f"{busy:.0%}",
            str(replica["preemptions"]),
            f"{replica['started_s']:.0f}–" + ("" if stopped is None else f"{stopped:.0f}"),
        )
    stdout.print(table)
    scaling = fleet.get("autoscaling")
    if scaling:
        events = ", ".join(
            f"{e['time_s']:.0f}s {e['current']}→{e['desired']}" for e in scaling["events"]
        )
        stdout.print(
            f"autoscaling on {scaling['metric']} (target {scaling['target']:g}, replica start-up "
            f"{scaling['startup_s']:.0f} s): {events or 'no scale events'}",
            highlight=False,
        )


@app.command()
def run(
    scenario_path: Annotated[
        Path | None,
        typer.Argument(metavar="[SCENARIO]", help="scenario YAML; the embedded default if omitted"),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="write records, time series and summary.json here")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="file format of records and time series: parquet|csv; vllm-bench: parquet "
            "plus vllm_bench.json (vllm bench serve's result keys), which --json prints",
        ),
    ] = "parquet",
    seed: Annotated[int | None, typer.Option(help="override the scenario's seed")] = None,
    percentiles: Annotated[
        str | None,
        typer.Option(
            help="latency percentiles to report besides 50,90,95,99, e.g. 99.9 "
            "(replaces output.percentiles)"
        ),
    ] = None,
    num_replications: Annotated[
        int,
        typer.Option(
            "--replications",
            help="also run this many seeds (from the scenario's) and report mean ± 95 % CI",
        ),
    ] = 1,
    records_mode: Annotated[
        str,
        typer.Option(
            "--records",
            help="keep: hold every record and build one table at the end; stream: write them "
            "to --out in chunks as requests end (memory flat in the number of requests; "
            "percentiles exact up to 1M values, a t-digest past that); auto: stream above "
            f"{STREAM_ABOVE:,} requests",
        ),
    ] = "auto",
) -> None:
    """Simulate a scenario and print TTFT/TPOT/E2E percentiles, throughput, goodput, hit rate."""
    if fmt not in ("parquet", "csv", "vllm-bench"):
        fail(f"--format: must be parquet, csv or vllm-bench, got {fmt!r}")
    if records_mode not in ("auto", "keep", "stream"):
        fail(f"--records: must be auto, keep or stream, got {records_mode!r}")
    chosen = _percentiles_or_exit(percentiles)
    if num_replications < 1:
        fail(f"--replications: must be >= 1, got {num_replications}")
    if seed is not None and seed < 0:
        # The scenario's own seed is checked the same way; numpy's seed sequences take no sign.
        fail(f"--seed: must be >= 0, got {seed}")
    with warnings_on_stderr():
        scenario = load_or_exit(scenario_path)
        if seed is not None:
            scenario = scenario.model_copy(update={"seed": seed})
        if chosen is not None:
            output = scenario.output.model_copy(update={"percentiles": list(chosen)})
            scenario = scenario.model_copy(update={"output": output})
        try:
            simulation = build(scenario)
        except ValueError as exc:
            fail(str(exc))
    num_requests = len(simulation.requests)
    stream = records_mode == "stream" or (records_mode == "auto" and num_requests > STREAM_ABOVE)
    if stream and fmt == "vllm-bench":
        fail(
            "--format vllm-bench: needs every record in memory, and this run streams them "
            f"({num_requests:,} requests); add --records keep, or use --format parquet"
        )
    file_format: Literal["parquet", "csv"] = "csv" if fmt == "csv" else "parquet"
    with progress("simulating", num_requests, disable=as_json) as update:
        result = simulation.run(progress=update, stream=stream, out_dir=out, fmt=file_format)
    if out is not None:
        written = result.write(out, file_format)
        if result.records_path is not None:
            written.insert(0, result.records_path)
            stderr.print(
                f"records streamed ({num_requests:,} requests): no report.html or metrics.om, "
                "which need every record in memory (--records keep makes them)",
                highlight=False,
            )
        else:
            from sim.report.html import run_report

            written.append(
                run_report(
                    Path(out) / "report.html",
                    scenario.name,
                    result.records,
                    result.timeseries,
                    result.summary,
                    scenario.slo.model_dump(),
                )
            )
        if scenario.output.prometheus and result.records_path is None:
            from sim.report.prometheus import openmetrics_backfill, write_backfill

            text = openmetrics_backfill(
                result.timeseries, result.records, model_name=scenario.resolve_model().name
            )
            written.append(write_backfill(Path(out) / "metrics.om", text))
        if fmt == "vllm-bench":
            bench_path = Path(out) / "vllm_bench.json"
            bench_path.write_text(json_text(_vllm_bench(scenario, result)))
            written.append(bench_path)
        for path in written:
            stderr.print(f"wrote {path}", highlight=False)
    if num_replications > 1:
        from sim.planning.sweep import replications

        try:
            with progress("replications", num_replications, disable=as_json) as update:
                result.summary["replications"] = replications(
                    scenario.model_dump(mode="json"), num_replications, progress=update
                )
        except ValueError as exc:
            fail(str(exc))
    if as_json:
        document = _vllm_bench(scenario, result) if fmt == "vllm-bench" else result.summary
        sys.stdout.write(json_text(document))
    else:
        _print_summary(scenario, result.summary)
        if num_replications > 1:
            _print_replications(result.summary["replications"])


def _percentiles_or_exit(text: str | None) -> tuple[float, ...] | None:
    """``--percentiles 50,90,99.9`` as numbers in (0, 100); exit 2 naming the bad one."""
    if text is None:
        return None
    values = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = float(part)
        except ValueError:
            fail(f"--percentiles: {part!r} is not a number; give e.g. 50,90,99.9")
        if not 0 < value < 100:
            fail(f"--percentiles: {part} must be between 0 and 100 (exclusive)")
        values.append(value)
    return tuple(values)


def _vllm_bench(scenario: Any, result: Any) -> dict[str, Any]:
    """The run as ``vllm bench serve``'s result document (sim/report/vllm_bench.py)."""
    from sim.report.vllm_bench import VLLM_DEFAULT_PERCENTILES, vllm_bench_result

    arrival = scenario.workload.arrival
    rate = getattr(arrival, "rate", None)
    cv = getattr(arrival, "cv", None)
    return vllm_bench_result(
        result.records,
        itl=result.summary["itl_s"],
        goodput_requests_per_s=result.summary["goodput"]["requests_per_s"],
        model_id=scenario.resolve_model().name,
        request_rate=rate,
        burstiness=1.0 if cv is None else cv**-2,
        max_concurrency=scenario.workload.max_concurrency,
        percentiles=scenario.output.percentiles or VLLM_DEFAULT_PERCENTILES,
    )


def _print_replications(replicated: dict[str, Any]) -> None:
    seeds = replicated["seeds"]
    table = Table(
        title=f"over seeds {seeds[0]}–{seeds[-1]}: mean ± {replicated['level']:.0%} interval",
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("±", justify="right")
    for metric, values in replicated["metrics"].items():
        mean, half = values["mean"], values["half_width"]
        table.add_row(
            metric,
            "—" if mean is None else f"{mean:.4g}",
            "—" if half is None else f"{half:.2g}",
        )
    stdout.print(table)


@app.command()
def inspect(
    model: Annotated[str, typer.Option(help="catalogue model, e.g. llama-3.1-8b")],
    gpu: Annotated[str, typer.Option(help="catalogue GPU, e.g. h100-sxm")],
    tp: Annotated[int, typer.Option(help="tensor_parallel_size")] = 1,
    dtype: Annotated[
        str, typer.Option(help="weight dtype: bf16, fp16, fp8, int8, int4 (or bfloat16, auto)")
    ] = "bf16",
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype (default: 16-bit)")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option()] = 0.9,
    max_num_batched_tokens: Annotated[int, typer.Option()] = 8192,
    block_size: Annotated[int, typer.Option()] = 16,
) -> None:
    """Weight memory, KV bytes per token, KV capacity and roofline step times for one replica."""
    try:
        arch = get_model(model)
        device = get_gpu(gpu)
        dtype = dtype_spelling(dtype)
        dtype = "bf16" if dtype == "auto" else dtype  # vLLM's --dtype auto: 16-bit weights
        kv = kv_dtype_for(dtype, dtype_spelling(kv_dtype or "auto"))
        plan = plan_memory(
            arch,
            device,
            dtype=dtype,
            kv_dtype=kv,
            tensor_parallel_size=tp,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
        )
        roofline = RooflineModel(arch, device, dtype=dtype, kv_dtype=kv, tensor_parallel_size=tp)
    except ValueError as exc:
        fail(str(exc))
    facts = Table(show_header=False, title=f"{arch.name} on {tp}× {device.name} ({dtype})")
    facts.add_column("what")
    facts.add_column("value", justify="right")
    facts.add_row("parameters", f"{arch.num_params / 1e9:.2f} B")
    if arch.is_moe:
        facts.add_row(
            "active per token",
            f"{arch.num_active_params / 1e9:.2f} B ({arch.num_experts_per_token} of "
            f"{arch.num_experts} experts)",
        )
    facts.add_row("weights per GPU", f"{plan.weight_bytes / 1e9:.2f} GB")
    facts.add_row("KV bytes per token (whole model)", f"{arch.kv_bytes_per_token(kv):,.0f}")
    facts.add_row("KV bytes per token per GPU", f"{plan.kv_bytes_per_token:,.0f}")
    facts.add_row("activation reserve per GPU", f"{plan.activation_bytes / 1e9:.2f} GB")
    facts.add_row("KV cache per GPU", f"{plan.kv_bytes / 1e9:.2f} GB")
    facts.add_row("KV capacity", f"{plan.kv_capacity_tokens:,} tokens ({plan.num_blocks:,} blocks)")
    stdout.print(facts)
    steps = Table(title="roofline step time", title_justify="left")
    steps.add_column("step")
    steps.add_column("ms", justify="right")
    steps.add_column("tokens/s", justify="right")
    parts = Table(title="where it goes (ms)", title_justify="left")
    parts.add_column("step", no_wrap=True)
    for name in INSPECT_PARTS:
        parts.add_column(name, justify="right")
    shapes: list[tuple[str, str, BatchShape, int]] = [
        (
            f"decode batch {batch} @ 1k context",
            f"decode {batch}",
            BatchShape(
                num_decode_seqs=batch, decode_context_tokens=batch * 1024, num_sampled=batch
            ),
            batch,
        )
        for batch in (1, 32, 128)
    ]
    shapes += [
        (
            f"prefill {length} tokens",
            f"prefill {length}",
            BatchShape(
                num_prefill_tokens=length,
                num_prefill_seqs=1,
                prefill_attention_pairs=prefill_chunk_pairs(length, 0),
                num_sampled=1,
            ),
            length,
        )
        for length in (512, 2048)
    ]
    for label, short, shape, tokens in shapes:
        t = roofline.step_time(shape)
        steps.add_row(label, f"{t * 1e3:.2f}", f"{tokens / t:,.0f}")
        split = roofline.step_parts(shape)
        cells = (sum(split.get(key, 0.0) for key in keys) * 1e3 for keys in INSPECT_PARTS.values())
        parts.add_row(short, *(f"{cell:.2f}" for cell in cells))
    stdout.print(steps)
    stdout.print(parts)


#: inspect's step-time columns: RooflineModel.step_parts keys summed into each.
INSPECT_PARTS = {
    "linear": ("linear layers", "lm head"),
    "GEMM fix": ("gemm fixed",),  # the part of linear the kernels' fixed time takes
    "attn": ("attention",),
    "elemwise": ("element-wise",),
    "comm": ("all-reduce", "pipeline hand-off"),
    "overhead": ("step overhead",),
}


@app.command()
def check(scenario_path: Annotated[Path, typer.Argument(metavar="SCENARIO")]) -> None:
    """Check a scenario file and report every problem, one line each."""
    with warnings_on_stderr():
        scenario = load_or_exit(scenario_path)
        try:
            build(scenario)
        except ValueError as exc:
            fail(str(exc))
    stdout.print(f"{scenario_path}: ok")


@app.command("default-scenario")
def show_default() -> None:
    """Print the embedded default scenario (a starting point for your own)."""
    sys.stdout.write(default_scenario_text())


@app.command()
def catalog() -> None:
    """List the GPUs and models servesim knows."""
    gpus = Table(title="GPUs", title_justify="left")
    columns = ("key", "name", "memory GB", "HBM TB/s", "bf16 TFLOPS", "fp8 TFLOPS", "link GB/s")
    for column in columns:
        gpus.add_column(column, no_wrap=column == "key")
    for key, gpu in GPU_CATALOG.items():
        fp8 = f"{gpu.fp8_flops / 1e12:,.0f}" if gpu.fp8_flops else "—"
        # The link's kind decides vLLM's all-reduce (sim/engine/collectives.py allreduce_kernel).
        kind = {"nvlink": "NVLink", "pcie": "PCIe"}[gpu.interconnect]
        link = f"{gpu.link_bandwidth_bytes_per_s / 1e9:,.0f} {kind}"
        if gpu.bridge_size and gpu.bridge_bandwidth_bytes_per_s:
            bridge = gpu.bridge_bandwidth_bytes_per_s / 1e9
            link += f", NVLink bridge ×{gpu.bridge_size} {bridge:,.0f}"
        gpus.add_row(
            key,
            gpu.name,
            f"{gpu.memory_bytes / 1e9:.0f}",
            f"{gpu.memory_bandwidth_bytes_per_s / 1e12:.2f}",
            f"{gpu.bf16_flops / 1e12:,.0f}",
            fp8,
            link
            + ("" if gpu.peer_to_peer else ", no P2P")
            + (", SHARP" if gpu.nvlink_multicast else ""),
        )
    stdout.print(gpus)
    models = Table(title="models", title_justify="left")
    for column in ("key", "params B", "layers", "hidden", "heads/kv", "KV bytes/token bf16"):
        models.add_column(column)
    for key, arch in MODEL_CATALOG.items():
        models.add_row(
            key,
            f"{arch.num_params / 1e9:.2f}"
            + (f" ({arch.num_active_params / 1e9:.1f} active)" if arch.is_moe else ""),
            str(arch.num_layers),
            str(arch.hidden_size),
            f"{arch.num_attention_heads}/{arch.num_key_value_heads}",
            f"{arch.kv_bytes_per_token('bf16'):,.0f}",
        )
    stdout.print(models)


def _add_live_commands() -> None:
    # The live executor's and calibration's commands; heavy dependencies load when one runs.
    from calibration.cli import calibrate, validate
    from live.cli import app as live_app
    from servesim.plan_cli import plan, sweep

    app.add_typer(live_app, name="live")
    app.command()(calibrate)
    app.command()(validate)
    app.command()(sweep)
    app.command()(plan)


_add_live_commands()


def main() -> None:
    """Entry point for ``python -m sim``."""
    app()


if __name__ == "__main__":
    main()
