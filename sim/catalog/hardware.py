"""GPU catalogue with a cited source for every figure, and the element sizes of numeric dtypes.

Conventions, so that every number in this module means the same thing:

- **Dense rates.** Tensor-core rates are for dense matrices. Datasheets often print the 2:4
  structured-sparsity rate (marked "*With sparsity"), which is twice the dense rate; where a
  source gives only that figure we halve it and say so in the entry's comment. Serving engines do
  not run sparse kernels, so the dense rate is the one a roofline model should use.
- **Decimal units.** Capacities and bandwidths are decimal as printed on spec sheets: 80 GB is
  ``80e9`` bytes, 3.35 TB/s is ``3.35e12`` bytes/s. (An "80 GB" H100 actually exposes about
  79.5 GiB ≈ 85.4e9 bytes to CUDA in this model, 79.1–79.3 GiB in vLLM's logs:
  :func:`reported_memory_bytes` converts the printed figure to what CUDA reports, which is what
  vLLM's ``gpu_memory_utilization`` is a fraction of.)
- **One-direction links.** ``link_bandwidth_bytes_per_s`` is what one GPU can send to its peers in
  one direction. NVLink figures on datasheets are bidirectional totals, so we halve them; PCIe
  cards without an NVLink fabric use the one-direction PCIe x16 rate.
- **bf16 = fp16.** NVIDIA tensor cores run bf16 and fp16 (with fp32 accumulate) at the same rate,
  so one field serves both.

Users may describe their own GPU in a scenario: :class:`GPU` is built from plain keyword values
and validates them.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}
"""Bytes per element of each storage dtype the simulator knows."""

# Spellings used by Hugging Face configs (``torch_dtype``) and vLLM flags (``--kv-cache-dtype``),
# so that values copied from either work unchanged.
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
}


def dtype_spelling(dtype: str) -> str:
    """``dtype`` in the simulator's spelling when it is a known alias (``"bfloat16"`` → ``"bf16"``,
    ``"FP8_E4M3"`` → ``"fp8"``), else unchanged, for the caller to accept or refuse."""
    key = dtype.strip().lower()
    return _DTYPE_ALIASES.get(key, key)


def _canonical_dtype(dtype: str) -> str:
    """The :data:`DTYPE_BYTES` key for ``dtype`` (case-insensitive, common aliases accepted)."""
    key = dtype_spelling(dtype)
    if key not in DTYPE_BYTES:
        raise ValueError(
            f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)} "
            f"(aliases: {', '.join(_DTYPE_ALIASES)})"
        )
    return key


def bytes_per_element(dtype: str) -> float:
    """Bytes one element of ``dtype`` occupies (``'int4'`` is half a byte).

    Case-insensitive; accepts the spellings of Hugging Face (``'bfloat16'``) and vLLM
    (``'fp8_e4m3'``). An unknown dtype raises ``ValueError`` listing the valid ones.
    """
    return DTYPE_BYTES[_canonical_dtype(dtype)]


def _check_positive(gpu_name: str, field_name: str, value: object, unit: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number greater than zero."""
    # bool is an int subclass; ``True`` as a bandwidth is a typo, not a number.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"GPU {gpu_name!r}: {field_name} must be a positive finite number of {unit}, "
            f"got {value!r}; take it from the GPU's datasheet (dense, decimal units)"
        )


#: How a server's GPUs reach each other: an NVLink fabric joining all of them, or PCIe.
INTERCONNECTS = ("nvlink", "pcie")


@dataclass(frozen=True, slots=True)
class GPU:
    """One accelerator as a roofline model sees it: memory, bandwidths and dense tensor rates.

    Rates are dense tensor-core peaks (no sparsity), capacities and bandwidths decimal, and
    ``link_bandwidth_bytes_per_s`` is the per-GPU, one-direction rate to peers in the same node
    (see the module docstring). ``fp8_flops``, ``int8_ops`` and ``tf32_flops`` are ``None`` where
    the GPU has no tensor cores for that type; :meth:`tensor_flops` then raises.
    ``hourly_cost_usd`` is a default price per GPU-hour where one is cited (DEFAULT_PRICE_SOURCE),
    else ``None``; a scenario can set any. ``weight_stream_efficiency`` and ``gemm_latency_s`` are
    measured on the GPU where an operator profile is at hand (the fraction of peak memory
    bandwidth at which a linear layer streams its weights, and each GEMM kernel's fixed time),
    ``attention_compute_efficiency`` where a prefill-attention kernel benchmark is (the
    fraction of the dense bf16 peak its causal FLOPs run at):
    ``None`` leaves the roofline's defaults (sim/engine/latency.py). ``interconnect`` is how the
    GPUs of one server reach each other, ``"nvlink"`` (an NVLink fabric joining all of them) or
    ``"pcie"``; ``peer_to_peer`` False where the driver refuses GPU peer access (GeForce RTX
    40-series): both decide which all-reduce vLLM can use. ``bridge_size`` cards of a PCIe GPU
    sold with NVLink bridges (2 for the H100 NVL, 4 for the H200 NVL's four-way bridge) reach
    each other over the bridge at ``bridge_bandwidth_bytes_per_s`` (per GPU, one direction): a
    tensor-parallel group of up to that many talks over it, a larger one over ``interconnect``
    (see :meth:`link`). ``ecc_reserved_fraction`` is the share of a GDDR card's memory its
    ECC, on by default on data-centre cards, keeps from CUDA (HBM carries ECC beside the data,
    so 0 there; see :func:`reported_memory_bytes`). ``nvlink_multicast`` where the server's
    NVSwitch reduces in the switch (NVLink SHARP, third-generation NVSwitch on: HGX H100, H200,
    B200), which vLLM uses for the all-reduces of wide TP groups (sim/engine/collectives.py
    ALLREDUCE_KERNELS). Every number is checked
    on construction: a non-positive or non-finite value raises ``ValueError`` naming the field.
    """

    name: str
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None
    int8_ops: float | None
    link_bandwidth_bytes_per_s: float
    tf32_flops: float | None = None
    hourly_cost_usd: float | None = None
    weight_stream_efficiency: float | None = None
    gemm_latency_s: float | None = None
    attention_compute_efficiency: float | None = None
    interconnect: str = "nvlink"
    peer_to_peer: bool = True
    bridge_size: int = 0
    bridge_bandwidth_bytes_per_s: float | None = None
    ecc_reserved_fraction: float = 0.0
    nvlink_multicast: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"GPU name must be a non-empty string, got {self.name!r}")
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(
                f"GPU {self.name!r}: interconnect must be one of {', '.join(INTERCONNECTS)}, "
                f"got {self.interconnect!r} (how its GPUs reach each other in one server)"
            )
        _check_positive(self.name, "memory_bytes", self.memory_bytes, "bytes (80 GB -> 80e9)")
        _check_positive(
            self.name, "memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s, "bytes/s"
        )
        _check_positive(self.name, "bf16_flops", self.bf16_flops, "FLOP/s")
        _check_positive(
            self.name,
            "link_bandwidth_bytes_per_s",
            self.link_bandwidth_bytes_per_s,
            "bytes/s (one direction)",
        )
        optional: tuple[tuple[str, float | None, str], ...] = (
            ("fp8_flops", self.fp8_flops, "FLOP/s (or None if the GPU has no FP8 tensor cores)"),
            ("int8_ops", self.int8_ops, "op/s (or None if the GPU has no INT8 tensor cores)"),
            ("tf32_flops", self.tf32_flops, "FLOP/s (or None if unknown)"),
            ("hourly_cost_usd", self.hourly_cost_usd, "USD per hour (or None if unknown)"),
            ("gemm_latency_s", self.gemm_latency_s, "seconds (or None if not measured)"),
        )
        for field_name, value, unit in optional:
            if value is not None:
                _check_positive(self.name, field_name, value, unit)
        if self.bridge_size:
            if isinstance(self.bridge_size, bool) or self.bridge_size < 2:
                raise ValueError(
                    f"GPU {self.name!r}: bridge_size must be 0 (no NVLink bridge) or the number "
                    f"of cards one bridge joins (2 or more), got {self.bridge_size!r}"
                )
            _check_positive(
                self.name,
                "bridge_bandwidth_bytes_per_s",
                self.bridge_bandwidth_bytes_per_s,
                "bytes/s (one direction) over the NVLink bridge",
            )
        if self.nvlink_multicast and self.interconnect != "nvlink":
            raise ValueError(
                f"GPU {self.name!r}: nvlink_multicast needs interconnect 'nvlink' (an NVSwitch "
                f"that reduces in the switch), got interconnect {self.interconnect!r}"
            )
        ecc = self.ecc_reserved_fraction
        if isinstance(ecc, bool) or not isinstance(ecc, int | float) or not 0 <= ecc < 1:
            raise ValueError(
                f"GPU {self.name!r}: ecc_reserved_fraction must be in [0, 1), got {ecc!r}; "
                "0 unless ECC takes memory from CUDA (GDDR data-centre cards: 1/16)"
            )
        for field_name in ("weight_stream_efficiency", "attention_compute_efficiency"):
            efficiency = getattr(self, field_name)
            if efficiency is not None and (
                isinstance(efficiency, bool)
                or not isinstance(efficiency, int | float)
                or not 0 < efficiency <= 1
            ):
                raise ValueError(
                    f"GPU {self.name!r}: {field_name} must be a fraction in (0, 1], got "
                    f"{efficiency!r}; leave it out unless a profile of the GPU measured it"
                )

    def link(self, tensor_parallel_size: int) -> tuple[str, float]:
        """How a tensor-parallel group of this size reaches its peers: over an NVLink bridge
        when one joins them all (``bridge_size``), else over the server's ``interconnect``;
        with that link's bandwidth per GPU, one direction. vLLM runs its own all-reduce only
        where every pair has NVLink or at two PCIe GPUs, so wider groups beyond a bridge fall
        back to PCIe and NCCL (sim/engine/collectives.py allreduce_kernel). A bridge of more than
        two cards gives a smaller group its links to those members only (the H200 NVL's
        four-way bridge: a third of its 450 GB/s to the one peer of a pair)."""
        if self.bridge_bandwidth_bytes_per_s and 1 < tensor_parallel_size <= self.bridge_size:
            # A bridge joining more than two cards splits each one's NVLinks evenly over its
            # peers: a group uses the links to its own members.
            share = (tensor_parallel_size - 1) / (self.bridge_size - 1)
            return "nvlink", self.bridge_bandwidth_bytes_per_s * share
        return self.interconnect, self.link_bandwidth_bytes_per_s

    def tensor_flops(self, dtype: str) -> float:
        """Dense tensor-core peak for matrix multiplies whose inputs are ``dtype``.

        ``'bf16'``/``'fp16'`` give :attr:`bf16_flops`, ``'fp8'`` :attr:`fp8_flops` and ``'int8'``
        :attr:`int8_ops`. ``'fp32'`` gives :attr:`tf32_flops`: it assumes fp32 matmuls run on
        tensor cores as TF32 (PyTorch's ``allow_tf32``); plain fp32 on CUDA cores is far slower and
        not modelled. ``'int4'`` raises: weight-only int4 kernels (AWQ, GPTQ) dequantize and
        multiply in bf16/fp16, so pass the activation dtype. A dtype the GPU has no tensor cores
        for raises ``ValueError`` naming the dtypes it does support.
        """
        key = _canonical_dtype(dtype)
        rates: dict[str, float | None] = {
            "bf16": self.bf16_flops,
            "fp16": self.bf16_flops,
            "fp8": self.fp8_flops,
            "int8": self.int8_ops,
            "fp32": self.tf32_flops,
        }
        supported = [name for name, rate in rates.items() if rate is not None]
        if key == "int4":
            raise ValueError(
                "int4 is a weight storage format, not a matmul input type: weight-only int4 "
                "kernels multiply in bf16/fp16, so ask for the activation dtype "
                f"(gpu {self.name} supports {', '.join(supported)})"
            )
        rate = rates[key]
        if rate is None:
            what = "tf32 tensor-core rate on record" if key == "fp32" else f"{key} tensor cores"
            raise ValueError(
                f"gpu {self.name} has no {what}; use dtype {' or '.join(supported)}, "
                f"or choose a GPU that supports {key}"
            )
        return rate


#: What the driver keeps of a GPU's memory from CUDA's total, whatever its size (datasheet "GB"
#: for HBM and GDDR are binary sizes). Measured: an RTX 4090 ("24 GB") reports 25,250,627,584
#: bytes (vLLM 0.19 run, shared/data/vllm_real_runs/llmservingsim_RTX4090_llama31_8b/meta.json),
#: 24 GiB less 495 MiB. The same amount puts an 80 GB card at 79.52 GiB, where vLLM logs
#: ``total_gpu_memory`` of 79.11–79.33 GiB on 80 GB H100s and A100s (public vLLM logs, found by
#: searching "total_gpu_memory (79."); the 0.98 of the GiB this replaced gave them 78.4 GiB.
#: Those logs imply 0.67–0.89 GiB kept on an 80 GB card, so the model stays 0.2–0.4 GiB high
#: there (and likely ~0.5 GiB on an H200, whose nvidia-smi total is 140.4 GiB): the reserve
#: grows a little with the card, not in proportion to it.
CUDA_RESERVED_BYTES = 24 * 2**30 - 25_250_627_584


#: What ECC keeps from CUDA on a GDDR6 data-centre card, where it is on by default: 1/16 of the
#: memory. nvidia-smi reports an L4 ("24 GB") at 23,034 MiB and an L40S ("48 GB") at 46,068 MiB,
#: both 0.937 of the GiB figure (public nvidia-smi logs, e.g. found by searching "23034MiB"),
#: where an RTX 4090 without ECC reports 24,564 MiB of 24 GiB; vLLM on an L40S logs
#: ``total_gpu_memory`` of 44.31–44.39 GiB; 48 GiB × 15/16 less CUDA_RESERVED_BYTES is 44.5.
GDDR_ECC_RESERVED_FRACTION = 1 / 16


def is_cpu_backend(hardware_name: str) -> bool:
    """Whether hardware so named (a GPU's or a profile's) is vLLM's CPU backend: this project's
    CPU scenarios and profiles name it with "cpu" (``cpu-core``, ``cpu (2 cores)``)."""
    return "cpu" in hardware_name.lower()


def reported_memory_bytes(gpu: GPU) -> float:
    """Total device memory as CUDA reports it (and vLLM's ``gpu_memory_utilization`` scales):
    the datasheet's GiB, less what ECC keeps on a GDDR card that has it on, less the driver's
    reserve (never below nothing, for a custom GPU smaller than that reserve)."""
    usable = 1.0 - gpu.ecc_reserved_fraction
    return max(0.0, gpu.memory_bytes / 1e9 * 2**30 * usable - CUDA_RESERVED_BYTES)


#: Where the catalogue's default GPU-hour prices come from: "H100 vs A100 Cloud Pricing: When the
#: Upgrade Pays Off", https://pricegpu.pages.dev/blog/h100-vs-a100-cloud-price (typical
#: on-demand list prices in early 2026 across Lambda, CoreWeave, RunPod and others: A100 80GB SXM
#: $1.49–2.49/h, H100 SXM 80GB $2.49–3.99/h); the defaults are the middles of those ranges. Other
#: GPUs have no default: a scenario sets their price (``cost.gpu_hour_usd``). Prices move; set
#: your own.
DEFAULT_PRICE_SOURCE = "https://pricegpu.pages.dev/blog/h100-vs-a100-cloud-price (early 2026)"

#: Prefill attention on Hopper (FlashAttention 3, which vLLM runs there): the inference-sim H100
#: kernel benchmark (shared/data/inference_sim_kernel_bench/mha/prefill/h100/*.csv, five head
#: shapes, made with InferSim's fa3_mha_prefill.py) runs the causal FLOPs at 0.64 of the dense
#: bf16 peak at 4,096 tokens and 0.70–0.77 at 8k–32k, median 0.71 over those; a fit with a fixed
#: time gives 0.73. Below ~2k tokens its host-timed points are mostly launch time, which the
#: model leaves out. The H100s and the H200 share it (same GH100 chip and kernel).
HOPPER_ATTENTION_EFFICIENCY = 0.72

#: The A100 80GB SXM's measured weight-streaming rate and GEMM fixed time (see that entry),
#: shared by every A100.
A100_WEIGHT_STREAM_EFFICIENCY = 0.80
A100_GEMM_LATENCY_S = 5.3e-6

GPU_CATALOG: dict[str, GPU] = {
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    # Table columns "A100 40GB SXM" / "A100 80GB SXM": BF16 312 TFLOPS (624* with sparsity),
    # TF32 156 (312*), INT8 624 TOPS (1,248*); HBM2 1,555 GB/s (40 GB), HBM2e 2,039 GB/s (80 GB);
    # NVLink 600 GB/s bidirectional -> 300 GB/s one way. Ampere has no FP8 tensor cores.
    "a100-40gb-sxm": GPU(
        name="A100 40GB SXM",
        memory_bytes=40e9,
        memory_bandwidth_bytes_per_s=1.555e12,
        bf16_flops=312e12,
        fp8_flops=None,
        int8_ops=624e12,
        link_bandwidth_bytes_per_s=300e9,
        tf32_flops=156e12,
        weight_stream_efficiency=A100_WEIGHT_STREAM_EFFICIENCY,
        gemm_latency_s=A100_GEMM_LATENCY_S,
    ),
    "a100-80gb-sxm": GPU(
        name="A100 80GB SXM",
        memory_bytes=80e9,
        memory_bandwidth_bytes_per_s=2.039e12,
        bf16_flops=312e12,
        fp8_flops=None,
        int8_ops=624e12,
        link_bandwidth_bytes_per_s=300e9,
        tf32_flops=156e12,
        hourly_cost_usd=1.99,  # see DEFAULT_PRICE_SOURCE
        # Fitted to Vidur's A100 operator profiles (shared/data/vidur/profiling/compute/a100/
        # meta-llama/{Llama-2-7b-hf,Llama-2-70b-hf,Meta-Llama-3-8B,Meta-Llama-3-70B}/mlp.csv):
        # the four projection GEMMs of a layer at 1–8 tokens and TP 1/2/4/8, medians, as
        # 4 × gemm_latency_s + weight bytes / (2,039 GB/s × weight_stream_efficiency), least
        # squares on the relative error: 5.3 µs and 0.80 (median |error| 2.1 %, worst 16 %;
        # tests/test_latency.py holds the model to it). The other A100s are the same GA100 chip
        # and kernels and take the same two figures.
        weight_stream_efficiency=A100_WEIGHT_STREAM_EFFICIENCY,
        gemm_latency_s=A100_GEMM_LATENCY_S,
    ),
    # Same A100 datasheet, "A100 40GB PCIe" / "A100 80GB PCIe" columns: same tensor rates as SXM;
    # 1,555 GB/s (40 GB) and 1,935 GB/s (80 GB); interconnect "NVIDIA NVLink Bridge for 2 GPUs:
    # 600 GB/s; PCIe Gen4: 64 GB/s" (bidirectional). We use PCIe Gen4 x16, 32 GB/s one way: the
    # bridge joins only pairs of cards, so any tensor-parallel group larger than two (and any
    # server built without bridges) talks over PCIe, and a slowest-link model must use it.
    "a100-40gb-pcie": GPU(
        name="A100 40GB PCIe",
        memory_bytes=40e9,
        memory_bandwidth_bytes_per_s=1.555e12,
        bf16_flops=312e12,
        fp8_flops=None,
        int8_ops=624e12,
        link_bandwidth_bytes_per_s=32e9,
        tf32_flops=156e12,
        interconnect="pcie",
        weight_stream_efficiency=A100_WEIGHT_STREAM_EFFICIENCY,
        gemm_latency_s=A100_GEMM_LATENCY_S,
    ),
    "a100-80gb-pcie": GPU(
        name="A100 80GB PCIe",
        memory_bytes=80e9,
        memory_bandwidth_bytes_per_s=1.935e12,
        bf16_flops=312e12,
        fp8_flops=None,
        int8_ops=624e12,
        link_bandwidth_bytes_per_s=32e9,
        tf32_flops=156e12,
        interconnect="pcie",
        weight_stream_efficiency=A100_WEIGHT_STREAM_EFFICIENCY,
        gemm_latency_s=A100_GEMM_LATENCY_S,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core
    # ("H100 SXM" column): 80 GB, 3.35 TB/s, BF16 1,979 TFLOPS*, FP8 3,958*, INT8 3,958 TOPS*,
    # TF32 989* (* = with sparsity, "specifications 1/2 lower without sparsity"); NVLink 900 GB/s
    # bidirectional -> 450 GB/s one way. Dense values to one decimal from the NVIDIA H100 Tensor
    # Core GPU Architecture whitepaper (Hopper whitepaper), Table "H100 SXM5": BF16 989.4, FP8
    # 1,978.9, INT8 1,978.9, TF32 494.7.
    "h100-sxm": GPU(
        name="H100 SXM",
        memory_bytes=80e9,
        memory_bandwidth_bytes_per_s=3.35e12,
        bf16_flops=989.4e12,
        fp8_flops=1978.9e12,
        int8_ops=1978.9e12,
        link_bandwidth_bytes_per_s=450e9,
        tf32_flops=494.7e12,
        hourly_cost_usd=3.24,  # see DEFAULT_PRICE_SOURCE
        # Fitted to two H100 operator profiles together: Vidur's (shared/data/vidur/profiling/
        # compute/h100/meta-llama/{Llama-2-7b-hf,Llama-2-70b-hf}/mlp.csv, four GEMMs a layer, TP
        # 1/2/4/8) and LLMServingSim's (shared/data/llmservingsim_profiles/H100/meta-llama/
        # Llama-3.1-{8B,70B}/tp*/layers.csv, seven GEMMs a layer), every row at 1–8 tokens, least
        # squares on the relative error: 4.2 µs per GEMM and 0.91 of 3.35 TB/s (median |error|
        # 1.4 %, worst 15 %; each profile alone gives 4.0 µs/0.89 and 4.8 µs/0.93). These are
        # also the roofline's defaults for GPUs without a profile (sim/engine/latency.py).
        weight_stream_efficiency=0.91,
        gemm_latency_s=4.2e-6,
        attention_compute_efficiency=HOPPER_ATTENTION_EFFICIENCY,
        nvlink_multicast=True,  # HGX: third-generation NVSwitch or later
    ),
    # Same H100 datasheet, "H100 PCIe" column: 80 GB, 2 TB/s, BF16 1,513 TFLOPS*, FP8 3,026*,
    # INT8 3,026 TOPS*, TF32 756* (halved); Hopper whitepaper "H100 PCIe": BF16 756, FP8 1,513,
    # INT8 1,513, TF32 378 dense. Interconnect "NVLink: 600 GB/s, PCIe Gen5: 128 GB/s"
    # (bidirectional). As for the A100 PCIe we use PCIe, Gen5 x16 = 64 GB/s one way: the NVLink
    # bridge joins pairs of cards only (same reasoning as above).
    "h100-pcie": GPU(
        name="H100 PCIe",
        memory_bytes=80e9,
        memory_bandwidth_bytes_per_s=2.0e12,
        bf16_flops=756e12,
        fp8_flops=1513e12,
        int8_ops=1513e12,
        link_bandwidth_bytes_per_s=64e9,
        tf32_flops=378e12,
        interconnect="pcie",
        attention_compute_efficiency=HOPPER_ATTENTION_EFFICIENCY,
    ),
    # Same H100 datasheet, "H100 NVL" column (per GPU): 94 GB HBM3, 3.9 TB/s, BF16 1,671
    # TFLOPS*, FP8 3,341*, INT8 3,341 TOPS*, TF32 835* (* with sparsity, halved here);
    # interconnect "NVIDIA NVLink: 600 GB/s, PCIe Gen5: 128 GB/s" (bidirectional). The cards
    # come joined in pairs by NVLink bridges: a TP group of two talks over the bridge (300 GB/s
    # one way), a wider one over PCIe Gen5 x16 (64 GB/s one way), as for the H100 PCIe. Same
    # GH100 chip and FlashAttention kernel as the other Hopper GPUs, at lower clocks.
    "h100-nvl": GPU(
        name="H100 NVL",
        memory_bytes=94e9,
        memory_bandwidth_bytes_per_s=3.9e12,
        bf16_flops=835.5e12,
        fp8_flops=1670.5e12,
        int8_ops=1670.5e12,
        link_bandwidth_bytes_per_s=64e9,
        tf32_flops=417.5e12,
        interconnect="pcie",
        bridge_size=2,
        bridge_bandwidth_bytes_per_s=300e9,
        attention_compute_efficiency=HOPPER_ATTENTION_EFFICIENCY,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/
    # ("H200 NVL" column): 141 GB HBM3e, 4.8 TB/s, BF16 1,671 TFLOPS*, FP8 3,341*, INT8 3,341
    # TOPS*, TF32 835* (with sparsity, halved here); interconnect "2- or 4-way NVIDIA NVLink
    # bridge: 900 GB/s per GPU, PCIe Gen5: 128 GB/s" (bidirectional). We take the four-way
    # bridge: TP up to 4 over it (450 GB/s one way per GPU, split over its three peers, see
    # GPU.link), TP 8 over PCIe Gen5 x16 (64 GB/s one way).
    "h200-nvl": GPU(
        name="H200 NVL",
        memory_bytes=141e9,
        memory_bandwidth_bytes_per_s=4.8e12,
        bf16_flops=835.5e12,
        fp8_flops=1670.5e12,
        int8_ops=1670.5e12,
        link_bandwidth_bytes_per_s=64e9,
        tf32_flops=417.5e12,
        interconnect="pcie",
        bridge_size=4,
        bridge_bandwidth_bytes_per_s=450e9,
        attention_compute_efficiency=HOPPER_ATTENTION_EFFICIENCY,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/
    # ("H200 SXM" column): 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS*, FP8 3,958*, INT8 3,958*,
    # TF32 989* (with sparsity); NVLink 900 GB/s bidirectional -> 450 GB/s. Same GH100 silicon
    # and clocks as H100 SXM, so the dense rates are the Hopper whitepaper's H100 SXM5 values.
    "h200": GPU(
        name="H200",
        memory_bytes=141e9,
        memory_bandwidth_bytes_per_s=4.8e12,
        bf16_flops=989.4e12,
        fp8_flops=1978.9e12,
        int8_ops=1978.9e12,
        link_bandwidth_bytes_per_s=450e9,
        tf32_flops=494.7e12,
        attention_compute_efficiency=HOPPER_ATTENTION_EFFICIENCY,
        nvlink_multicast=True,  # HGX: third-generation NVSwitch or later
    ),
    # NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413
    # 48 GB GDDR6, 864 GB/s; BF16 362.05 TFLOPS (733* with sparsity), FP8 733 (1,466*),
    # INT8 733 TOPS (1,466*), TF32 183 (366*); the datasheet prints dense and sparse side by side.
    # No NVLink; "PCIe Gen4 x16: 64 GB/s bidirectional" -> 32 GB/s one way.
    "l40s": GPU(
        name="L40S",
        memory_bytes=48e9,
        memory_bandwidth_bytes_per_s=864e9,
        bf16_flops=362.05e12,
        fp8_flops=733e12,
        int8_ops=733e12,
        link_bandwidth_bytes_per_s=32e9,
        tf32_flops=183e12,
        interconnect="pcie",
        ecc_reserved_fraction=GDDR_ECC_RESERVED_FRACTION,
    ),
    # NVIDIA L4 Tensor Core GPU datasheet,
    # https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet : 24 GB GDDR6,
    # 300 GB/s; BF16 242 TFLOPS*, FP8 485*, INT8 485 TOPS*, TF32 120* (* with sparsity, halved
    # here); "PCIe Gen4 x16: 64 GB/s" (bidirectional) -> 32 GB/s one way; no NVLink.
    "l4": GPU(
        name="L4",
        memory_bytes=24e9,
        memory_bandwidth_bytes_per_s=300e9,
        bf16_flops=121e12,
        fp8_flops=242.5e12,
        int8_ops=242.5e12,
        link_bandwidth_bytes_per_s=32e9,
        tf32_flops=60e12,
        interconnect="pcie",
        ecc_reserved_fraction=GDDR_ECC_RESERVED_FRACTION,
    ),
    # NVIDIA HGX platform specifications, https://www.nvidia.com/en-us/data-center/hgx/
    # ("HGX B200", per-GPU rows): 180 GB HBM3e; FP8 9 PFLOPS*, INT8 9 POPS*, FP16/BF16
    # 4.5 PFLOPS*, TF32 2.2 PFLOPS* (* with sparsity, halved here); 5th-generation NVLink
    # 1.8 TB/s bidirectional -> 900 GB/s one way. Memory bandwidth from the NVIDIA DGX B200
    # datasheet, https://www.nvidia.com/en-us/data-center/dgx-b200/ : 64 TB/s HBM3e over 8 GPUs
    # = 8 TB/s each (1,440 GB total = 180 GB each, agreeing with HGX). The current HGX page
    # prints 7.7 TB/s per GPU; we keep NVIDIA's headline 8 TB/s. The 192 GB often quoted is the
    # raw HBM stack capacity, not what the HGX/DGX B200 exposes.
    "b200": GPU(
        name="B200",
        memory_bytes=180e9,
        memory_bandwidth_bytes_per_s=8e12,
        bf16_flops=2.25e15,
        fp8_flops=4.5e15,
        int8_ops=4.5e15,
        link_bandwidth_bytes_per_s=900e9,
        tf32_flops=1.1e15,
        nvlink_multicast=True,  # HGX: third-generation NVSwitch or later
    ),
    # NVIDIA Ada GPU Architecture whitepaper v2.01, Table "GeForce RTX 4090",
    # https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
    # 24 GB GDDR6X, 1,008 GB/s; Peak BF16 Tensor TFLOPS with FP32 accumulate 165.2 (330.4*);
    # FP16 with FP16 accumulate is 330.3, but frameworks accumulate bf16/fp16 matmuls in fp32,
    # and GeForce cards run fp32-accumulate at half rate, so 165.2 is the realistic figure.
    # FP8 with FP32 accumulate 330.3 (660.6*), INT8 660.6 TOPS (1,321.2*), TF32 82.6 (165.2*).
    # No NVLink on Ada GeForce; PCIe 4.0 x16 = 32 GB/s one way.
    "rtx-4090": GPU(
        name="RTX 4090",
        memory_bytes=24e9,
        memory_bandwidth_bytes_per_s=1008e9,
        bf16_flops=165.2e12,
        fp8_flops=330.3e12,
        int8_ops=660.6e12,
        link_bandwidth_bytes_per_s=32e9,
        tf32_flops=82.6e12,
        interconnect="pcie",
        # The driver refuses peer access between GeForce RTX 4090s ("peer access is not
        # supported between these two devices", https://github.com/sgl-project/sglang/issues/4814),
        # so vLLM's own all-reduce cannot run and NCCL does, even on two cards.
        peer_to_peer=False,
    ),
}
"""The built-in GPUs, keyed by the names :func:`get_gpu` resolves to."""

# Short and vendor spellings, already normalised by _normalise_gpu_name. nvidia-smi's names
# (e.g. "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3") are included so that live/ and
# calibration/ can map a measured GPU onto its catalogue entry.
_GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb-sxm",
    "a100-sxm": "a100-80gb-sxm",
    "a100-sxm4": "a100-80gb-sxm",
    "a100-80gb": "a100-80gb-sxm",
    "a100-sxm4-80gb": "a100-80gb-sxm",
    "a100-40gb": "a100-40gb-sxm",
    "a100-sxm4-40gb": "a100-40gb-sxm",
    "a100-sxm-40gb": "a100-40gb-sxm",
    "a100-sxm-80gb": "a100-80gb-sxm",
    "a100-pcie": "a100-80gb-pcie",
    "a100-pcie-80gb": "a100-80gb-pcie",
    "a100-pcie-40gb": "a100-40gb-pcie",
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-sxm-80gb": "h100-sxm",
    "h100-sxm5-80gb": "h100-sxm",
    "h100-80gb-sxm": "h100-sxm",
    "h100-80gb-hbm3": "h100-sxm",
    "h100-pcie-80gb": "h100-pcie",
    "h100-80gb-pcie": "h100-pcie",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "h200-sxm-141gb": "h200",
    "b200-180gb": "b200",
    "h100-nvl-94gb": "h100-nvl",
    "h200-nvl-141gb": "h200-nvl",
    "l4-24gb": "l4",
    "4090": "rtx-4090",
    "rtx4090": "rtx-4090",
}


def _normalise_gpu_name(name: str) -> str:
    """Lower-case, hyphen-separated, without the vendor and product-line prefixes."""
    key = "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())
    for prefix in ("nvidia-", "geforce-", "tesla-"):
        key = key.removeprefix(prefix)
    return key


def get_gpu(name: str) -> GPU:
    """The catalogue GPU called ``name``.

    Case-insensitive; ``_``, spaces and ``-`` are interchangeable, and a few obvious aliases work
    (``'H100'`` and ``'H100-SXM5-80GB'`` -> ``'h100-sxm'``, ``'a100'`` -> ``'a100-80gb-sxm'``,
    ``'4090'`` -> ``'rtx-4090'``), as do nvidia-smi names such as ``'NVIDIA A100-SXM4-80GB'``.
    An unknown name raises ``ValueError`` with the closest catalogue names and the full list.
    """
    key = _normalise_gpu_name(name)
    key = _GPU_ALIASES.get(key, key)
    if key in GPU_CATALOG:
        return GPU_CATALOG[key]
    candidates = [*GPU_CATALOG, *_GPU_ALIASES]
    suggestions: list[str] = []
    for match in difflib.get_close_matches(key, candidates, n=5, cutoff=0.6):
        canonical = _GPU_ALIASES.get(match, match)
        if canonical not in suggestions:
            suggestions.append(canonical)
    hint = f"did you mean {' or '.join(repr(s) for s in suggestions[:3])}? " if suggestions else ""
    raise ValueError(
        f"unknown gpu {name!r}; {hint}known: {', '.join(GPU_CATALOG)} "
        "(or describe your own GPU in the scenario)"
    )


def gpu_names() -> list[str]:
    """The catalogue's GPU keys, in catalogue order."""
    return list(GPU_CATALOG)
