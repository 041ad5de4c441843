"""A scenario's engine knobs as ``vllm serve`` flags: the one mapping that both the exporter
(the command line a planner pastes) and the live launcher (the server a live run starts) use,
so that what is simulated is what is launched.

Pure: no processes, files or network. The flags carry the knobs' own names
(``max_num_seqs`` → ``--max-num-seqs``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.catalog.model_names import checkpoint_quantization
from sim.scenario import EngineSpec, Scenario

#: The CPU attention backend only supports block sizes that are multiples of this (vLLM 0.32).
CPU_BLOCK_SIZE_MULTIPLE = 32


def vllm_serve_args(
    model: str,
    engine: EngineSpec,
    *,
    dtype: str = "bfloat16",
    served_model_name: str | None = None,
    enforce_eager: bool | None = None,
    cpu: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """vLLM command-line flags for ``model`` served with the scenario's ``engine`` knobs.

    Every knob is passed explicitly, because vLLM's defaults differ by platform (the CPU
    backend's default block size is 128, the scenario's 16); pipeline parallelism only when it
    is on (vLLM's default is 1 everywhere). With ``cpu`` the ``--gpu-memory-utilization`` flag
    is left out: the CPU backend takes its KV-cache size from ``VLLM_CPU_KVCACHE_SPACE`` and
    would otherwise read the fraction as a share of host RAM; its attention kernels also need a
    block size that is a multiple of 32, so a smaller one is a ``ValueError`` here rather than a
    failure 30 s into startup. ``enforce_eager`` None leaves vLLM's default. The list holds
    neither the executable nor ``--host``/``--port``; append it to ``vllm serve`` or
    ``python -m vllm.entrypoints.openai.api_server``.
    """
    if engine.batching != "continuous":
        raise ValueError(
            f"engine.batching: a vLLM server only does continuous batching, got "
            f"{engine.batching!r}; set engine.batching to 'continuous' for a live run"
        )
    args = [
        "--model",
        model,
        "--dtype",
        dtype,
        "--max-num-seqs",
        str(engine.max_num_seqs),
        "--max-num-batched-tokens",
        str(engine.max_num_batched_tokens),
        "--block-size",
        str(engine.block_size),
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
        "--enable-chunked-prefill"
        if engine.enable_chunked_prefill
        else "--no-enable-chunked-prefill",
        "--tensor-parallel-size",
        str(engine.tensor_parallel_size),
        "--scheduling-policy",
        engine.scheduling_policy,
        # Usage then reports cached prompt tokens per request, as the simulator records them.
        "--enable-prompt-tokens-details",
    ]
    if engine.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if cpu and engine.block_size % CPU_BLOCK_SIZE_MULTIPLE:
        raise ValueError(
            f"engine.block_size: vLLM's CPU backend needs a multiple of "
            f"{CPU_BLOCK_SIZE_MULTIPLE}, got {engine.block_size}; set engine.block_size to "
            f"{max(CPU_BLOCK_SIZE_MULTIPLE, engine.block_size)} (in the simulation too, so both "
            "cache the same blocks)"
        )
    if not cpu:
        args += ["--gpu-memory-utilization", repr(engine.gpu_memory_utilization)]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if served_model_name is not None:
        args += ["--served-model-name", served_model_name]
    if enforce_eager is not None:
        args.append("--enforce-eager" if enforce_eager else "--no-enforce-eager")
    args += list(extra_args)
    return args


#: vLLM's ``--quantization`` for checkpoints quantized ahead of time, by weight dtype: int4 as
#: AWQ (the Marlin kernel vLLM picks for AWQ checkpoints on GPUs), int8 as llm-compressor's
#: compressed-tensors (W8A8 or W8A16). The checkpoint must be quantized that way: vLLM refuses
#: one that is not, rather than serving 16-bit weights the plan did not simulate.
PREQUANTIZED = {"int4": "awq_marlin", "int8": "compressed-tensors"}


def dtype_args(
    dtype: str,
    kv_cache_dtype: str = "auto",
    quantization: str = "auto",
    *,
    quantized_checkpoint: bool = False,
) -> tuple[str, list[str]]:
    """vLLM's ``--dtype`` and extra flags for a scenario's ``dtype``, ``kv_cache_dtype`` and
    ``quantization`` method.

    fp8 weights are vLLM's dynamic fp8 quantization of a 16-bit checkpoint; int8 and int4 need a
    quantized checkpoint (PREQUANTIZED), or bitsandbytes' on-the-fly quantization. A model
    named as a quantized checkpoint (``quantized_checkpoint``: ``Qwen/Qwen3-8B-FP8``, see
    sim.catalog.model_names.checkpoint_quantization) gets no ``--quantization`` (but bitsandbytes):
    vLLM reads the method from the checkpoint's config, and refuses a flag that names another
    (compressed-tensors FP8 checkpoints under ``--quantization fp8``, GPTQ ones under
    ``awq_marlin``).
    """
    method = ""  # vLLM's --quantization, if any
    match dtype:
        case "bf16":
            torch_dtype = "bfloat16"
        case "fp16":
            torch_dtype = "float16"
        case "fp8":
            torch_dtype = "bfloat16"
            method = "fp8"
        case "int8" | "int4":
            torch_dtype = "bfloat16"
            method = "bitsandbytes" if quantization == "bitsandbytes" else PREQUANTIZED[dtype]
        case _:
            raise ValueError(f"dtype: vLLM has no setting for {dtype!r}")
    if quantized_checkpoint and method != "bitsandbytes":
        method = ""
    extra = ["--quantization", method] if method else []
    if kv_cache_dtype == "fp8":
        extra += ["--kv-cache-dtype", "fp8"]
    return torch_dtype, extra


def scenario_dtype_args(scenario: Scenario, served_model: str) -> tuple[str, list[str]]:
    """``--dtype`` and the scenario-level flags beyond the engine section for serving
    ``served_model`` (what ``--model`` gets: a catalogue id, a local path): weight and KV-cache
    dtypes, their quantization method and pipeline parallelism."""
    torch_dtype, extra = dtype_args(
        scenario.dtype,
        scenario.kv_cache_dtype,
        scenario.quantization,
        quantized_checkpoint=checkpoint_quantization(served_model) is not None,
    )
    if scenario.engine.pipeline_parallel_size > 1:
        extra += ["--pipeline-parallel-size", str(scenario.engine.pipeline_parallel_size)]
    return torch_dtype, extra
