"""Tensor-parallel decode: the out-of-the-box roofline against published vLLM runs at TP 1–8.

The runs are Lambda's vLLM benchmark (github.com/LambdaLabsML/vllm-benchmark, files and commits
in ``benchmarks/data/lambda_vllm_tp_decode.csv``): vLLM 0.6 (September 2024) serving
Llama-3-8B, Llama-3-70B and Mistral-7B-v0.3 in bf16 on 1, 2, 4 and 8 H100 SXM or A100 80GB SXM
GPUs, ``max_model_len`` 2048, with ``benchmark_serving.py`` sending 10 ShareGPT prompts at
once. The file keeps each run's measured median and mean TPOT and its prompt and output
lengths; nothing else of the runs is used, and nothing in the model is fitted to them.

Each run is simulated with the catalogue model and GPU and vLLM 0.6's defaults for that
length (no chunked prefill, synchronous scheduling): ten requests at t = 0 with the run's
lengths (requests with fewer than two output tokens, which have no TPOT, are left out, as
the client leaves them out). The server streamed about ten tokens per chunk (multi-step
scheduling), so TTFT is not comparable and only the median TPOT is scored. Mistral-7B on
8 H100s stalled for 0.1–0.2 s between its first chunks (its median TPOT is above the 4-GPU
run's): it is printed but left out of the medians.

Two models side by side: the roofline as shipped, and the same with bytes alone for the
linear layers (no fixed time per GEMM kernel, one streaming efficiency of 0.8 for every GPU,
as before the kernel profiles were fitted; the element-wise kernels as shipped). Prints
sim/real − 1 per run and the median |error| per TP degree.

Run: ``.venv/bin/python benchmarks/tp_scaling.py``
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.run import build
from sim.scenario import parse_scenario

RUNS = Path(__file__).resolve().parent / "data/lambda_vllm_tp_decode.csv"
MODELS = {
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama-3.1-8b",  # Llama-3-8B's shape
    "meta-llama/Meta-Llama-3-70B-Instruct": "llama-3.1-70b",  # Llama-3-70B's shape
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
}
GPUS = {"H100-80GB-SXM": "h100-sxm", "A100-80GB-SXM": "a100-80gb-sxm"}
#: Runs printed but kept out of the medians, and why.
OUTLIERS = {("mistralai/Mistral-7B-Instruct-v0.3", "H100-80GB-SXM", 8): "stalled"}
#: The linear layers as bytes alone: no GEMM fixed time, one efficiency for every GPU.
BYTES_ONLY = {"gemm_latency_s": 0.0, "bandwidth_efficiency": 0.8}


def requests(run: pd.Series) -> list[tuple[int, int]]:
    """The run's (prompt, output) lengths of requests that returned tokens."""
    prompts = [int(x) for x in str(run["input_lens"]).split()]
    outputs = [int(x) for x in str(run["output_lens"]).split()]
    return [(p, o) for p, o in zip(prompts, outputs, strict=True) if o > 1]


def median_tpot_ms(run: pd.Series, trace: Path, latency: dict[str, Any] | None) -> float:
    """The simulated median TPOT of the run's requests, all sent at t = 0."""
    rows = [{"arrival_s": 0.0, "prompt_tokens": p, "output_tokens": o} for p, o in requests(run)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    scenario: dict[str, Any] = {
        "name": "lambda-tp",
        "seed": 0,
        "model": MODELS[str(run["model"])],
        "gpu": GPUS[str(run["gpu"])],
        "dtype": "bf16",
        "engine": {
            "tensor_parallel_size": int(run["tp"]),
            "max_model_len": 2048,
            "enable_chunked_prefill": False,
            "async_scheduling": False,
        },
        "workload": {"trace": {"path": str(trace)}},
    }
    if latency is not None:
        scenario["latency"] = {"type": "roofline", **latency}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = build(parse_scenario(scenario)).run().records
    ok = records[records["status"] == "ok"]
    return float(np.median(ok["tpot_s"])) * 1e3


def main() -> None:
    runs = pd.read_csv(RUNS)
    errors: dict[str, dict[int, list[float]]] = {"shipped": {}, "bytes only": {}}
    print("median TPOT, sim/real - 1 (sim ms / real ms)")
    print(f"{'model':30s} {'gpu':14s} {'tp':>2s}  {'shipped':>24s}  {'bytes only':>24s}")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "run.jsonl"
        for _, run in runs.iterrows():
            real = float(run["median_tpot_ms"])
            cells = []
            key = (str(run["model"]), str(run["gpu"]), int(run["tp"]))
            for name, latency in (("shipped", None), ("bytes only", BYTES_ONLY)):
                sim = median_tpot_ms(run, trace, latency)
                error = sim / real - 1
                if key not in OUTLIERS:
                    errors[name].setdefault(int(run["tp"]), []).append(error)
                cells.append(f"{error:+7.1%} ({sim:6.2f}/{real:6.2f})")
            note = f"  [{OUTLIERS[key]}: not in the medians]" if key in OUTLIERS else ""
            model = str(run["model"]).split("/")[1]
            head = f"{model:30s} {run['gpu']!s:14s} {int(run['tp']):2d}  "
            print(head + "  ".join(cells) + note)
    print("\nmedian |error| per TP degree:")
    for name, by_tp in errors.items():
        cells = "  ".join(
            f"TP{tp} {np.median(np.abs(values)):5.1%} (n={len(values)})"
            for tp, values in sorted(by_tp.items())
        )
        print(f"  {name:10s}  {cells}")


if __name__ == "__main__":
    main()
