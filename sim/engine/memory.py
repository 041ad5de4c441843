"""How a replica's GPU memory is split, as vLLM sizes it at start-up: weights, peak activations
and a fixed reserve per GPU, the rest KV blocks; and why a model does not fit.

Separate from the step-time models (:mod:`sim.engine.latency`): sizing a replica decides how
many requests it can hold, not how long a step takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from sim.catalog.architecture import ModelArch
from sim.catalog.hardware import GPU, reported_memory_bytes


class _Room(NamedTuple):
    """Per GPU: what is usable, what the weights and activations take, what is left for KV."""

    usable: float
    weight_bytes: float
    activation: float
    kv_per_token: float
    kv_bytes: float


def _memory_room(
    model: ModelArch,
    gpu: GPU,
    dtype: str,
    kv_dtype: str,
    tp: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    pp: int = 1,
) -> _Room:
    """The memory split of :func:`plan_memory` (see its docstring), before rounding to blocks."""
    usable = reported_memory_bytes(gpu) * gpu_memory_utilization
    weight_bytes = model.weight_bytes(dtype) / tp / pp
    tokens = max_num_batched_tokens
    activation = tokens * (4 * model.hidden_size + 3 * model.active_intermediate_size / tp) * 2.0
    kv_per_token = model.kv_bytes_per_token(kv_dtype) / model.kv_shards(tp) / pp
    kv_bytes = usable - weight_bytes - activation - FIXED_RESERVE_BYTES
    return _Room(usable, weight_bytes, activation, kv_per_token, kv_bytes)


def _fits(
    model: ModelArch,
    gpu: GPU,
    dtype: str,
    kv_dtype: str,
    tp: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    block_size: int,
    pp: int = 1,
) -> bool:
    room = _memory_room(
        model, gpu, dtype, kv_dtype, tp, gpu_memory_utilization, max_num_batched_tokens, pp
    )
    return room.kv_bytes >= room.kv_per_token * block_size


def _does_not_fit(
    model: ModelArch,
    gpu: GPU,
    dtype: str,
    kv_dtype: str,
    tp: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    block_size: int,
    pp: int = 1,
) -> str:
    """Why the weights leave no room for a KV cache, with the numbers and what would fit."""
    args = (gpu_memory_utilization, max_num_batched_tokens, block_size)
    weights_gb = model.weight_bytes(dtype) / 1e9
    usable_gb = reported_memory_bytes(gpu) * gpu_memory_utilization / 1e9
    fixes = []
    for larger in (2, 4, 8, 16, 32, 64):
        divides = model.num_attention_heads % larger == 0
        if larger > tp and divides and _fits(model, gpu, dtype, kv_dtype, larger, *args, pp):
            fixes.append(f"tensor_parallel_size >= {larger}")
            break
    if dtype in ("bf16", "fp16") and _fits(model, gpu, "fp8", kv_dtype, tp, *args, pp):
        fixes.append("fp8 weights (dtype: fp8)")
    fixes.append("a GPU with more memory")
    return (
        f"model {model.name} in {dtype} does not fit: it needs {weights_gb:.0f} GB of weights; "
        f"{tp * pp}x {gpu.name} "
        f"{'has' if tp * pp == 1 else 'have'} {gpu.memory_bytes * tp * pp / 1e9:.3g} GB "
        f"({usable_gb:.1f} GB usable per GPU at gpu_memory_utilization="
        f"{gpu_memory_utilization}), which leaves no room for a KV cache after activations and "
        f"vLLM's reserve; try {' or '.join(fixes)}"
    )


def kv_dtype_for(dtype: str, kv_cache_dtype: str = "auto") -> str:
    """The KV cache's element type; ``auto`` is 16-bit, even for 8- and 4-bit weights (as vLLM)."""
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return "fp16" if dtype == "fp16" else "bf16"


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """How a replica's GPU memory is split, and the KV capacity that results."""

    gpu_memory_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    kv_bytes: float
    kv_bytes_per_token: float
    num_blocks: int
    block_size: int

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds across all requests."""
        return self.num_blocks * self.block_size


#: vLLM's non-torch memory (CUDA context, NCCL buffers) and CUDA-graph pools, per GPU, which
#: vLLM measures at start-up. 1.0 GB reproduces the KV capacity of a real vLLM 0.19 run of
#: Llama-3.1-8B on an RTX 4090 (41,408 tokens; shared/data/vllm_real_runs, tests/test_latency.py).
FIXED_RESERVE_BYTES = 1.0e9


def plan_memory(
    model: ModelArch,
    gpu: GPU,
    *,
    dtype: str,
    kv_dtype: str | None,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    block_size: int,
    pipeline_parallel_size: int = 1,
) -> MemoryPlan:
    """KV blocks per replica, as vLLM sizes them at start-up.

    With pipeline parallelism each GPU holds ``1/pp`` of the layers: of the weights and of
    every token's KV (the same tokens are cached on every stage).

    Per GPU: ``reported memory × gpu_memory_utilization − weights/TP − peak activations − fixed
    reserve`` is left for KV; divided by the KV bytes per token per GPU and rounded down to whole
    blocks. Peak activations are those of a forward pass over ``max_num_batched_tokens`` tokens
    (the MLP's gate/up output dominates). Raises ValueError when the weights do not fit.
    """
    tp = tensor_parallel_size
    pp = pipeline_parallel_size
    kv_dtype = kv_dtype or dtype
    room = _memory_room(
        model, gpu, dtype, kv_dtype, tp, gpu_memory_utilization, max_num_batched_tokens, pp
    )
    kv_bytes, kv_per_token = room.kv_bytes, room.kv_per_token
    if kv_bytes < kv_per_token * block_size:
        raise ValueError(
            _does_not_fit(
                model,
                gpu,
                dtype,
                kv_dtype,
                tp,
                gpu_memory_utilization,
                max_num_batched_tokens,
                block_size,
                pp,
            )
        )
    num_blocks = int(kv_bytes // (kv_per_token * block_size))
    return MemoryPlan(
        gpu_memory_bytes=reported_memory_bytes(gpu),
        usable_bytes=room.usable,
        weight_bytes=room.weight_bytes,
        activation_bytes=room.activation,
        kv_bytes=kv_bytes,
        kv_bytes_per_token=kv_per_token,
        num_blocks=num_blocks,
        block_size=block_size,
    )
