"""benchmarks/fidelity_gpu.py rebuilds each real stage's workload from the runs file's columns
(how prompts repeat, how requests arrive, how many tokens they decode), scores it, and stops
with a message naming the column when a cell is one it cannot read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.fidelity_gpu import (
    RUNS_FILE,
    PromptReuse,
    RunsFileError,
    catalogue_gpu,
    output_tokens,
    prompt_reuse,
    scenario,
    simulate_run,
    stage_requests,
)
from sim.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return pd.read_csv(RUNS_FILE)


def _short(stage: pd.Series, **cells: object) -> pd.Series:
    """The stage cut to 40 s (the rate kept), with ``cells`` overriding its columns."""
    stage = stage.copy()
    stage["duration_s"] = 40.0
    stage["num_requests"] = int(40 * float(stage["rate_rps"]))
    for column, value in cells.items():
        stage[column] = value
    return stage


def test_the_shipped_cells_read_as_inference_perf_made_them(runs: pd.DataFrame) -> None:
    stage = runs.iloc[0]
    assert prompt_reuse(stage) == PromptReuse(num_groups=10, num_questions=10)
    assert output_tokens(stage) == 247
    rows = stage_requests(stage, np.random.default_rng(0), start_s=0.0)
    assert len(rows) == int(stage["num_requests"])
    arrivals = [row["arrival_s"] for row in rows]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    assert arrivals[-1] <= float(stage["duration_s"])
    # Every cycle of 100 requests sends each of the 100 prompts once.
    prompts = [tuple(row["hash_ids"]) for row in rows]
    for start in range(0, 1000, 100):
        assert len(set(prompts[start : start + 100])) == 100
    assert len(set(prompts)) == 100
    # Prompts of one system prompt share its whole blocks and nothing after them.
    block = int(stage["block_size"])
    shared = int(stage["system_prompt_tokens"]) // block
    first_blocks = {p[:shared] for p in prompts}
    assert len(first_blocks) == 10
    assert len({p[shared] for p in prompts}) == 100


def test_no_reuse_gives_every_request_its_own_prompt_across_stages(runs: pd.DataFrame) -> None:
    stage = _short(runs.iloc[0], prompt_reuse="none", system_prompt_tokens=float("nan"))
    rng = np.random.default_rng(1)
    first = stage_requests(stage, rng, 0.0, first_request=0)
    second = stage_requests(stage, rng, 40.0, first_request=len(first))
    ids = [block for row in first + second for block in row["hash_ids"]]
    assert len(ids) == len(set(ids))
    assert prompt_reuse(stage.drop("prompt_reuse")) == PromptReuse(0, 0)


def test_constant_arrivals_are_evenly_spaced(runs: pd.DataFrame) -> None:
    stage = _short(runs.iloc[0], arrival="constant")
    gaps = np.diff([row["arrival_s"] for row in stage_requests(stage, np.random.default_rng(0), 0)])
    assert np.allclose(gaps, 1 / float(stage["rate_rps"]))


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("prompt_reuse", "every prompt twice"),
        ("arrival", "gamma, cv 3"),
        ("output_tokens", "sampled from ShareGPT"),
        ("system_prompt_tokens", 10_000),
        ("output_tokens", "247.5"),
        ("num_requests", float("nan")),
    ],
)
def test_a_cell_it_cannot_rebuild_names_its_column(
    runs: pd.DataFrame, column: str, value: object
) -> None:
    stage = _short(runs.iloc[0], **{column: value})
    with pytest.raises(RunsFileError, match=column):
        stage_requests(stage, np.random.default_rng(0), 0.0)


def test_a_shortened_run_simulates_both_stages(runs: pd.DataFrame, tmp_path: Path) -> None:
    run = runs[runs["run_id"] == runs.iloc[0]["run_id"]].apply(_short, axis=1)
    stats = simulate_run(run, seed=0, directory=tmp_path)
    assert set(stats) == set(run["stage"])
    for stage in stats.values():
        assert 0 < stage["tpot_mean"] < stage["ttft_mean"] < stage["e2e_mean"]
        assert stage["ttft_p50"] <= stage["ttft_p90"] <= stage["ttft_p99"]


def test_a_runs_file_it_cannot_score_stops_with_the_reason(
    runs: pd.DataFrame, tmp_path: Path
) -> None:
    bad = runs.iloc[:1].copy()
    bad["model"] = "acme/NoSuchModel-7B"
    path = tmp_path / "runs.csv"
    bad.to_csv(path, index=False)
    done = subprocess.run(
        [sys.executable, "benchmarks/fidelity_gpu.py", "--runs", str(path), "--seeds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "NoSuchModel" in done.stderr and str(path) in done.stderr
    runs.drop(columns=["arrival"]).to_csv(path, index=False)
    done = subprocess.run(
        [sys.executable, "benchmarks/fidelity_gpu.py", "--runs", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "missing columns arrival" in done.stderr


def test_a_profile_replaces_the_roofline(runs: pd.DataFrame, tmp_path: Path) -> None:
    run = runs[runs["run_id"] == runs.iloc[0]["run_id"]]
    profile = tmp_path / "p.json"
    assert "latency" not in scenario(run, tmp_path / "t.jsonl", 0)
    assert scenario(run, tmp_path / "t.jsonl", 0, profile)["latency"] == {"profile": str(profile)}

    def score(*options: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "benchmarks/fidelity_gpu.py", "--seeds", "1", *options]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)

    done = score("--profile", str(profile))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"--profile {profile}: no such file" in done.stderr
    # A profile of another model stops with the profile's check, naming both models.
    other = ROOT / "profiles/h100-sxm_llama-3.1-8b_tp1.json"
    done = score("--profile", str(other))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"--profile {other}" in done.stderr and "llama-2-7b" in done.stderr


def test_optional_engine_columns_reach_the_scenario(runs: pd.DataFrame, tmp_path: Path) -> None:
    run = runs.iloc[:1].copy()
    plain = scenario(run, tmp_path / "t.jsonl", 0)
    assert set(plain["engine"]) == {
        "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
        "block_size", "vllm_version",
    }  # fmt: skip
    assert "kv_cache_dtype" not in plain
    run["enable_prefix_caching"] = "false"
    run["gpu_memory_utilization"] = 0.8
    run["kv_cache_dtype"] = "fp8"
    data = scenario(run, tmp_path / "t.jsonl", 0)
    assert data["engine"]["enable_prefix_caching"] is False
    assert data["engine"]["gpu_memory_utilization"] == 0.8 and data["kv_cache_dtype"] == "fp8"
    run["enable_prefix_caching"] = "maybe"
    with pytest.raises(RunsFileError, match="enable_prefix_caching"):
        scenario(run, tmp_path / "t.jsonl", 0)


def test_the_dtype_cell_is_vllms_flag_for_a_quantized_checkpoint(
    runs: pd.DataFrame, tmp_path: Path
) -> None:
    # A runs file records vLLM's --dtype: for a quantized checkpoint that is the activations'
    # 16-bit type, and the weights stay the checkpoint's.
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2}\n')
    run = runs.iloc[:1].copy()
    run["model"] = "Qwen/Qwen3-8B-FP8"
    run["dtype"] = "bfloat16"
    data = scenario(run, trace, 0)
    assert data["dtype"] == "auto"
    assert parse_scenario(data).dtype == "fp8"
    run["model"] = "meta-llama/Llama-3.1-8B-Instruct"
    assert parse_scenario(scenario(run, trace, 0)).dtype == "bf16"


@pytest.mark.parametrize(
    ("cell", "gpu"),
    [
        ("H100-80GB-HBM3 SXM", "H100 SXM"),  # the shipped file's
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # nvidia-smi's
        ("NVIDIA H200 141GB HBM3e", "H200"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA L40S 48GB", "L40S"),
        ("NVIDIA A100 SXM 40GB", "A100 40GB SXM"),  # not the 80 GB card its prefix names
    ],
)
def test_a_gpu_cell_resolves_as_people_write_gpus(cell: str, gpu: str) -> None:
    assert catalogue_gpu(cell) == gpu


@pytest.mark.parametrize(
    ("cell", "reason"),
    [
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "not in the catalogue"),  # a slice, not the card
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "not in the catalogue"),  # another, 16 GB card
        ("NVIDIA B200 192GB", "states 192 GB; the catalogue's B200 has 180 GB"),
    ],
)
def test_a_gpu_cell_naming_another_device_stops_with_the_reason(cell: str, reason: str) -> None:
    with pytest.raises(SystemExit, match=reason):
        catalogue_gpu(cell)


def test_empty_engine_cells_are_vllms_defaults(runs: pd.DataFrame, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2}\n')
    run = runs.iloc[:1].copy()
    for column in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
        run[column] = float("nan")
    engine = parse_scenario(scenario(run, trace, 0)).engine
    # An H100: vLLM's large-GPU batch limits, the model's context, 16-token blocks.
    assert (engine.max_num_seqs, engine.max_num_batched_tokens) == (1024, 8192)
    assert engine.max_model_len is None and engine.block_size == 16
    assert len(stage_requests(_short(run.iloc[0]), np.random.default_rng(0), 0.0)) == 200
