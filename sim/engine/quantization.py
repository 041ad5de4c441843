"""How quantized weights compute: the dtype a scenario's linear layers multiply in, and the
bitsandbytes kernels' measured slowdown. The roofline (:mod:`sim.engine.latency`) prices a
step with these; the scenario checks them when it is loaded.
"""

from __future__ import annotations

import warnings

from sim.catalog.hardware import GPU

#: How quantized weights are computed with (scenario ``quantization``):
#:
#: ``auto``          fp8/int8 weights run W8A8 at the GPU's fp8/int8 tensor rate where it has one,
#:                   else weight-only (with a warning: an A100 has no fp8 tensor cores, so fp8
#:                   weights save memory and bandwidth there, not compute); int4 is weight-only.
#: ``weight_only``   W8A16/W4A16 (AWQ, GPTQ, Marlin): the weights are streamed at their own width
#:                   and multiplied at the 16-bit rate.
#: ``w8a8``          fp8 or int8 activations too; an error where the GPU lacks that rate.
#: ``bitsandbytes``  ``load_in_8bit`` (LLM.int8(), dtype int8) or NF4 (dtype int4), as
#:                   transformers users load it: memory as the dtype says, but the kernels
#:                   dequantize on the fly and run slower than 16-bit ones at the same shapes.
QUANTIZATION_METHODS: tuple[str, ...] = ("auto", "weight_only", "w8a8", "bitsandbytes")

#: bitsandbytes' slowdown of the linear layers against the same model in fp16, as measured by
#: "Your int8 Quantization Is 2.5× Slower Than fp16"
#: (https://earino.github.io/applied-deep-learning/site/blog/11_int8_is_slower.html): a 494M
#: decoder on a T4, 5.05 ms/example in fp16, 12.65 with LLM.int8() (2.5×), 7.92 with NF4 and
#: double quantization (1.57×). Applied to the fp16 time of the linear layers (their weights
#: are dequantized to 16 bits before each multiply, so no bandwidth is saved either).
BITSANDBYTES_SLOWDOWN = {"int8": 2.5, "int4": 1.57}


class QuantizationWarning(UserWarning):
    """A quantization setting that runs differently from what its name suggests."""


def compute_dtype(dtype: str, quantization: str, gpu: GPU) -> str:
    """The dtype the linear layers' multiplies run in; ValueError naming ``quantization``."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization: must be one of {', '.join(QUANTIZATION_METHODS)}; got {quantization!r}"
        )
    quantized = dtype in ("fp8", "int8", "int4")
    if quantization == "bitsandbytes":
        if dtype not in BITSANDBYTES_SLOWDOWN:
            raise ValueError(
                "quantization: bitsandbytes loads int8 (load_in_8bit) or int4 (NF4) weights; "
                f"set dtype: int8 or int4, not {dtype}"
            )
        return "bf16"
    if quantization == "weight_only":
        if not quantized:
            raise ValueError(
                f"quantization: weight_only needs quantized weights (dtype fp8, int8 or int4), "
                f"not {dtype}"
            )
        return "bf16"
    has_rate = {"fp8": gpu.fp8_flops, "int8": gpu.int8_ops}
    if quantization == "w8a8":
        if dtype not in has_rate:
            raise ValueError(f"quantization: w8a8 needs dtype fp8 or int8, not {dtype}")
        if has_rate[dtype] is None:
            raise ValueError(
                f"quantization: {gpu.name} has no {dtype} tensor cores, so w8a8 cannot run "
                "there; use weight_only (or auto)"
            )
        return dtype
    # auto
    if dtype in has_rate:
        if has_rate[dtype] is not None:
            return dtype
        warnings.warn(
            f"{gpu.name} has no {dtype} tensor cores: {dtype} weights run weight-only there "
            "(dequantized to 16 bits), saving memory and bandwidth but not compute",
            QuantizationWarning,
            stacklevel=3,
        )
    return "bf16"
