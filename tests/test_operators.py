"""The torch operator profiler: tables in the public sources' format, fitted by the same code.

On this CPU machine the tiny model is timed with perf_counter; the CUDA-events path runs in the
``gpu`` test where a GPU is present.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibration.operator_tables import _LAYER_MODULES, profiled_observations, profiled_profile
from calibration.operators import (
    DECODE_FILE,
    LAYERS_FILE,
    ProfilerGrid,
    check_tables_match,
    profile_operators,
    read_tables,
)
from sim.catalog.models import get_model
from sim.engine.latency import CalibratedModel
from sim.engine.profile import load_profile
from sim.run import build
from sim.scenario import parse_scenario

torch = pytest.importorskip("torch")

#: What the table reader sums: every per-layer module, plus the once-per-forward ones.
MODULES = {*_LAYER_MODULES, "embedding", "final_layernorm", "lm_head"}
GRID = ProfilerGrid((16, 64, 128), (1, 4), (64, 256), repetitions=2, warmup=1)
TINY = get_model("servesim-tiny-llama")


@pytest.fixture(scope="module")
def tiny_tables():  # type: ignore[no-untyped-def]
    return profile_operators(TINY, dtype="bf16", device="cpu", grid=GRID, threads=1)


def test_tables_have_every_module_at_every_size(tiny_tables) -> None:  # type: ignore[no-untyped-def]
    layers = tiny_tables.layers
    assert list(layers.columns) == ["layer_name", "input", "kv_cache", "latency(ns)"]
    assert set(layers["layer_name"]) == MODULES
    # Every prefill length and every decode batch size is a row for every module.
    assert sorted(layers["input"].unique()) == [1, 4, 16, 64, 128]
    assert len(layers) == len(MODULES) * 5
    assert (layers["kv_cache"] == 0).all()
    assert (layers["latency(ns)"] > 0).all()
    decode = tiny_tables.decode_attention
    assert list(decode.columns) == ["batch_size", "kv_len", "latency_us"]
    assert sorted(zip(decode["batch_size"], decode["kv_len"], strict=True)) == [
        (1, 64),
        (1, 256),
        (4, 64),
        (4, 256),
    ]
    assert (decode["latency_us"] > 0).all()
    meta = tiny_tables.meta
    assert meta["model"] == TINY.name and meta["device"] == "cpu" and meta["threads"] == 1
    assert meta["shapes"]["num_layers"] == TINY.num_layers


def test_tensor_parallelism_shards_the_shapes() -> None:
    model = get_model("llama-3.1-8b")
    tiny_grid = ProfilerGrid((16,), (1,), (16,), repetitions=1, warmup=0)
    tables = profile_operators(
        model, tensor_parallel_size=4, dtype="bf16", device="cpu", grid=tiny_grid
    )
    shapes = tables.meta["shapes"]
    assert shapes["heads_per_gpu"] == 8 and shapes["kv_heads_per_gpu"] == 2
    assert shapes["intermediate_per_gpu"] == 14336 // 4
    assert shapes["vocab_per_gpu"] == 128256 // 4


def test_max_decode_tokens_bounds_the_kv_tensors() -> None:
    grid = ProfilerGrid((16,), (1, 8), (64, 512), repetitions=1, warmup=0, max_decode_tokens=512)
    tables = profile_operators(TINY, dtype="bf16", device="cpu", grid=grid)
    points = set(
        zip(tables.decode_attention["batch_size"], tables.decode_attention["kv_len"], strict=True)
    )
    assert points == {(1, 64), (1, 512), (8, 64)}  # 8 × 512 tokens left out


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="dtype"):
        profile_operators(TINY, dtype="int4", device="cpu", grid=GRID)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        profile_operators(get_model("llama-3.1-8b"), tensor_parallel_size=3, device="cpu")
    with pytest.raises(ValueError, match="device"):
        profile_operators(TINY, device="tpu", grid=GRID)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            profile_operators(TINY, device="cuda", grid=GRID)
    with pytest.raises(ValueError, match="prefill_tokens"):
        ProfilerGrid((), (1,), (1,))


def test_tables_round_trip_and_fit(tiny_tables, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    directory = tiny_tables.write(tmp_path / "tables")
    assert (directory / LAYERS_FILE).is_file() and (directory / DECODE_FILE).is_file()
    again = read_tables(directory)
    assert again.meta == tiny_tables.meta
    assert again.layers.shape == tiny_tables.layers.shape
    observations = profiled_observations(again)
    # Prefills of 16, 64 and 128 tokens; decodes of 1 and 4 sequences at two contexts.
    kinds = sorted((o.batch.num_prefill_tokens, o.batch.num_decode_seqs) for o in observations)
    assert kinds == [(0, 1), (0, 1), (0, 4), (0, 4), (16, 0), (64, 0), (128, 0)]
    # A prefill's time is the layer sum: embedding + layers × modules + final norm + lm_head(1).
    table = again.layers.pivot_table(index="input", columns="layer_name", values="latency(ns)")
    row = table.loc[64]
    layer = row[sorted(MODULES - {"embedding", "final_layernorm", "lm_head"})].sum()
    expected = (row["embedding"] + TINY.num_layers * layer + row["final_layernorm"]) + table.loc[
        1, "lm_head"
    ]
    prefill_64 = next(o for o in observations if o.batch.num_prefill_tokens == 64)
    assert prefill_64.seconds == pytest.approx(expected / 1e9)

    profile = profiled_profile(again, hardware="cpu-core", source=str(directory))
    assert profile.model == TINY.name and profile.engine.name == "torch-operators"
    assert profile.data_summary["num_points"] == len(observations)
    assert profile.fit.num_points == len(observations)
    assert any("all-reduce" in note for note in profile.fit.notes)
    model = CalibratedModel(profile.coefficients)
    assert all(model.step_time(o.batch) > 0 for o in observations)


def test_read_tables_rejects_other_directories(tmp_path: Path, tiny_tables) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"missing layers\.csv"):
        read_tables(tmp_path)
    directory = tiny_tables.write(tmp_path / "t")
    (directory / "meta.json").write_text('{"model": ')
    with pytest.raises(ValueError, match="not valid JSON"):
        read_tables(directory)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        check_tables_match(tiny_tables, TINY, 2)
    with pytest.raises(ValueError, match="model"):
        check_tables_match(tiny_tables, get_model("llama-3.1-8b"), 1)


def _scenario_file(tmp_path: Path, tp: int = 1) -> Path:
    data = yaml.safe_load(Path("scenarios/live_cpu_tiny.yaml").read_text())
    data["engine"]["tensor_parallel_size"] = tp
    path = tmp_path / f"tiny-tp{tp}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_calibrate_with_torch_writes_tables_and_a_loadable_profile(tmp_path: Path) -> None:
    scenario = _scenario_file(tmp_path)
    out = tmp_path / "p.json"
    args = [sys.executable, "-m", "servesim.cli", "calibrate", str(scenario), "--out", str(out)]
    result = subprocess.run(
        [*args, "--operators", "torch", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "roofline" in result.stdout and "decode 32 @ 1024 ctx" in result.stdout
    tables_dir = tmp_path / "p.operators"
    assert (tables_dir / LAYERS_FILE).is_file()
    assert load_profile(out).engine.name == "torch-operators"
    # The scenario simulates with the profile (which checks model, GPU, TP and dtype match).
    data = yaml.safe_load(scenario.read_text())
    data["latency"] = {"profile": str(out)}
    data["workload"]["num_requests"] = 20
    summary = build(parse_scenario(data)).run().summary
    assert summary["requests"]["ok"] == 20

    # The tables written on one machine fit again anywhere; another TP is refused.
    again = subprocess.run(
        [*args[:-1], str(tmp_path / "q.json"), "--operators", str(tables_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    other = _scenario_file(tmp_path, tp=2)
    refused = subprocess.run(
        [*args[:4], str(other), "--out", str(tmp_path / "r"), "--operators", str(tables_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2
    assert "tensor_parallel_size" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_profile_of_llama_8b() -> None:
    grid = ProfilerGrid((128, 512, 2048), (1, 32, 128), (1024, 4096), repetitions=5)
    tables = profile_operators(get_model("llama-3.1-8b"), device="cuda", grid=grid)
    assert tables.meta["device"].startswith("cuda")
    profile = profiled_profile(tables, hardware="H100 SXM")
    # A 2,048-token prefill of an 8B model is tens of ms on any datacentre GPU, not seconds.
    prefill = next(o for o in profiled_observations(tables) if o.batch.num_prefill_tokens == 2048)
    assert 0.005 < prefill.seconds < 1.0
    assert profile.fit.relative_error_p90 < 0.5
