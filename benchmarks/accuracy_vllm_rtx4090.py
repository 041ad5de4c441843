"""Accuracy: the uncalibrated roofline simulator against a real vLLM run, side by side.

The real run (shared/data/vllm_real_runs/llmservingsim_RTX4090_llama31_8b, see SOURCES.md) is
vLLM 0.19.0 serving Llama-3.1-8B bf16 on one RTX 4090 with max_num_batched_tokens 2048, driven by
300 ShareGPT requests at 10 req/s whose prompts are exact token ids. We replay the same requests
(same arrivals, lengths and token-id prefixes) through the simulator with the same engine knobs
and print server-side latency percentiles and throughput, measured and simulated, with their
ratio. Run: ``.venv/bin/python benchmarks/accuracy_vllm_rtx4090.py [SHARED_DATA_DIR]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.run import run
from sim.scenario import parse_scenario

RUN_DIR = "vllm_real_runs/llmservingsim_RTX4090_llama31_8b"
WORKLOAD = "vllm_real_runs/llmservingsim_workload_sharegpt-llama-3.1-8b-300-sps10.jsonl"


def measured(shared: Path) -> pd.DataFrame:
    """Per-request server-side timings of the real run (seconds from vLLM's queue entry)."""
    rows = [json.loads(line) for line in (shared / RUN_DIR / "requests.jsonl").open()]
    frame = pd.DataFrame(rows)
    start = frame["queued_ts"].min()
    return pd.DataFrame(
        {
            "arrival_s": frame["queued_ts"] - start,
            "ttft_s": frame["first_token_ts"] - frame["queued_ts"],
            "e2e_s": frame["last_token_ts"] - frame["queued_ts"],
            "queue_s": frame["scheduled_ts"] - frame["queued_ts"],
            "finish_s": frame["last_token_ts"] - start,
            "output_tokens": frame["output_toks"],
        }
    )


def simulated(shared: Path) -> tuple[pd.DataFrame, dict[str, object]]:
    """The same workload and engine knobs through the roofline simulator."""
    meta = json.loads((shared / RUN_DIR / "meta.json").read_text())
    engine = meta["engine_kwargs"]
    cache = meta["kv_cache"]
    scenario = parse_scenario(
        {
            "name": "rtx4090-llama31-8b-sharegpt-10rps",
            "model": "llama-3.1-8b",
            "gpu": "rtx-4090",
            "engine": {
                "max_num_seqs": engine["max_num_seqs"],
                "max_num_batched_tokens": engine["max_num_batched_tokens"],
                "max_model_len": engine["max_model_len"],
                "block_size": cache["block_size"],
                "gpu_memory_utilization": cache["gpu_memory_utilization"],
                "enable_prefix_caching": cache["enable_prefix_caching"],
            },
            "workload": {"trace": {"path": str(shared / WORKLOAD)}},
        }
    )
    result = run(scenario)
    return result.records, result.summary


def main() -> None:
    shared = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[2] / "shared/data"
    real = measured(shared)
    sim, summary = simulated(shared)
    rows = []
    for metric in ("ttft_s", "queue_s", "e2e_s"):
        for stat in ("mean", "p50", "p90", "p99"):
            m = _stat(real[metric].to_numpy(), stat)
            s = _stat(sim[metric].to_numpy(), stat)
            rows.append((f"{metric} {stat}", m, s, s / m if m else float("nan")))
    real_tput = real["output_tokens"].sum() / real["finish_s"].max()
    sim_tput = summary["throughput"]["output_tokens_per_s"]  # type: ignore[index]
    rows.append(("output tokens/s", real_tput, sim_tput, sim_tput / real_tput))
    real_tpot = ((real["e2e_s"] - real["ttft_s"]) / (real["output_tokens"] - 1)).median()
    sim_tpot = sim["tpot_s"].median()
    rows.append(("tpot_s p50", real_tpot, sim_tpot, sim_tpot / real_tpot))
    print("vLLM 0.19.0, Llama-3.1-8B bf16, RTX 4090, 300 ShareGPT requests at 10 req/s")
    print(f"{'metric':<18}{'measured':>12}{'simulated':>12}{'sim/real':>10}")
    for name, m, s, ratio in rows:
        print(f"{name:<18}{m:>12.3f}{s:>12.3f}{ratio:>10.2f}")
    print(
        f"simulated preemptions: {summary['preemptions']}, prefix hit rate: "
        f"{summary['prefix_cache']['hit_rate']:.3f}"
    )  # type: ignore[index]


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[np.isfinite(values)]
    if stat == "mean":
        return float(values.mean())
    return float(np.percentile(values, float(stat[1:])))


if __name__ == "__main__":
    main()
