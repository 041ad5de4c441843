"""The reference scenarios of the speed benchmark (``benchmarks/speed.py``, issue 7), as
scenario dicts; ``tests/test_fast_forward.py`` runs small versions of the same ones.

* R1: Llama-3.1-8B bf16 on one H100 SXM, Poisson arrivals at 10 req/s, lognormal prompts (mean
  ≈ 1,000 tokens) and outputs (mean ≈ 250), 36,000 requests (one simulated hour).
* R2: the same on 16 replicas at 160 req/s, 576,000 requests.
* R3: 8 replicas, multi-turn sessions behind a shared system prompt, prefix-affinity routing.
* R4: the Azure LLM inference conversation trace (2023) on 2 replicas (about 70 % load).
* R5: a fleet at scale (issue 17): 256 replicas behind the prefix-affinity router, 10 million
  requests shaped like the Azure conversation trace (its prompt and answer lengths, drawn from
  the file; Poisson arrivals at R4's load per replica, 2.8 req/s) behind 64 shared system
  prompts of 512 tokens (80 % of requests), so that where a request goes matters to the cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REFERENCE_NAMES = ("R1", "R2", "R3", "R4", "R5")

#: The public traces (../shared/data beside the repository, or $SERVESIM_SHARED_DATA).
SHARED_DATA = Path(
    os.environ.get("SERVESIM_SHARED_DATA", Path(__file__).parents[2] / "shared" / "data")
)

LENGTHS = {
    "prompt_tokens": {
        "type": "lognormal", "mu": 6.7828, "sigma": 0.5, "min_tokens": 1, "max_tokens": 8192,
    },
    "output_tokens": {
        "type": "lognormal", "mu": 5.3964, "sigma": 0.5, "min_tokens": 1, "max_tokens": 4096,
    },
}  # fmt: skip


def reference_scenario(name: str, scale: float = 1.0) -> dict[str, Any]:
    """Reference scenario ``name`` (R1–R5) with its request count (or duration) times
    ``scale``."""
    if name not in REFERENCE_NAMES:
        raise ValueError(f"reference scenario: one of {', '.join(REFERENCE_NAMES)}, got {name!r}")
    base: dict[str, Any] = {
        "name": name,
        "seed": 0,
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "engine": {"max_model_len": 16384},
        "output": {"sample_interval_s": 10.0},
    }
    match name:
        case "R1":
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 10},
                **LENGTHS,
                "num_requests": max(1, int(36_000 * scale)),
            }
        case "R2":
            base["fleet"] = {"replicas": 16}
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 160},
                **LENGTHS,
                "num_requests": max(1, int(576_000 * scale)),
            }
        case "R3":
            base["fleet"] = {"replicas": 8, "router": {"policy": "prefix_affinity"}}
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 8},
                **LENGTHS,
                "prefix": {
                    "type": "multi_turn",
                    "turns": {"type": "uniform", "low": 2, "high": 6},
                    "think_time_s": 10,
                    "system_prompt_tokens": 1000,
                },
                "duration_s": 3600 * scale,
            }
        case "R4":
            # The Azure conversation trace (~5.6 req/s of ~1k-token prompts and ~230-token
            # answers over an hour) on 2 replicas loads each to roughly 70 %.
            base["fleet"] = {"replicas": 2, "router": {"policy": "least_outstanding"}}
            base["workload"] = {
                "trace": {
                    "path": str(SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
                },
                "num_requests": max(1, int(19_366 * scale)),
            }
        case "R5":
            azure = str(SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
            base["fleet"] = {"replicas": 256, "router": {"policy": "prefix_affinity"}}
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 256 * 2.8},
                "prompt_tokens": {"type": "empirical", "path": azure, "column": "ContextTokens"},
                "output_tokens": {"type": "empirical", "path": azure, "column": "GeneratedTokens"},
                "prefix": {"type": "shared", "num_groups": 64, "prefix_tokens": 512, "share": 0.8},
                "num_requests": max(1, int(10_000_000 * scale)),
            }
    return base
