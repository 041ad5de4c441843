"""Collectives under tensor, expert and pipeline parallelism: which all-reduce kernel vLLM
runs for a message among a TP group, what one call costs, and the fixed costs of an
expert-parallel all-to-all and of a pipeline stage's hand-off. The roofline
(sim/engine/latency.py RooflineModel) adds them to a step's time.
"""

from __future__ import annotations

#: vLLM's all-reduces, by the kernel it runs for a message (:func:`allreduce_kernel`): the fixed
#: seconds of one call inside vLLM's CUDA graphs, the fraction of the TP group's link bandwidth
#: (GPU.link) at which the bytes each GPU moves go, and the kernel's own ceiling on that rate
#: (:func:`allreduce_seconds`).
#: * ``one-shot`` and ``two-shot``: vLLM's own all-reduce (csrc/custom_all_reduce.cuh). A
#:   one-shot reads every peer's whole message, (tp − 1)·S bytes per GPU, from each peer at up
#:   to 230 GB/s; a two-shot reduces a 1/tp share and gathers the others', 2·(tp − 1)/tp·S, at
#:   up to 205 GB/s; neither faster than 0.89 of the link. The fixed times, and the one-shot's
#:   link share, are a least-squares fit to vLLM's own communicator benchmark on four H100 SXM
#:   (benchmarks/kernels/benchmark_device_communicators.py, CUDA graphs, bf16 messages of
#:   0.5–4 MiB: ca_1stage 10–38 µs, ca_2stage 17–43 µs, within 1 and 3 µs of this model; two
#:   runs that agree within 1 µs, https://github.com/vllm-project/vllm/pull/24111 and
#:   https://github.com/vllm-project/vllm/pull/24532): one-shot 6.6 µs, two-shot 12.6 µs (its
#:   slope there is its own 205 GB/s, under 0.89 of NVLink). The
#:   ceilings are the slopes of the same kernels' time over 1–8 MiB outside CUDA graphs, where
#:   the slope is free of launch costs: a pair of H100s reads its peer at 230 GB/s
#:   (https://github.com/sgl-project/sglang/pull/2904), a pair of A100s at 206–223 GB/s and
#:   four A100s run the two-shot at 199 GB/s (https://github.com/sgl-project/sglang/pull/2688;
#:   the H100 benchmark above gives the two-shot 211). An H100 pair's one-shot of 74 KB takes
#:   7.0 µs and of 1.7 MB 13.0 µs in a CUDA graph elsewhere (FlagGems-vllm PR 773,
#:   https://github.com/flagos-ai/FlagGems-vllm/pull/773, a TensorRT-LLM kernel): 271 GB/s
#:   between them; this model gives 6.9 and 14.0 µs. vLLM's benchmark above times a pair's
#:   one-shot of 0.5 MiB at 7 µs (to the microsecond), this model at 8.9. vLLM runs its
#:   two-shot up to its buffer's end even where NCCL would be faster, so the cost drops where
#:   NCCL takes over (four H100s: 74 µs just under 8 MiB, 48 µs at 8 MiB, which Vidur's NCCL
#:   table of four H100s measures at 47); the two-shot's rate past 4 MiB is not measured.
#: * ``multimem``: PyTorch's symmetric-memory all-reduce through NVLink SHARP, which vLLM
#:   (0.10.2 on, ``VLLM_ALLREDUCE_USE_SYMM_MEM`` on by default) runs on bf16 activations among
#:   6 or 8 GPUs on an NVSwitch that multicasts (GPU.nvlink_multicast) for messages past what
#:   its own all-reduce takes there on Hopper (512 KiB at six, 256 KiB at eight) up to 64 MiB
#:   (vllm/distributed/device_communicators/all_reduce_utils.py, SM 9.0; a B200 is given the
#:   same limits, though vLLM's for SM 10.0 differ): 8 µs plus S at 0.47 of NVLink is within 8%
#:   of vLLM's benchmark of it on SM 9.0 (the table of https://github.com/vllm-project/vllm/
#:   pull/42324, read as eight GPUs) at every size from 0.5 to 64 MiB (11–320 µs). Between 8
#:   and 32 or 64 MiB vLLM runs the same library's two-shot at two or four GPUs; the NCCL ring
#:   below costs about what it does (four H100s: 25–29 µs at 3–4 MiB against NCCL's 37–39,
#:   both ~390–450 GB/s of ring bytes past that), so it stands in for it.
#: * ``nccl``: the rest: messages past the 8 MiB buffer of vLLM's own all-reduce, more than two
#:   GPUs over PCIe, where vLLM turns its own off ("not supported on more than two PCIe-only
#:   GPUs"), cards without peer access (GPU.peer_to_peer) and TP degrees its own does not
#:   support (other than 2, 4, 6, 8). 19.4–24.2 µs at 4–32 KB inside a CUDA graph among four
#:   GPUs behind a PCIe switch (sglang-V100 PR 2, https://github.com/haohervchb/sglang-V100/
#:   pull/2; the warning in https://github.com/vllm-project/vllm/issues/13719), and a ring's
#:   bytes at the link's rate (tests/test_parallelism.py holds large messages to Vidur's NCCL
#:   profile of an H100 DGX).
ALLREDUCE_KERNELS: dict[str, tuple[float, float, float]] = {
    "one-shot": (6.6e-6, 0.89, 230e9),  # the ceiling per peer read
    "two-shot": (12.6e-6, 0.89, 205e9),
    "multimem": (8e-6, 0.47, float("inf")),
    "nccl": (20e-6, 1.0, float("inf")),
}
#: The TP degrees vLLM's own all-reduce supports, and the largest message its buffer takes.
CUSTOM_ALLREDUCE_SIZES = (2, 4, 6, 8)
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20
#: The largest message vLLM sends through the multicast all-reduce on Hopper (SM 9.0), and
#: the largest its own all-reduce takes before it, by TP degree.
MULTIMEM_MAX_BYTES = 64 * 2**20
MULTIMEM_FROM_BYTES = {6: 512 * 2**10, 8: 256 * 2**10}
#: An expert-parallel dispatch or combine: an NCCL all-to-all (or vLLM's all-to-all kernels),
#: not vLLM's own all-reduce; NCCL's fixed time in a CUDA graph (ALLREDUCE_KERNELS["nccl"]).
ALL_TO_ALL_LATENCY_S = 20e-6

#: A pipeline stage's hand-off: an NCCL send outside the CUDA graphs, 11 µs for 4 KB between
#: two GPUs of an H100 DGX and 16 µs on an A100 DGX (medians of Vidur's send_recv profiles,
#: shared/data/vidur/profiling/network/{h100,a100}_dgx/send_recv.csv, 2,048 fp16 elements).
#: The H100's figure on every NVLink GPU; over PCIe, NCCL's ``nccl`` latency above.
PIPELINE_SEND_LATENCY_S = 11e-6


def allreduce_kernel(
    interconnect: str,
    tensor_parallel_size: int,
    peer_to_peer: bool = True,
    message_bytes: float = 0.0,
    multicast: bool = False,
) -> str:
    """The all-reduce vLLM runs among ``tensor_parallel_size`` GPUs for a message of
    ``message_bytes`` (ALLREDUCE_KERNELS): its own one-shot at two GPUs and for small
    messages (under 512 KiB at up to four GPUs, under 256 KiB at six or eight, as
    csrc/custom_all_reduce.cuh picks), its two-shot past that, the multicast all-reduce in
    place of the two-shot on a ``multicast`` NVSwitch (bf16 activations only: the caller
    passes False for fp16), and NCCL where its own cannot run."""
    tp = tensor_parallel_size
    nvlink = interconnect == "nvlink"
    wide = multicast and nvlink and peer_to_peer and tp in MULTIMEM_FROM_BYTES
    if wide and MULTIMEM_FROM_BYTES[tp] <= message_bytes <= MULTIMEM_MAX_BYTES:
        return "multimem"
    own = peer_to_peer and tp in CUSTOM_ALLREDUCE_SIZES and (nvlink or tp == 2)
    if not own or message_bytes >= CUSTOM_ALLREDUCE_MAX_BYTES:
        return "nccl"
    if tp == 2 or message_bytes < (512 if tp <= 4 else 256) * 2**10:
        return "one-shot"
    return "two-shot"


def allreduce_seconds(
    kernel: str,
    tensor_parallel_size: int,
    message_bytes: float,
    link_bytes_per_s: float,
    fixed_s: float | None = None,
) -> float:
    """One all-reduce of ``message_bytes`` among ``tensor_parallel_size`` GPUs by ``kernel``
    (ALLREDUCE_KERNELS) on a link of ``link_bytes_per_s`` (GPU.link): the kernel's fixed time
    (``fixed_s`` in its place where given) plus the bytes each GPU moves, at the kernel's share
    of the link or its own ceiling, whichever is lower. A one-shot reads every peer's whole
    message, (tp − 1)·S, from each peer at once; the multicast all-reduce sends S through the
    switch; a two-shot and NCCL's ring move 2·(tp − 1)/tp·S."""
    tp = tensor_parallel_size
    fixed, link_share, ceiling = ALLREDUCE_KERNELS[kernel]
    if fixed_s is not None:
        fixed = fixed_s
    if kernel == "one-shot":
        moved = (tp - 1) * message_bytes
        ceiling *= tp - 1
    elif kernel == "multimem":
        moved = message_bytes
    else:
        moved = 2.0 * (tp - 1) / tp * message_bytes
    return fixed + moved / min(link_share * link_bytes_per_s, ceiling)
