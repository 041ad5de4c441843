"""GPU catalogue: cited figures, dtype sizes, name resolution and input validation."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sim.catalog.hardware import (
    DTYPE_BYTES,
    GPU,
    GPU_CATALOG,
    bytes_per_element,
    get_gpu,
    gpu_names,
    reported_memory_bytes,
)
from sim.catalog.models import get_model
from sim.engine.latency import RooflineModel


def _gpu(**overrides: object) -> GPU:
    """A valid user-defined GPU, with keyword overrides."""
    values: dict[str, object] = {
        "name": "custom",
        "memory_bytes": 80e9,
        "memory_bandwidth_bytes_per_s": 3e12,
        "bf16_flops": 1e15,
        "fp8_flops": None,
        "int8_ops": None,
        "link_bandwidth_bytes_per_s": 100e9,
    }
    values.update(overrides)
    return GPU(**values)  # type: ignore[arg-type]


def test_dtype_bytes() -> None:
    assert DTYPE_BYTES == {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
    assert bytes_per_element("BF16") == 2
    assert bytes_per_element("bfloat16") == 2
    assert bytes_per_element("fp8_e4m3") == 1
    assert bytes_per_element("int4") == 0.5


def test_unknown_dtype_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown dtype 'fp6'.*bf16.*int4"):
        bytes_per_element("fp6")


def test_catalogue_keys() -> None:
    assert gpu_names() == [
        "a100-40gb-sxm",
        "a100-80gb-sxm",
        "a100-40gb-pcie",
        "a100-80gb-pcie",
        "h100-sxm",
        "h100-pcie",
        "h100-nvl",
        "h200-nvl",
        "h200",
        "l40s",
        "l4",
        "b200",
        "rtx-4090",
    ]


@pytest.mark.parametrize("key", list(GPU_CATALOG))
def test_every_catalogue_gpu_is_positive(key: str) -> None:
    gpu = GPU_CATALOG[key]
    assert gpu.memory_bytes > 0
    assert gpu.memory_bandwidth_bytes_per_s > 0
    assert gpu.bf16_flops > 0
    assert gpu.link_bandwidth_bytes_per_s > 0
    # Default prices only where a public source is cited (sim/hardware.py DEFAULT_PRICE_SOURCE).
    cited = {"a100-80gb-sxm": 1.99, "h100-sxm": 3.24}
    assert gpu.hourly_cost_usd == cited.get(key)


def test_h100_sxm_figures() -> None:
    gpu = get_gpu("h100-sxm")
    assert gpu.memory_bytes == 80e9
    assert gpu.memory_bandwidth_bytes_per_s == 3.35e12
    assert gpu.bf16_flops == 989.4e12
    assert gpu.fp8_flops == 1978.9e12
    assert gpu.int8_ops == 1978.9e12
    assert gpu.link_bandwidth_bytes_per_s == 450e9  # 900 GB/s bidirectional NVLink, halved


def test_dense_rates_are_half_the_datasheet_sparse_rates() -> None:
    # The H100 datasheet prints 1,979 / 3,958 TFLOPS "with sparsity".
    h100 = get_gpu("h100-sxm")
    assert 2 * h100.bf16_flops == pytest.approx(1979e12, rel=1e-3)
    assert h100.fp8_flops is not None
    assert 2 * h100.fp8_flops == pytest.approx(3958e12, rel=1e-3)
    # B200: HGX page prints 4.5 PFLOPS BF16 and 9 PFLOPS FP8 with sparsity.
    b200 = get_gpu("b200")
    assert (b200.bf16_flops, b200.fp8_flops, b200.int8_ops) == (2.25e15, 4.5e15, 4.5e15)


def test_h200_is_h100_sxm_silicon_with_more_memory() -> None:
    h100, h200 = get_gpu("h100-sxm"), get_gpu("h200")
    assert (h200.bf16_flops, h200.fp8_flops, h200.int8_ops) == (
        h100.bf16_flops,
        h100.fp8_flops,
        h100.int8_ops,
    )
    assert (h200.memory_bytes, h200.memory_bandwidth_bytes_per_s) == (141e9, 4.8e12)


def test_a100_variants_differ_only_in_memory_and_link() -> None:
    assert get_gpu("a100-40gb-sxm").memory_bandwidth_bytes_per_s == 1.555e12
    assert get_gpu("a100-80gb-sxm").memory_bandwidth_bytes_per_s == 2.039e12
    assert get_gpu("a100-40gb-pcie").memory_bandwidth_bytes_per_s == 1.555e12
    assert get_gpu("a100-80gb-pcie").memory_bandwidth_bytes_per_s == 1.935e12
    assert get_gpu("a100-80gb-sxm").link_bandwidth_bytes_per_s == 300e9
    assert get_gpu("a100-80gb-pcie").link_bandwidth_bytes_per_s == 32e9
    assert {get_gpu(k).bf16_flops for k in gpu_names() if k.startswith("a100")} == {312e12}


def test_pcie_only_cards_use_pcie_link() -> None:
    for key in ("l40s", "rtx-4090", "a100-40gb-pcie", "a100-80gb-pcie"):
        assert get_gpu(key).link_bandwidth_bytes_per_s == 32e9  # PCIe 4.0 x16, one way
    assert get_gpu("h100-pcie").link_bandwidth_bytes_per_s == 64e9  # PCIe 5.0 x16, one way


def test_nvl_cards_talk_over_their_bridge_and_wider_groups_over_pcie() -> None:
    # nvidia-smi's names resolve; the datasheets' sparse rates halve to the dense ones.
    h100_nvl, h200_nvl = get_gpu("NVIDIA H100 NVL"), get_gpu("NVIDIA H200 NVL")
    assert 2 * h100_nvl.bf16_flops == pytest.approx(1671e12, rel=1e-3)
    assert (h100_nvl.memory_bytes, h100_nvl.memory_bandwidth_bytes_per_s) == (94e9, 3.9e12)
    assert (h200_nvl.memory_bytes, h200_nvl.memory_bandwidth_bytes_per_s) == (141e9, 4.8e12)
    assert h100_nvl.link(2) == ("nvlink", 300e9)  # the pair's bridge, 600 GB/s both ways
    assert h100_nvl.link(4) == h100_nvl.link(8) == ("pcie", 64e9)
    assert h200_nvl.link(4) == ("nvlink", 450e9)  # the four-way bridge
    assert h200_nvl.link(2) == ("nvlink", 150e9)  # a pair uses its links to the one peer
    assert h200_nvl.link(8) == ("pcie", 64e9)
    # Cards without a bridge keep their one link at every size.
    assert get_gpu("h100-sxm").link(8) == ("nvlink", 450e9)
    assert get_gpu("l4").link(2) == ("pcie", 32e9)
    with pytest.raises(ValueError, match="bridge_size must be 0"):
        _gpu(bridge_size=1, bridge_bandwidth_bytes_per_s=1e9)
    with pytest.raises(ValueError, match="bridge_bandwidth_bytes_per_s"):
        _gpu(bridge_size=2)


def test_the_all_reduce_follows_the_link_of_the_tp_group() -> None:
    # Beyond the bridge vLLM falls back to NCCL over PCIe: slower per call and per byte, so a
    # prefill's all-reduces cost more at TP 4 than at TP 2 on an H100 NVL; not on an H100 SXM.
    model = get_model("llama-3.1-70b")

    def all_reduce(gpu: str, tp: int) -> float:
        roofline = RooflineModel(model, get_gpu(gpu), tensor_parallel_size=tp)
        return roofline.communication_time(2048)

    assert all_reduce("h100-nvl", 4) > 2 * all_reduce("h100-nvl", 2)
    assert all_reduce("h100-sxm", 4) < 2 * all_reduce("h100-sxm", 2)


def test_a_pipeline_hand_off_beyond_the_bridge_crosses_pcie() -> None:
    model = get_model("llama-3.1-8b")

    def send(tp: int, pp: int) -> float:
        roofline = RooflineModel(
            model, get_gpu("h100-nvl"), tensor_parallel_size=tp, pipeline_parallel_size=pp
        )
        return roofline.pipeline_send_time(2048)

    # TP 1 × PP 2 fits the bridged pair; TP 2 × PP 2 spans two pairs over PCIe.
    assert send(2, 2) > 3 * send(1, 2)


def test_gddr_ecc_keeps_a_sixteenth_of_the_memory_from_cuda() -> None:
    # vLLM logs total_gpu_memory 44.31-44.39 GiB on an L40S; nvidia-smi shows 23,034 MiB of an
    # L4's 24 GiB; vLLM logs 79.11-79.33 GiB on 80 GB HBM cards, which carry ECC beside the data.
    l40s = reported_memory_bytes(get_gpu("l40s")) / 2**30
    assert l40s == pytest.approx(44.35, rel=0.01)
    assert reported_memory_bytes(get_gpu("l4")) / 2**20 < 23_034
    assert reported_memory_bytes(get_gpu("h100-sxm")) / 2**30 == pytest.approx(79.2, rel=0.01)
    # The RTX 4090 exactly as its vLLM run reported it (shared/data/vllm_real_runs).
    assert reported_memory_bytes(get_gpu("rtx-4090")) == 25_250_627_584
    with pytest.raises(ValueError, match="ecc_reserved_fraction"):
        _gpu(ecc_reserved_fraction=1.0)


def test_tensor_flops_by_dtype() -> None:
    gpu = get_gpu("h100-sxm")
    assert gpu.tensor_flops("bf16") == gpu.tensor_flops("fp16") == 989.4e12
    assert gpu.tensor_flops("FP8") == 1978.9e12
    assert gpu.tensor_flops("int8") == 1978.9e12
    assert gpu.tensor_flops("fp32") == 494.7e12  # TF32 tensor cores


def test_a100_has_no_fp8() -> None:
    with pytest.raises(ValueError, match="A100 80GB SXM has no fp8 tensor cores; use dtype bf16"):
        get_gpu("a100").tensor_flops("fp8")


def test_tensor_flops_rejects_int4_and_unknown_dtypes() -> None:
    with pytest.raises(ValueError, match="int4 is a weight storage format"):
        get_gpu("h100").tensor_flops("int4")
    with pytest.raises(ValueError, match="unknown dtype"):
        get_gpu("h100").tensor_flops("fp4")


def test_fp32_without_tf32_rate_raises() -> None:
    with pytest.raises(ValueError, match="has no tf32"):
        _gpu().tensor_flops("fp32")


@pytest.mark.parametrize(
    ("alias", "key"),
    [
        ("H100", "h100-sxm"),
        ("h100_sxm", "h100-sxm"),
        ("H100-SXM5-80GB", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("H100 PCIe", "h100-pcie"),
        ("a100", "a100-80gb-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("L40S", "l40s"),
        ("B200", "b200"),
        ("H200", "h200"),
    ],
)
def test_get_gpu_aliases(alias: str, key: str) -> None:
    assert get_gpu(alias) is GPU_CATALOG[key]


def test_get_gpu_unknown_suggests_closest() -> None:
    with pytest.raises(ValueError, match=r"unknown gpu 'h10'; did you mean 'h100-sxm'\? known: "):
        get_gpu("h10")
    with pytest.raises(ValueError, match="unknown gpu 'tpu-v5'; known: a100-40gb-sxm"):
        get_gpu("tpu-v5")


def test_weight_stream_time_llama_8b_on_h100() -> None:
    # Decode at batch 1 is bound by streaming every weight once: 16.06 GB / 3.35 TB/s ≈ 4.8 ms.
    seconds = get_model("llama-3.1-8b").weight_bytes("bf16") / (
        get_gpu("h100-sxm").memory_bandwidth_bytes_per_s
    )
    assert seconds == pytest.approx(16.06e9 / 3.35e12, rel=0.02)
    assert seconds == pytest.approx(4.8e-3, rel=0.02)


def test_user_gpu_from_keywords() -> None:
    gpu = _gpu(fp8_flops=2e15, hourly_cost_usd=2.5)
    assert gpu.tensor_flops("fp8") == 2e15
    assert gpu.hourly_cost_usd == 2.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.memory_bytes = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_bandwidth_bytes_per_s", -1e12),
        ("memory_bytes", 0),
        ("bf16_flops", math.nan),
        ("link_bandwidth_bytes_per_s", math.inf),
        ("fp8_flops", -1.0),
        ("int8_ops", 0.0),
        ("hourly_cost_usd", -2.0),
        ("memory_bytes", True),
        ("memory_bytes", "80e9"),
    ],
)
def test_invalid_gpu_field_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"GPU 'custom': {field} must be a positive"):
        _gpu(**{field: value})


def test_gpu_needs_a_name() -> None:
    with pytest.raises(ValueError, match="GPU name"):
        _gpu(name=" ")
