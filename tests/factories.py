"""Test factories with keyword defaults."""

from __future__ import annotations

from typing import Any

from sim.catalog.architecture import ModelArch
from sim.engine.kv_cache import KVCacheManager
from sim.engine.request import Record, Request, SourceNamespace, block_keys, source_id
from sim.engine.scheduler import ContinuousBatchScheduler, SchedulerConfig
from sim.engine.sequence import Sequence


def make_request(
    request_id: int = 0,
    *,
    prompt_tokens: int = 32,
    output_tokens: int = 4,
    arrival_s: float = 0.0,
    priority: int = 0,
    shared_prefix_tokens: int = 0,
) -> Request:
    """A request whose prompt optionally starts with a prefix shared by every such request."""
    segments: list[tuple[int, int]] = []
    if shared_prefix_tokens:
        segments.append((source_id(SourceNamespace.SYSTEM_PROMPT, 0), shared_prefix_tokens))
    own = prompt_tokens - shared_prefix_tokens
    if own:
        segments.append((source_id(SourceNamespace.UNIQUE, request_id, 0), own))
    return Request(
        request_id=request_id,
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        segments=tuple(segments),
        output_source_id=source_id(SourceNamespace.UNIQUE, request_id, 1),
        priority=priority,
    )


def make_sequence(request: Request, block_size: int = 16) -> Sequence:
    """A scheduler sequence with its record and block keys."""
    record = Record(
        request.request_id, request.arrival_s, request.prompt_tokens, request.output_tokens
    )
    keys = block_keys(
        [*request.segments, (request.output_source_id, request.output_tokens)],
        block_size,
        request.total_tokens,
    )
    return Sequence(request, record, keys)


def make_scheduler(
    *,
    num_blocks: int = 1000,
    block_size: int = 16,
    enable_prefix_caching: bool = True,
    **config: Any,
) -> ContinuousBatchScheduler:
    """A continuous-batching scheduler over a fresh KV cache."""
    defaults: dict[str, Any] = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    defaults.update(config)
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
    return ContinuousBatchScheduler(SchedulerConfig(**defaults), kv)


def make_arch(**overrides: Any) -> ModelArch:
    """A small valid architecture, with keyword overrides."""
    values: dict[str, Any] = {
        "name": "tiny",
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "tie_word_embeddings": False,
        "max_position_embeddings": 512,
    }
    values.update(overrides)
    return ModelArch(**values)


def scenario_dict(**overrides: Any) -> dict[str, Any]:
    """A small valid scenario as a plain dict; top-level sections replaced by ``overrides``."""
    base: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "seed": 1,
        "engine": {"max_model_len": 8192},
        "workload": {
            "arrival": {"type": "poisson", "rate": 5},
            "prompt_tokens": {"type": "constant", "value": 128},
            "output_tokens": {"type": "constant", "value": 16},
            "num_requests": 50,
        },
    }
    base.update(overrides)
    return base
