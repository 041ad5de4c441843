"""GPU fidelity: the out-of-the-box (roofline) model against five real H100 runs.

The runs are in ``shared/data/real_gpu_runs/h100_llama2_7b_inference_perf.csv`` (see that
folder's entry in SOURCES.md): Llama-2-7B fp16 on one H100 SXM, vLLM 0.15.1, driven by
inference-perf. Each stage's workload is rebuilt from the file's columns, as inference-perf's
``shared_prefix`` data generator makes it:

* ``prompt_reuse`` "G system prompts x Q questions": G system prompts of
  ``system_prompt_tokens`` tokens × Q questions = G·Q distinct prompts of ``prompt_tokens_mean``
  tokens, sent in a shuffled order, cyclically (every prompt is sent once per cycle, each cycle
  a fresh permutation), so after the first cycle every prompt is in the prefix cache up to its
  last partial block; "none" (or an empty cell): every request a prompt of its own, which
  shares only the ``system_prompt_tokens`` (if any) with every other;
* ``output_tokens`` decoded by every request (``ignore_eos``);
* ``arrival`` "poisson": Poisson arrivals at ``rate_rps`` (with "rescaled", gaps rescaled so
  that exactly ``num_requests`` arrive in ``duration_s``, as inference-perf does); "constant":
  evenly spaced;
* a run's stage_1 follows its stage_0 on the same server without a pause (so it starts with a
  warm cache and the stage_0 tail in flight): both are simulated as one run and scored apart.

Optional columns set engine flags the default file leaves at vLLM's defaults: ``pp``,
``gpu_memory_utilization``, ``enable_prefix_caching``, ``enable_chunked_prefill``,
``async_scheduling`` and ``kv_cache_dtype``. An empty ``max_num_seqs``,
``max_num_batched_tokens``, ``max_model_len`` or ``block_size`` cell is a server started without
that flag: vLLM's default for the GPU (the scenario fills the first two in), the model's context
and 16.

The prompts are written as a servesim JSONL trace whose ``hash_ids`` name each 16-token block
by what it holds (the blocks inside the system prompt by the group; the rest by the prompt), so
the simulated prefix cache hits exactly where vLLM's does. Nothing here is fitted to the runs:
the scenario is the catalogue model and GPU with vLLM's engine flags of the run.

Prints, per stage and metric, sim / real − 1, and the median |error| over the stages against
the issue's targets (TTFT mean and p90 within 10%, TPOT and E2E within 5%).

Run: ``.venv/bin/python benchmarks/fidelity_gpu.py [--seeds 3] [--json FILE] [--runs CSV]
[--profile PROFILE]`` (``--runs``: other real runs in the same columns; the ``gpu`` cell names a
catalogue GPU; ``--profile``: score a calibration profile, e.g. one ``servesim calibrate
--operators torch`` timed on the runs' GPU, in place of the roofline).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.catalog.hardware import dtype_spelling, get_gpu
from sim.catalog.model_names import checkpoint_quantization
from sim.engine.profile import ProfileError
from sim.run import build
from sim.scenario import EngineSpec, ScenarioError, parse_scenario

RUNS = Path(__file__).resolve().parents[2] / "shared/data/real_gpu_runs"
RUNS_FILE = RUNS / "h100_llama2_7b_inference_perf.csv"
#: Hash ids: each prompt (and each system prompt) numbers its blocks within its own range of
#: this many, and a prompt's own blocks lie above every system prompt's, from PROMPT_IDS.
BLOCK_IDS = 1 << 20
PROMPT_IDS = 1 << 40
REUSE = re.compile(r"(\d+)\s+system\s+prompts?\s*x\s*(\d+)\s+questions?", re.IGNORECASE)
METRICS = ("ttft", "tpot", "e2e")
STATS = ("mean", "p50", "p90", "p99")
#: The issue's targets: median |error| over the stages.
TARGETS = {("ttft", "mean"): 0.10, ("ttft", "p90"): 0.10, ("tpot", "mean"): 0.05}
TARGETS |= {("tpot", "p90"): 0.05, ("e2e", "mean"): 0.05, ("e2e", "p90"): 0.05}


class RunsFileError(ValueError):
    """A cell of the runs file this benchmark cannot rebuild a workload from."""


def _cell(stage: pd.Series, column: str) -> Any:
    if column not in stage.index:
        raise RunsFileError(f"the runs file has no {column!r} column")
    return stage[column]


def _stage_name(stage: pd.Series) -> str:
    return f"run {stage.get('run_id')!s} {stage.get('stage')!s}"


def _where(stage: pd.Series, column: str) -> str:
    return f"{_stage_name(stage)}, column {column!r}"


def _real(stage: pd.Series, column: str, what: str = "a number") -> float:
    """The ``column`` cell as a finite number."""
    cell = _cell(stage, column)
    try:
        value = float(cell)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise RunsFileError(f"{_where(stage, column)}: {cell!r} is not {what}")
    return value


def _integer(stage: pd.Series, column: str, empty: int | None = None) -> int:
    """The ``column`` cell as a whole number (``empty`` for an empty cell, if given)."""
    if empty is not None and pd.isna(_cell(stage, column)):
        return empty
    value = _real(stage, column, "a whole number")
    if not value.is_integer():
        raise RunsFileError(f"{_where(stage, column)}: {stage[column]!r} is not a whole number")
    return int(value)


#: vLLM's ``--block-size`` when a server is started without it: the scenario's default.
VLLM_BLOCK_SIZE = EngineSpec().block_size

#: Columns every runs file needs (``prompt_reuse`` may be left out: every prompt unique).
REQUIRED = (
    "run_id",
    "stage",
    "gpu",
    "model",
    "tp",
    "dtype",
    "vllm_version",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "block_size",
    "arrival",
    "rate_rps",
    "duration_s",
    "num_requests",
    "prompt_tokens_mean",
    "system_prompt_tokens",
    "output_tokens",
    *(f"{m}_ms_{s}" for m in METRICS for s in STATS),
)


def output_tokens(stage: pd.Series) -> int:
    """``"247 (max_tokens, ignore_eos)"`` or ``247`` → 247."""
    cell = _cell(stage, "output_tokens")
    text = str(cell)
    if isinstance(cell, float) and cell.is_integer():
        text = str(int(cell))  # a numeric column reads as floats
    match = re.match(r"\s*(\d+)(?![\d.])", text)
    if match is None or int(match.group(1)) < 1:
        raise RunsFileError(
            f"{_where(stage, 'output_tokens')}: {cell!r} is not a token count; write the "
            "max_tokens every request decodes (ignore_eos), e.g. '247 (max_tokens, ignore_eos)'"
        )
    return int(match.group(1))


@dataclass(frozen=True)
class PromptReuse:
    """How a stage's prompts repeat: ``num_groups`` system prompts × ``num_questions`` each,
    sent cyclically; ``num_groups == 0``: every request a prompt of its own."""

    num_groups: int
    num_questions: int


def prompt_reuse(stage: pd.Series) -> PromptReuse:
    """The ``prompt_reuse`` cell: "10 system prompts x 10 questions = 100 prompts, ..." or
    "none" (a missing column or an empty cell reads as "none")."""
    cell = stage.get("prompt_reuse")
    if cell is None or pd.isna(cell) or str(cell).strip().lower() in ("", "none", "unique"):
        return PromptReuse(0, 0)
    match = REUSE.search(str(cell))
    if match is None or min(int(match.group(1)), int(match.group(2))) < 1:
        raise RunsFileError(
            f"{_where(stage, 'prompt_reuse')}: {cell!r} is not understood; write "
            "'G system prompts x Q questions' (each prompt sent once per cycle) or 'none' "
            "(every prompt unique)"
        )
    return PromptReuse(num_groups=int(match.group(1)), num_questions=int(match.group(2)))


def arrival_times(stage: pd.Series, rng: np.random.Generator, start_s: float) -> np.ndarray:
    """``num_requests`` send times from ``start_s``, by the ``arrival`` cell."""
    count = _integer(stage, "num_requests")
    duration = _real(stage, "duration_s")
    rate = _real(stage, "rate_rps")
    if count < 1 or duration <= 0 or rate <= 0:
        raise RunsFileError(
            f"{_stage_name(stage)}: num_requests, duration_s and rate_rps must be positive "
            f"(got {count}, {duration}, {rate})"
        )
    kind = str(_cell(stage, "arrival")).strip().lower()
    if kind.startswith("poisson"):
        gaps = rng.exponential(1.0 / rate, count)
        if "rescaled" in kind:
            gaps *= duration / gaps.sum()  # exactly `count` arrivals in the duration
    elif kind.startswith(("constant", "uniform")):
        gaps = np.full(count, 1.0 / rate)
    else:
        raise RunsFileError(
            f"{_where(stage, 'arrival')}: {kind!r} is not understood; write 'poisson' "
            "(optionally 'poisson, gaps rescaled ...') or 'constant'"
        )
    return start_s + np.cumsum(gaps) - gaps[0]


def stage_requests(
    stage: pd.Series, rng: np.random.Generator, start_s: float, first_request: int = 0
) -> list[dict]:
    """One stage's requests as servesim JSONL rows (prompt ids cycled in shuffled order);
    ``first_request`` numbers the run's requests before this stage (unique prompts' ids)."""
    arrivals = arrival_times(stage, rng, start_s)
    count = len(arrivals)
    system = _integer(stage, "system_prompt_tokens", empty=0)
    prompt = round(_real(stage, "prompt_tokens_mean"))
    if prompt < 1 or not 0 <= system <= prompt:
        raise RunsFileError(
            f"{_stage_name(stage)}: prompt_tokens_mean ({prompt}) must be positive and at "
            f"least system_prompt_tokens ({system})"
        )
    output = output_tokens(stage)
    reuse = prompt_reuse(stage)
    if reuse.num_groups:
        distinct = reuse.num_groups * reuse.num_questions
        cycles = -(-count // distinct)
        order = np.concatenate([rng.permutation(distinct) for _ in range(cycles)])[:count]
        groups = order // reuse.num_questions
    else:
        # Every prompt its own, one system prompt shared by all.
        order = first_request + np.arange(count)
        groups = np.zeros(count, dtype=int)
    block = _integer(stage, "block_size", empty=VLLM_BLOCK_SIZE)
    num_blocks = -(-prompt // block)
    if block < 1 or num_blocks > BLOCK_IDS:
        raise RunsFileError(
            f"{_where(stage, 'block_size')}: {block} gives {num_blocks} blocks a prompt; "
            f"at most {BLOCK_IDS} are numbered"
        )
    rows = []
    for arrival, prompt_id, group in zip(arrivals, order, groups, strict=True):
        # A block wholly inside the system prompt is the group's; any later block is the
        # prompt's own (ids are kept apart by their ranges).
        hash_ids = [
            int(group) * BLOCK_IDS + b
            if (b + 1) * block <= system
            else PROMPT_IDS + int(prompt_id) * BLOCK_IDS + b
            for b in range(num_blocks)
        ]
        rows.append(
            {
                "arrival_s": float(arrival),
                "prompt_tokens": prompt,
                "output_tokens": output,
                "hash_ids": hash_ids,
                "block_tokens": block,
            }
        )
    return rows


#: Trailing words of a GPU's name that describe the card the rest names (memory, capacity, form
#: factor): "MIG 1g.10gb", "Laptop" or "D" name another device and are never dropped.
GPU_DESCRIPTOR = re.compile(r"(hbm\w*|gddr\w*|\d+\s*gb|sxm\d?|pcie|gpu)", re.IGNORECASE)


def catalogue_gpu(name: str) -> str:
    """The catalogue GPU for a runs file's ``gpu`` cell (``"H100-80GB-HBM3 SXM"`` → H100 SXM,
    ``"NVIDIA H200 141GB HBM3e"`` → H200): the whole name, else the name less its trailing
    memory, capacity and form-factor words (GPU_DESCRIPTOR), and only a card of the capacity
    the name states; the catalogue's own name is returned."""
    words = name.split()
    candidates = [name]
    while len(words) > 1 and GPU_DESCRIPTOR.fullmatch(words[-1]):
        words = words[:-1]
        candidates.append(" ".join(words))
    # A capacity the name states must be the card's: "A100 SXM 40GB" is not the 80 GB A100.
    stated = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
    for candidate in candidates:
        try:
            gpu = get_gpu(candidate)
        except ValueError:
            continue
        if stated is None or abs(gpu.memory_bytes / 1e9 - int(stated.group(1))) <= 1:
            return gpu.name
        raise SystemExit(
            f"--runs: gpu {name!r} names the {gpu.name} but states {stated.group(1)} GB; the "
            f"catalogue's {gpu.name} has {gpu.memory_bytes / 1e9:.0f} GB (sim/catalog/hardware.py)"
        )
    raise SystemExit(f"--runs: gpu {name!r} is not in the catalogue (sim/catalog/hardware.py)")


def _flag(stage: pd.Series, column: str) -> bool:
    cell = stage[column]
    text = str(cell).strip().lower()
    if text in ("true", "1", "1.0", "yes"):
        return True
    if text in ("false", "0", "0.0", "no"):
        return False
    raise RunsFileError(f"{_where(stage, column)}: {cell!r} is not true or false")


#: Engine flags a runs file may add as columns (vLLM's defaults where it does not): the
#: scenario's engine field each sets, and how its cell is read.
COLUMN_TO_ENGINE_FIELD: dict[str, tuple[str, Callable[[pd.Series, str], Any]]] = {
    "pp": ("pipeline_parallel_size", _integer),
    "gpu_memory_utilization": ("gpu_memory_utilization", _real),
    "enable_prefix_caching": ("enable_prefix_caching", _flag),
    "enable_chunked_prefill": ("enable_chunked_prefill", _flag),
    "async_scheduling": ("async_scheduling", _flag),
}


def _weights_dtype(stage: pd.Series) -> str:
    """The scenario's ``dtype`` for the ``dtype`` cell, which holds vLLM's ``--dtype``: for a
    quantized checkpoint that is the activations' 16-bit type, and the weights are the
    checkpoint's (``auto``)."""
    cell = str(stage["dtype"])
    quantized = checkpoint_quantization(str(stage["model"])) is not None
    if quantized and dtype_spelling(cell) in ("bf16", "fp16", "auto"):
        return "auto"
    return cell


def scenario(
    run: pd.DataFrame, trace: Path, seed: int, profile: Path | None = None
) -> dict[str, Any]:
    """The servesim scenario of a run: its model, GPU and engine flags, the roofline's step
    times or, with ``profile``, a calibration profile's."""
    first = run.iloc[0]
    engine: dict[str, Any] = {
        "tensor_parallel_size": _integer(first, "tp"),
        "block_size": _integer(first, "block_size", empty=VLLM_BLOCK_SIZE),
        "vllm_version": str(first["vllm_version"]),
    }
    # An empty cell: the server ran with vLLM's default, which the scenario fills in.
    for column in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if not pd.isna(_cell(first, column)):
            engine[column] = _integer(first, column)
    for column, (field, read) in COLUMN_TO_ENGINE_FIELD.items():
        if column in first.index and not pd.isna(first[column]):
            engine[field] = read(first, column)
    data: dict[str, Any] = {
        "name": f"real-{first['run_id']}",
        "seed": seed,
        "model": str(first["model"]),
        "gpu": catalogue_gpu(str(first["gpu"])),
        "dtype": _weights_dtype(first),
        "engine": engine,
        "workload": {"trace": {"path": str(trace)}},
    }
    if "kv_cache_dtype" in first.index and not pd.isna(first["kv_cache_dtype"]):
        data["kv_cache_dtype"] = str(first["kv_cache_dtype"])
    if profile is not None:
        data["latency"] = {"profile": str(profile)}
    return data


def simulate_run(
    run: pd.DataFrame, seed: int, directory: Path, profile: Path | None = None
) -> dict[str, dict[str, float]]:
    """Simulate a run's stages back to back; per stage, the latency stats in ms."""
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    bounds = []
    start = 0.0
    for _, stage in run.iterrows():
        stage_rows = stage_requests(stage, rng, start, len(rows))
        bounds.append((str(stage["stage"]), len(rows), len(rows) + len(stage_rows)))
        rows += stage_rows
        start += float(stage["duration_s"])
    trace = directory / f"{run.iloc[0]['run_id']}-{seed}.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = build(parse_scenario(scenario(run, trace, seed, profile))).run().records
    records = records.sort_values("request_id").reset_index(drop=True)
    result = {}
    for stage, low, high in bounds:
        part = records.iloc[low:high]
        part = part[part["status"] == "ok"]
        stats: dict[str, float] = {}
        values = {
            "ttft": part["ttft_s"] * 1e3,
            "tpot": part["tpot_s"] * 1e3,
            "e2e": part["e2e_s"] * 1e3,
        }
        for metric, series in values.items():
            stats[f"{metric}_mean"] = float(series.mean())
            for q in (50, 90, 99):
                stats[f"{metric}_p{q}"] = float(np.percentile(series, q))
        result[stage] = stats
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="arrival/order draws per run")
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--runs", type=Path, default=RUNS_FILE, help="real runs, in the columns of the default"
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="a calibration profile in place of the roofline"
    )
    args = parser.parse_args()
    if args.profile is not None and not args.profile.is_file():
        raise SystemExit(f"--profile {args.profile}: no such file")
    try:
        real = pd.read_csv(args.runs)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--runs {args.runs}: {exc}") from None
    missing = sorted(set(REQUIRED) - set(real.columns))
    if missing:
        raise SystemExit(f"--runs {args.runs}: missing columns {', '.join(missing)}")
    errors: dict[tuple[str, str], list[float]] = {}
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for run_id, run in real.groupby("run_id", sort=False):
            try:
                sims = [
                    simulate_run(run, seed, Path(tmp), args.profile) for seed in range(args.seeds)
                ]
            except (RunsFileError, ScenarioError) as exc:
                raise SystemExit(f"--runs {args.runs}: {exc}") from None
            except ProfileError as exc:
                raise SystemExit(f"--profile {args.profile}: {exc}") from None
            for _, stage in run.iterrows():
                name = str(stage["stage"])
                row: dict[str, Any] = {"run": run_id, "stage": name, "rate": stage["rate_rps"]}
                for metric in METRICS:
                    for stat in STATS:
                        key = f"{metric}_{stat}"
                        values = [s[name][key] for s in sims]
                        err = float(np.mean(values)) / float(stage[f"{metric}_ms_{stat}"]) - 1
                        row[key] = err
                        row[f"{key}_sim_ms"] = float(np.mean(values))
                        row[f"{key}_real_ms"] = float(stage[f"{metric}_ms_{stat}"])
                        row[f"{key}_seed_spread"] = float(np.ptp(values)) / np.mean(values)
                        errors.setdefault((metric, stat), []).append(err)
                table.append(row)
    gpus = ", ".join(sorted({catalogue_gpu(str(name)) for name in real["gpu"]}))
    print(f"sim/real - 1 on {len(table)} real stages on {gpus} ({args.seeds} seeds each, mean)")
    header = f"{'stage':44s} {'rps':>4s}  " + "  ".join(
        f"{m}_{s:4s}" for m in METRICS for s in ("mean", "p90")
    )
    print(header + "  seed spread of TTFT mean")
    for row in table:
        cells = "  ".join(f"{row[f'{m}_{s}']:+9.1%}" for m in METRICS for s in ("mean", "p90"))
        name = row["run"][-22:] + " " + row["stage"]
        print(f"{name:44s} {row['rate']:4.0f}  {cells}  {row['ttft_mean_seed_spread']:6.1%}")
    print("\nmedian |error| over stages (target):")
    for (metric, stat), values in errors.items():
        median = float(np.median(np.abs(values)))
        target = TARGETS.get((metric, stat))
        verdict = "" if target is None else (" ok" if median <= target else f" > {target:.0%}")
        print(f"  {metric} {stat:4s} {median:6.1%}{verdict}")
    print("\nsim vs real ms (mean):")
    for row in table:
        cells = "  ".join(
            f"{m} {row[f'{m}_mean_sim_ms']:7.1f}/{row[f'{m}_mean_real_ms']:7.1f}" for m in METRICS
        )
        print(f"  {row['run'][-22:]} {row['stage']}: {cells}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
