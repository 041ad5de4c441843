"""The top-level :class:`Scenario`: every section of the file, and the model and GPU it names
resolved to catalogue (or custom) value objects."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from sim.catalog.architecture import ModelArch
from sim.catalog.hardware import GPU, dtype_spelling, get_gpu
from sim.catalog.hf_config import load_hf_config
from sim.catalog.model_names import checkpoint_quantization
from sim.catalog.models import get_model
from sim.engine.memory import kv_dtype_for
from sim.scenario.base import Spec
from sim.scenario.sections import (
    CostSpec,
    CustomGPUSpec,
    CustomModelSpec,
    EngineSpec,
    FleetSpec,
    HFConfigModelSpec,
    LatencySpec,
    OutputSpec,
    RooflineLatencySpec,
    SimulatorSpec,
    SLOSpec,
    vllm_batch_defaults,
)
from sim.scenario.workload import WorkloadSpec

Dtype = Literal["bf16", "fp16", "fp8", "int8", "int4"]
KVCacheDtype = Literal["auto", "bf16", "fp16", "fp8"]
#: What ``dtype`` and ``kv_cache_dtype`` accept once vLLM's spellings are read ("auto" too).
_DTYPE_VALUES = {
    "dtype": {*get_args(Dtype), "auto"},
    "kv_cache_dtype": set(get_args(KVCacheDtype)),
}
#: How a quantized checkpoint's method reads before its dtype in a message.
_METHOD_TO_LABEL = {"weight_only": "weight-only ", "w8a8": "W8A8 ", "bitsandbytes": "bitsandbytes "}


class Scenario(Spec):
    """Everything a simulation needs."""

    name: str = "scenario"
    seed: Annotated[int, Field(ge=0)] = 0
    model: str | HFConfigModelSpec | CustomModelSpec
    gpu: str | CustomGPUSpec
    dtype: Dtype = "bf16"
    # How quantized weights compute (sim/engine/quantization.py QUANTIZATION_METHODS).
    quantization: Literal["auto", "weight_only", "w8a8", "bitsandbytes"] = "auto"
    kv_cache_dtype: KVCacheDtype = "auto"
    engine: EngineSpec = EngineSpec()
    fleet: FleetSpec = FleetSpec()
    workload: WorkloadSpec
    latency: LatencySpec = RooflineLatencySpec()
    slo: SLOSpec = SLOSpec()
    cost: CostSpec = CostSpec()
    output: OutputSpec = OutputSpec()
    simulator: SimulatorSpec = SimulatorSpec()
    # The engine's batch limits the scenario left out, filled in as vLLM picks them for the GPU.
    _filled_batch_limits: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="before")
    @classmethod
    def _profile_shorthand(cls, data: Any) -> Any:
        latency = data.get("latency") if isinstance(data, dict) else None
        if isinstance(latency, dict) and set(latency) == {"profile"}:
            data = {**data, "latency": {"type": "profile", "path": latency["profile"]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _dtypes_and_quantized_checkpoints(cls, data: Any) -> Any:
        """Reads ``dtype`` and ``kv_cache_dtype`` as vLLM and Hugging Face spell them too
        (``bfloat16``, ``float16``, ``half``, ``fp8_e4m3``), and ``dtype: auto`` as vLLM's
        ``--dtype auto``: the checkpoint's own weights (16-bit for an unquantized one).

        A quantized checkpoint (``Qwen/Qwen3-8B-FP8``) sets ``dtype`` and ``quantization``
        where the scenario leaves them out (or says ``auto``; ``quantization: auto`` defers to
        it), and contradicts a scenario that says otherwise."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for field in ("dtype", "kv_cache_dtype"):
            value = data.get(field)
            # A value it cannot read stays as written, for the message to quote.
            if isinstance(value, str) and dtype_spelling(value) in _DTYPE_VALUES[field]:
                data[field] = dtype_spelling(value)
        model = data.get("model")
        implied = checkpoint_quantization(model) if isinstance(model, str) else None
        if implied is None:
            if data.get("dtype") == "auto":
                data["dtype"] = "bf16"  # fp16 and bf16 checkpoints run alike
            return data
        dtype = data.get("dtype", "auto")
        if dtype == "auto":
            dtype = implied.dtype
        if dtype != implied.dtype:
            raise ValueError(
                f"dtype: model {model!r} is an {implied.dtype} checkpoint but dtype is "
                f"{dtype!r}; set dtype: {implied.dtype} or auto (vLLM's --dtype is the "
                "activations' type), or name the 16-bit model"
            )
        method = data.get("quantization", "auto")
        # An fp8 checkpoint runs W8A8 or weight-only by the GPU ("auto"): either may be asked.
        allowed = {"auto", implied.quantization}
        if implied.quantization == "auto":
            allowed |= {"weight_only", "w8a8"}
        if method not in allowed:
            kind = _METHOD_TO_LABEL.get(implied.quantization, "")
            raise ValueError(
                f"quantization: model {model!r} is a {kind}{implied.dtype} checkpoint, which "
                f"vLLM does not serve as {method!r}; leave quantization out"
            )
        if method == "auto":
            method = implied.quantization
        return {**data, "dtype": implied.dtype, "quantization": method}

    @model_validator(mode="after")
    def _vllms_batch_limits_for_the_gpu(self) -> Scenario:
        """``engine.max_num_seqs`` and ``max_num_batched_tokens`` left out take the values vLLM
        picks for this GPU (sim.scenario.sections.vllm_batch_defaults); with chunked prefill
        off the token limit is at least the context, as vLLM makes it."""
        engine = self.engine
        unset = {"max_num_seqs", "max_num_batched_tokens"} - engine.model_fields_set
        if not unset:
            return self
        try:
            gpu = self.resolve_gpu()
        except ValueError:
            return self  # check_consistency names the GPU
        self._filled_batch_limits = frozenset(unset)
        object.__setattr__(self, "engine", self._batch_limits(engine, gpu))
        return self

    def _batch_limits(self, engine: EngineSpec, gpu: GPU) -> EngineSpec:
        """``engine`` with the limits the scenario left out (_filled_batch_limits) as vLLM
        picks them for ``gpu`` at the engine's TP."""
        unset = self._filled_batch_limits
        try:
            context = engine.max_model_len or self.resolve_model().max_position_embeddings
        except ValueError:
            context = 0  # check_consistency names the model
        world_size = engine.tensor_parallel_size * engine.pipeline_parallel_size
        seqs, tokens = vllm_batch_defaults(gpu, world_size)
        if not engine.enable_chunked_prefill:
            tokens = max(tokens, context)
        update = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}
        update = {field: value for field, value in update.items() if field in unset}
        if "max_num_seqs" in update and "max_num_batched_tokens" not in update:
            update["max_num_seqs"] = min(seqs, engine.max_num_batched_tokens)
        return engine.model_copy(update=update)

    def on_pool(
        self, gpu: str | CustomGPUSpec | None, tensor_parallel_size: int | None
    ) -> Scenario:
        """The scenario as a pool of its fleet sees it: its own GPU and TP where given, and the
        batch limits the scenario left out as vLLM picks them for that GPU and TP."""
        engine = self.engine
        if tensor_parallel_size is not None:
            engine = engine.model_copy(update={"tensor_parallel_size": tensor_parallel_size})
        pool = self.model_copy(update={"gpu": gpu or self.gpu, "engine": engine})
        if self._filled_batch_limits:
            with contextlib.suppress(ValueError):  # check_consistency names the GPU
                object.__setattr__(pool, "engine", pool._batch_limits(engine, pool.resolve_gpu()))
        return pool

    @model_serializer(mode="wrap")
    def _without_filled_batch_limits(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A dump leaves out the batch limits the scenario did not set, so that reading it back
        (on this GPU or, in a plan or a pool, on another) fills them in again."""
        data = handler(self)
        engine = data.get("engine") if isinstance(data, dict) else None
        if self._filled_batch_limits and isinstance(engine, dict):
            data["engine"] = {
                key: value for key, value in engine.items() if key not in self._filled_batch_limits
            }
        return data

    @model_validator(mode="after")
    def _priorities_need_the_policy(self) -> Scenario:
        if self.workload.priority is not None and self.engine.scheduling_policy != "priority":
            raise ValueError(
                "workload.priority: request priorities need engine.scheduling_policy: priority "
                "(vLLM refuses a priority under fcfs)"
            )
        return self

    def resolve_model(self) -> ModelArch:
        """The model architecture (catalogue, local config.json, or custom dimensions)."""
        if isinstance(self.model, str):
            return get_model(self.model)
        if isinstance(self.model, HFConfigModelSpec):
            return load_hf_config(self.model.hf_config)
        return ModelArch(**self.model.model_dump())

    def resolve_gpu(self) -> GPU:
        """The GPU (catalogue or custom)."""
        return get_gpu(self.gpu) if isinstance(self.gpu, str) else self.gpu.build()

    def gpu_hour_usd(self) -> float | None:
        """The price per hour of one of this scenario's GPUs: ``cost.gpu_hour_usd`` if it names
        the GPU, else the GPU's own (catalogue default or custom ``hourly_cost_usd``)."""
        gpu = self.resolve_gpu()
        for key, price in self.cost.gpu_hour_usd.items():
            try:
                name = get_gpu(key).name
            except ValueError:
                name = key
            if name == gpu.name:
                return price
        return gpu.hourly_cost_usd

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type (``auto``: 16-bit for 16-bit and quantized weights)."""
        return kv_dtype_for(self.dtype, self.kv_cache_dtype)
