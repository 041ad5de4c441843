"""``servesim live …``: replay a scenario against a real server, make a tiny model, import
results of other benchmark tools. Heavy imports (httpx, torch, vLLM) happen inside commands.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from sim.console import fail, load_or_exit, milliseconds, progress, stderr
from sim.files import DocumentError, read_document
from sim.scenario import Scenario

if TYPE_CHECKING:
    from live.replay import RecordsFile, ReplayOptions
    from live.run import LiveResult
    from live.server import VLLMServer
    from sim.engine.request import Request

app = typer.Typer(
    help="Run workloads against a real vLLM server and record them in servesim's schema.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

#: The catalogue name of the model `servesim live tiny-model` writes.
TINY_MODEL = "servesim-tiny-llama"


def vocab_size_of(
    model: str | None, vocab_size: int | None, scenario: Scenario | None = None
) -> int:
    """The vocabulary to draw prompt token ids from: given, read from a local model, or the
    scenario's model (catalogue, hf_config or custom dimensions)."""
    if vocab_size is not None:
        return vocab_size
    if model is not None:
        config = Path(model) / "config.json"
        if config.is_file():
            try:
                return int(read_document(config, format="json", expect=dict)["vocab_size"])
            except DocumentError as exc:
                fail(f"--model: cannot read vocab_size from {config}: {exc.problem}")
            except (KeyError, ValueError, TypeError) as exc:
                fail(f"--model: cannot read vocab_size from {config}: {exc}")
    if scenario is not None:
        try:
            return scenario.resolve_model().vocab_size
        except ValueError:
            pass  # an unreadable hf_config: say what to give instead
    fail(
        "--vocab-size: give the model's vocabulary size (or --model pointing at a local model "
        "directory) so prompts are made of valid token ids"
    )


@contextlib.contextmanager
def scenario_server(
    scenario: Scenario,
    url: str | None,
    launch: bool,
    model: str | None,
    log_path: Path,
    vocab_size: int | None = None,
) -> Iterator[tuple[str, str, int]]:
    """Launch vLLM with the scenario's knobs, or attach to ``url``; stopped on exit.

    Yields ``(base url, served model name, vocabulary size)``.
    """
    from live.server import EndpointError, ServerStartError, attach

    if (url is None) == (not launch):
        fail("give exactly one of --url URL or --launch")
    if launch and model is None:
        if scenario.model != TINY_MODEL:
            fail(
                f"--model: give the model to launch for {scenario.model} (a local path or a "
                f"Hugging Face id); without it only model: {TINY_MODEL} launches on its own"
            )
        from live.tiny_model import ensure_tiny_model

        model = str(ensure_tiny_model())
    vocab = vocab_size_of(model, vocab_size, scenario)
    if not launch:
        assert url is not None
        try:
            yield url, attach(url), vocab
        except EndpointError as exc:
            fail(str(exc))
        return
    assert model is not None
    try:
        server = launcher(scenario, model, log_path)
        stderr.print(f"starting vLLM ({model}); log: {log_path}", highlight=False)
        server.start()
    except (ServerStartError, ValueError) as exc:
        fail(str(exc))
    try:
        yield server.url, server.model_name, vocab
    finally:
        server.stop()


def launcher(scenario: Scenario, model: str, log_path: Path) -> VLLMServer:
    """The (not yet started) vLLM server for the scenario: its engine knobs, dtypes,
    quantization and pipeline parallelism, flagged exactly as ``servesim`` exports them."""
    from live.server import VLLMServer
    from sim.serve_flags import scenario_dtype_args

    torch_dtype, extra = scenario_dtype_args(scenario, model)
    return VLLMServer(
        model, scenario.engine, log_path=log_path, dtype=torch_dtype, extra_args=extra
    )


@app.command("tiny-model")
def tiny_model(
    directory: Annotated[Path, typer.Argument(help="where to write the model")],
    seed: Annotated[int, typer.Option(help="weights and tokenizer seed")] = 0,
) -> None:
    """Write a tiny Llama-architecture model with random weights and a local tokenizer."""
    from live.tiny_model import TinyModelSpec, write_tiny_model

    path = write_tiny_model(directory, TinyModelSpec(seed=seed))
    typer.echo(str(path))


@app.command("run")
def run_command(
    scenario_path: Annotated[
        Path | None, typer.Argument(metavar="[SCENARIO]", help="scenario YAML (default: embedded)")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("live-run"),
    url: Annotated[
        str | None, typer.Option("--url", help="an existing OpenAI-compatible server")
    ] = None,
    launch: Annotated[
        bool, typer.Option("--launch", help="start `vllm serve` with the scenario's engine knobs")
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(help=f"model to launch (path or name); default for {TINY_MODEL}: generated"),
    ] = None,
    vocab_size: Annotated[int | None, typer.Option(help="the model's vocabulary size")] = None,
    endpoint: Annotated[str, typer.Option(help="completions | chat")] = "completions",
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            help="cap on in-flight requests (a closed loop); replaces the scenario's "
            "workload.max_concurrency"
        ),
    ] = None,
    warmup: Annotated[int, typer.Option(help="warm-up requests before the measured part")] = 2,
    timeout_s: Annotated[float, typer.Option(help="per-request deadline in seconds")] = 600.0,
    fmt: Annotated[str, typer.Option("--format", help="parquet | csv")] = "parquet",
    prompt_salt: Annotated[
        int | None,
        typer.Option(
            "--prompt-salt",
            help="salt of the prompts' token ids (default: a fresh one, or the resumed run's); "
            "0 sends the scenario's own tokens. A repeated run with the same salt hits what "
            "the last one left in the server's prefix cache",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="resume the interrupted run in --out: keep its ok and rejected records, send "
            "the other requests again",
        ),
    ] = False,
) -> None:
    """Replay the scenario's workload against a real server and write records and a summary.

    With ``--resume`` the run in ``--out`` continues: requests whose record there is ``ok`` or
    ``rejected`` are not sent again, every other request is, keeping the remaining requests'
    schedule relative to each other (the first goes at once). Their TTFT is measured under the
    load of the resumed part only.
    """
    # The signature is typer's declaration of the options; the body checks the flags and hands
    # over to the helpers below. (No such note in the docstring: typer prints it as --help.)
    from live.replay import ReplayOptions
    from sim.run import scenario_requests

    _check_run_flags(endpoint, fmt, max_concurrency)
    scenario = load_or_exit(scenario_path)
    if max_concurrency is not None:
        workload = scenario.workload.model_copy(update={"max_concurrency": max_concurrency})
        scenario = scenario.model_copy(update={"workload": workload})
    options = ReplayOptions(
        max_concurrency=scenario.workload.max_concurrency,
        think_time_s=scenario.workload.think_time_s,
        warmup_requests=warmup,
        timeout_s=timeout_s,
        read_timeout_s=timeout_s,
        record_token_times=scenario.output.record_token_times,
    )
    requests = scenario_requests(scenario)
    # Checked before a server is launched or attached: a refusal should cost nothing.
    resume_from = _read_resume_or_exit(out, scenario, requests) if resume else None
    salt = _prompt_salt_or_exit(prompt_salt, out if resume else None)
    out.mkdir(parents=True, exist_ok=True)
    server = _ServerChoice(url, launch, model, vocab_size, endpoint)
    result = _replay_on_server(scenario, server, out, options, requests, resume_from, salt)
    _report_run(result, out, fmt)


def _prompt_salt_or_exit(given: int | None, resumed: Path | None) -> int:
    """The salt to send prompts with: the given one, the resumed run's, or a fresh one."""
    from live.run import recorded_salt
    from live.tokens import fresh_salt

    if given is not None and given < 0:
        fail(f"--prompt-salt: must be >= 0, got {given}")
    if resumed is None:
        return fresh_salt() if given is None else given
    recorded = recorded_salt(resumed)
    if given is not None and given != recorded:
        fail(
            f"--prompt-salt: the run in {resumed} used salt {recorded}; resume with it (or "
            "leave the option out)"
        )
    return recorded


def _check_run_flags(endpoint: str, fmt: str, max_concurrency: int | None) -> None:
    """Exit with a message when a flag of ``live run`` has a value it does not take."""
    if endpoint not in ("completions", "chat"):
        fail(f"--endpoint: must be completions or chat, got {endpoint!r}")
    if fmt not in ("parquet", "csv"):
        fail(f"--format: must be parquet or csv, got {fmt!r}")
    if max_concurrency is not None and max_concurrency < 1:
        fail(f"--max-concurrency: must be >= 1, got {max_concurrency}")


def _read_resume_or_exit(out: Path, scenario: Scenario, requests: list[Request]) -> RecordsFile:
    """The interrupted run in ``out`` to resume, its warnings printed; exit if it cannot be."""
    from live.replay import RecordsFileError
    from live.run import read_resume

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resume_from = read_resume(out, scenario, requests)
    except RecordsFileError as exc:
        fail(f"--resume: {exc}; run without --resume to start a fresh run")
    for warning in caught:
        stderr.print(f"[yellow]warning:[/] {warning.message}", highlight=False, markup=True)
    kept = len(resume_from.kept())
    stderr.print(
        f"resuming {out}: {kept} of {len(requests)} requests already recorded ok or "
        f"rejected, sending {len(requests) - kept}",
        highlight=False,
    )
    return resume_from


@dataclass(frozen=True)
class _ServerChoice:
    """The ``live run`` flags that say which server to replay against, and how to talk to it."""

    url: str | None
    launch: bool
    model: str | None
    vocab_size: int | None
    endpoint: str


def _replay_on_server(
    scenario: Scenario,
    server: _ServerChoice,
    out: Path,
    options: ReplayOptions,
    requests: list[Request],
    resume_from: RecordsFile | None,
    salt: int,
) -> LiveResult:
    """Launch or attach to the server and replay; exit 130 on Ctrl-C, 1 if warm-up fails."""
    from live.replay import ReplayError, Target
    from live.run import run_live
    from live.tokens import PromptTokens

    try:
        with scenario_server(
            scenario, server.url, server.launch, server.model, out / "server.log", server.vocab_size
        ) as (base, served, vocab):
            target = Target(base, served, server.endpoint)  # type: ignore[arg-type]
            stderr.print(f"replaying {scenario.name} against {target.base_url}", highlight=False)
            with progress("live requests", len(requests)) as update:
                return run_live(
                    scenario,
                    target,
                    PromptTokens(vocab, salt=salt),
                    out_dir=out,
                    options=options,
                    requests=requests,
                    resume_from=resume_from,
                    progress=update,
                )
    except ReplayError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        stderr.print(
            f"interrupted; every record so far is in {out / 'records.jsonl'} (continue with "
            "--resume)"
        )
        raise typer.Exit(code=130) from None


def _report_run(result: LiveResult, out: Path, fmt: str) -> None:
    """Write the run's files and print its summary; exit 1 when the run was interrupted."""
    for path in result.write(out, "csv" if fmt == "csv" else "parquet"):
        stderr.print(f"wrote {path}", highlight=False)
    summary = result.summary
    ttft = summary["ttft_s"]
    statuses = ", ".join(f"{k} {v}" for k, v in summary["requests"].items() if k != "total" and v)
    ttft_p50, ttft_p90 = (milliseconds(ttft[k], ".1f") for k in ("p50", "p90"))
    tpot_p50 = milliseconds(summary["tpot_s"]["p50"], ".1f")
    typer.echo(
        f"{summary['requests']['total']} requests ({statuses}); TTFT p50 {ttft_p50} p90 "
        f"{ttft_p90} ms; TPOT p50 {tpot_p50} ms; prefix-cache hit rate "
        f"{summary['prefix_cache']['hit_rate']:.1%}"
    )
    _print_failures(result.records)
    resumed = summary["live"]["resume"]
    if resumed["resumed"]:
        typer.echo(
            f"resumed: {resumed['reused']} records reused from the earlier run, "
            f"{resumed['sent']} requests sent"
        )
    if summary["live"]["interrupted"]:
        stderr.print(
            f"[bold red]run interrupted:[/] {escape(summary['live']['reason'])}; continue with "
            "--resume"
        )
        raise typer.Exit(code=1)


def _print_failures(records: Any, top: int = 5) -> None:
    """The most frequent reasons requests did not complete, with their counts."""
    failed = records[records["status"] != "ok"]
    if failed.empty:
        return
    counts: dict[tuple[str, str], int] = {}
    for status, error in zip(failed["status"], failed["error"].fillna(""), strict=True):
        key = (str(status), str(error)[:160])
        counts[key] = counts.get(key, 0) + 1
    reasons = sorted(counts.items(), key=lambda item: -item[1])
    stderr.print(f"{len(failed)} requests did not complete:", highlight=False)
    for (status, reason), count in reasons[:top]:
        stderr.print(f"  {count:>6} {status}: {escape(reason) or '(no message)'}", highlight=False)
    if len(reasons) > top:
        stderr.print(f"  … and {len(reasons) - top} other reasons (see records)", highlight=False)


@app.command("import")
def import_command(
    path: Annotated[Path, typer.Argument(help="vllm bench serve or GuideLLM result JSON")],
    out: Annotated[Path, typer.Option("--out", help="output directory")] = Path("imported"),
    fmt: Annotated[str, typer.Option("--format", help="parquet | csv")] = "parquet",
    benchmark: Annotated[
        str | None,
        typer.Option(
            help="which run of a file with several (a GuideLLM sweep, vllm bench "
            "--append-result): its index, its name (constant@5, rate=inf, a label), or 'all' "
            "(each into OUT/<index>)"
        ),
    ] = None,
) -> None:
    """Read another benchmark tool's results into records (for calibration and validation)."""
    from live.importers import BenchmarkImportError, run_labels

    try:
        labels = run_labels(path) if benchmark is not None else []
    except (BenchmarkImportError, OSError) as exc:
        fail(str(exc))
    if benchmark == "all":
        for index in range(len(labels)):
            _import_one(path, out / str(index), fmt, index)
        return
    _import_one(path, out, fmt, None if benchmark is None else _run_index(benchmark, labels))


def _run_index(benchmark: str, labels: list[str]) -> int:
    """``--benchmark``'s run: an index, or the one run whose name is (or starts with) it."""
    names = ", ".join(f"{i}: {label}" for i, label in enumerate(labels))
    if benchmark.isdigit():
        index = int(benchmark)
        if index >= len(labels):
            fail(f"--benchmark: {index} is out of range; the file holds {names}")
        return index
    exact = [i for i, label in enumerate(labels) if label == benchmark]
    matches = exact or [i for i, label in enumerate(labels) if label.startswith(benchmark)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        fail(f"--benchmark: {what} named {benchmark!r}; the file holds {names}")
    return matches[0]


def _import_one(path: Path, out: Path, fmt: str, index: int | None) -> None:
    """One run of the file into ``out``: records, and ``import.json`` beside them."""
    from live.importers import IMPORT_META_FILE, BenchmarkImportError, import_records

    try:
        imported = import_records(path, benchmark_index=index)
    except (BenchmarkImportError, OSError) as exc:
        fail(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"records.{'csv' if fmt == 'csv' else 'parquet'}"
    if fmt == "csv":
        imported.records.to_csv(target, index=False)
    else:
        imported.records.to_parquet(target, index=False)
    # What the file said about the run, beside the records: `calibrate --records` reads it.
    meta = {"format": imported.format, "source": str(path), **imported.metadata}
    (out / IMPORT_META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    typer.echo(f"{len(imported.records)} records ({imported.format}) -> {target}")
    if imported.metadata.get("arrival_known") is False:
        stderr.print(
            "[bold yellow]warning:[/] the file has no start_times: every request's arrival_s "
            "is 0, as if all were sent at once. TTFT and E2E still hold; a replay or "
            "`calibrate --records` would see a burst that never happened (re-run vllm bench "
            "serve with --save-detailed to keep the send times)",
            highlight=False,
        )
