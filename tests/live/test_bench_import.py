"""A real `vllm bench serve` result, from vLLM's own benchmark client, imported into records.

The ``vllm`` console script is missing from the CPU build (and ``python -m
vllm.entrypoints.cli.main`` stops at ``importlib.metadata.version("vllm")``), so the client runs
through the same functions ``vllm bench serve`` dispatches to: ``add_cli_args`` and ``main``
of ``vllm.benchmarks.serve``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from live.importers import import_records
from live.server import VLLMServer
from live.tiny_model import ensure_tiny_model
from sim.engine.request import RECORD_COLUMNS
from sim.report.summary import distribution
from sim.report.vllm_bench import vllm_bench_result
from sim.scenario import EngineSpec

pytestmark = pytest.mark.live

BENCH_CLIENT = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
NUM_PROMPTS = 20
OUTPUT_LEN = 16
#: Small knobs for a CPU server; the CPU attention backend needs a block size divisible by 32.
ENGINE = EngineSpec(max_num_seqs=32, max_num_batched_tokens=2048, block_size=32, max_model_len=2048)


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A vLLM server of this module's own; its process group is stopped even when a test fails."""
    log = tmp_path_factory.mktemp("bench-import") / "server.log"
    with VLLMServer(str(tiny_model), ENGINE, log_path=log) as started:
        yield started


def run_bench_client(args: list[str], log_path: Path, timeout_s: float = 600) -> None:
    """Run vLLM's benchmark client in its own process group; kill the group on timeout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", BENCH_CLIENT, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout_s)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
    assert returncode == 0, f"vllm bench serve exited with {returncode}:\n{tail}"


def test_a_real_bench_serve_result_imports_exactly(
    server: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    result_dir = tmp_path / "results"
    run_bench_client(
        [
            "--backend",
            "vllm",
            "--base-url",
            server.url,
            "--endpoint",
            "/v1/completions",
            "--model",
            server.model_name,
            "--tokenizer",
            str(tiny_model),
            "--dataset-name",
            "random",
            "--random-input-len",
            "64",
            "--random-output-len",
            str(OUTPUT_LEN),
            "--num-prompts",
            str(NUM_PROMPTS),
            "--request-rate",
            "5",
            "--ignore-eos",  # random weights may emit EOS at once; every request gets 16 tokens
            "--seed",
            "0",
            "--disable-tqdm",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(result_dir),
            "--result-filename",
            "bench.json",
        ],
        tmp_path / "bench.log",
    )
    path = result_dir / "bench.json"
    raw: dict[str, Any] = json.loads(path.read_text())

    run = import_records(path)

    assert run.format == "vllm_bench"
    frame = run.records
    assert list(frame.columns) == list(RECORD_COLUMNS)
    assert len(frame) == NUM_PROMPTS
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    np.testing.assert_allclose(frame["ttft_s"], raw["ttfts"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(frame["e2e_s"], raw["latencies"], rtol=1e-9, atol=1e-12)
    assert frame["output_tokens"].tolist() == raw["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert frame["prompt_tokens"].tolist() == raw["input_lens"]
    start_times = np.asarray(raw["start_times"])
    np.testing.assert_allclose(frame["arrival_s"], start_times - start_times.min(), atol=1e-9)
    # The same TPOT and ITL that vLLM's own summary reports.
    assert 1000 * frame["tpot_s"].mean() == pytest.approx(raw["mean_tpot_ms"], rel=1e-9)
    assert run.itl_s.size == sum(len(itls) for itls in raw["itls"])
    assert 1000 * run.itl_s.mean() == pytest.approx(raw["mean_itl_ms"], rel=1e-9)
    assert run.metadata["model"] == server.model_name
    assert run.metadata["num_prompts"] == NUM_PROMPTS
    assert run.metadata["request_rate"] == 5.0
    # servesim's --format vllm-bench, fed vLLM's own measurements, writes vLLM's own numbers.
    ours = vllm_bench_result(
        frame,
        itl=distribution(run.itl_s, percentiles=(50.0, 99.0)),
        goodput_requests_per_s=None,
        model_id=server.model_name,
        request_rate=5.0,
    )
    metric_keys = [k for k in raw if k.endswith("_ms") and not k.startswith("std_itl")]
    assert metric_keys and set(metric_keys) <= set(ours)
    for key in metric_keys:
        assert ours[key] == pytest.approx(raw[key], rel=1e-6), key
    for key in ("completed", "total_input_tokens", "total_output_tokens", "num_prompts"):
        assert ours[key] == raw[key], key
    assert ours["request_throughput"] == pytest.approx(raw["request_throughput"], rel=0.05)
    assert run.metadata["arrival_known"] is True
    assert frame["scheduled_s"].isna().all()
