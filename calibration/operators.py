"""Operator profiler: time one decoder layer's operators with torch, without a serving engine.

For a GPU node where no vLLM can be launched (or before one is), this builds the modules of one
decoder layer of the scenario's model at its per-GPU shapes — heads, KV heads and the MLP split
over ``tensor_parallel_size`` as vLLM shards them — with random weights, and times each with
CUDA events (``time.perf_counter`` around a synchronised call on the CPU). It writes the same two
tables :mod:`calibration.operator_sources` reads from the public sources, so one reader and one
fit (:mod:`calibration.operator_tables`) serve both:

``layers.csv`` — LLMServingSim's columns ``layer_name,input,kv_cache,latency(ns)``
    One row per module and token count: ``input`` tokens of one sequence at once (a prefill of
    ``input`` tokens, or the linear layers of a decode step of ``input`` sequences, which see the
    same ``(input, hidden)`` activation). Modules: embedding, input_layernorm, q/k/v_proj, rope,
    attn (causal ``scaled_dot_product_attention`` over the whole sequence), o_proj,
    post_layernorm, gate/up_proj, act_fn (SiLU × up), down_proj, final_layernorm, lm_head.
    ``kv_cache`` is always 0 (the prefill sweep).
``decode_attention.csv`` — the kernel benchmark's columns ``batch_size,kv_len,latency_us``
    One layer's decode attention: ``batch_size`` queries of one token, each over ``kv_len``
    cached keys and values (grouped-query, dense per-sequence tensors: the same bytes a paged
    kernel reads when all sequences have the same length).
``meta.json``
    Model, shapes, TP, dtype, device name, torch version, repetitions and the date.

What it does not time: the all-reduces between TP shards (one GPU runs one shard here), the
sampler, and the engine's CPU-side scheduling; a fitted ``step_overhead_s`` is GPU-only. Random
weights time the same as trained ones (no data-dependent control flow in these kernels).
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from calibration.profile import now_iso
from sim.catalog.architecture import ModelArch
from sim.files import DocumentError, read_document

if TYPE_CHECKING:
    import torch

LAYERS_FILE = "layers.csv"
DECODE_FILE = "decode_attention.csv"
META_FILE = "meta.json"

#: The dtypes the profiler can build weights in (scenario spelling → torch attribute).
#: Llama's RMSNorm epsilon (the value does not change the kernel's time).
_RMS_EPS = 1e-5
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class ProfilerGrid:
    """The shapes to time. ``max_decode_tokens`` bounds ``batch × kv_len`` (the KV tensors'
    size) so that the largest decode points fit in memory."""

    prefill_tokens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    repetitions: int = 10
    warmup: int = 3
    max_decode_tokens: int = 2**21

    def __post_init__(self) -> None:
        for name in ("prefill_tokens", "decode_batches", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ValueError(f"{name}: must be a non-empty list of integers >= 1")
        if self.repetitions < 1 or self.warmup < 0:
            raise ValueError("repetitions: must be >= 1 (and warmup >= 0)")

    @classmethod
    def for_gpu(cls, max_model_len: int, max_num_seqs: int) -> ProfilerGrid:
        """Prefills of 16..min(max_model_len, 8192) on a 1-2-3 geometric grid, decode batches
        1..max_num_seqs in powers of two, contexts 128..min(max_model_len, 32768)."""
        top = min(max_model_len, 8192)
        prefill = sorted({n for k in range(4, 14) for n in (2**k, 3 * 2 ** (k - 1)) if n <= top})
        batches = _powers_of_two(1, max_num_seqs)
        contexts = _powers_of_two(128, min(max_model_len, 32_768))
        return cls(tuple(prefill), batches, contexts)

    @classmethod
    def quick(cls) -> ProfilerGrid:
        """A few small shapes: seconds on a CPU for a tiny model (tests, smoke runs)."""
        return cls((16, 32, 64, 128, 256), (1, 2, 4, 8), (64, 256), repetitions=3, warmup=1)


def _powers_of_two(low: int, high: int) -> tuple[int, ...]:
    values = [low]
    while values[-1] * 2 <= high:
        values.append(values[-1] * 2)
    if values[-1] != high and high > low:
        values.append(high)
    return tuple(values)


@dataclass
class OperatorTables:
    """What one profiling run measured, as the tables the fit reads."""

    layers: pd.DataFrame
    decode_attention: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def write(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.layers.to_csv(directory / LAYERS_FILE, index=False)
        self.decode_attention.to_csv(directory / DECODE_FILE, index=False)
        (directory / META_FILE).write_text(json.dumps(self.meta, indent=2) + "\n")
        return directory


def read_tables(directory: str | Path) -> OperatorTables:
    """Tables written by :meth:`OperatorTables.write`; ValueError naming what is missing."""
    directory = Path(directory)
    missing = [n for n in (LAYERS_FILE, DECODE_FILE, META_FILE) if not (directory / n).is_file()]
    if missing:
        raise ValueError(
            f"{directory}: not a profiled operator table directory (missing {', '.join(missing)}); "
            "write one with `servesim calibrate --operators torch`"
        )
    try:
        meta = read_document(directory / META_FILE, format="json", expect=dict)
    except DocumentError as exc:
        raise ValueError(str(exc)) from None
    return OperatorTables(
        pd.read_csv(directory / LAYERS_FILE), pd.read_csv(directory / DECODE_FILE), meta
    )


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; ValueError for a missing GPU."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA GPU; use cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device: must be auto, cpu or cuda[:N]; got {device!r}")
    return device


class _Timer:
    """Median seconds of ``fn()`` over repetitions: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: str, repetitions: int, warmup: int) -> None:
        import torch

        self.torch = torch
        self.cuda = device.startswith("cuda")
        self.repetitions = repetitions
        self.warmup = warmup

    def __call__(self, fn: Callable[[], object]) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        if self.cuda:
            torch.cuda.synchronize()
            pairs = []
            for _ in range(self.repetitions):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize()
            return float(statistics.median(s.elapsed_time(e) for s, e in pairs)) / 1e3
        times = []
        for _ in range(self.repetitions):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return statistics.median(times)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` of shape (tokens, heads, head_dim)."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass(frozen=True)
class _LayerShapes:
    """One decoder layer's per-GPU sizes under tensor parallelism, as vLLM shards them."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    num_layers: int

    @classmethod
    def of(cls, model: ModelArch, tp: int) -> _LayerShapes:
        """Heads, KV heads (at least one), the MLP and the vocabulary split over ``tp`` GPUs."""
        return cls(
            heads=model.num_attention_heads // tp,
            kv_heads=max(1, model.num_key_value_heads // tp),
            head_dim=model.head_dim,
            hidden=model.hidden_size,
            intermediate=math.ceil(model.intermediate_size / tp),
            vocab=math.ceil(model.vocab_size / tp),
            num_layers=model.num_layers,
        )

    def as_meta(self) -> dict[str, int]:
        """The shapes as ``meta.json`` records them."""
        return {
            "heads_per_gpu": self.heads,
            "kv_heads_per_gpu": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden": self.hidden,
            "intermediate_per_gpu": self.intermediate,
            "vocab_per_gpu": self.vocab,
            "num_layers": self.num_layers,
        }


class _LayerOperators:
    """Random weights of one decoder layer, the embedding and the LM head at per-GPU shapes,
    and the calls to time on them. Every tensor comes from one generator seeded with 0, drawn in
    a fixed order (the weights, then each shape's inputs as they are asked for)."""

    def __init__(self, shapes: _LayerShapes, device: str, dtype: torch.dtype) -> None:
        import torch

        self.torch = torch
        self.shapes = shapes
        self.device = device
        self.dtype = dtype
        self.generator = torch.Generator(device="cpu").manual_seed(0)
        heads, kv_heads, head_dim = shapes.heads, shapes.kv_heads, shapes.head_dim
        hidden, inter, vocab = shapes.hidden, shapes.intermediate, shapes.vocab
        self.w_q = self._weight(heads * head_dim, hidden)
        self.w_k = self._weight(kv_heads * head_dim, hidden)
        self.w_v = self._weight(kv_heads * head_dim, hidden)
        self.w_o = self._weight(hidden, heads * head_dim)
        self.w_gate, self.w_up = self._weight(inter, hidden), self._weight(inter, hidden)
        self.w_down = self._weight(hidden, inter)
        self.w_lm = self._weight(vocab, hidden)
        self.embedding = self._weight(vocab, hidden)
        self.norm = torch.ones(hidden, device=device, dtype=dtype)

    def _weight(self, rows: int, cols: int) -> torch.Tensor:
        w = self.torch.randn(rows, cols, generator=self.generator) / math.sqrt(cols)
        return w.to(device=self.device, dtype=self.dtype)

    def _random(self, *size: int) -> torch.Tensor:
        """Normal values of ``size`` in the layer's dtype on its device."""
        values = self.torch.randn(*size, generator=self.generator)
        return values.to(device=self.device, dtype=self.dtype)

    def layer(self, n: int) -> dict[str, Callable[[], object]]:
        """Each module's call on ``n`` tokens (LLMServingSim's module names), its inputs made
        once."""
        torch = self.torch
        import torch.nn.functional as F  # noqa: N812 (torch's own convention)

        heads, kv_heads, head_dim = self.shapes.heads, self.shapes.kv_heads, self.shapes.head_dim
        hidden, device, dtype = self.shapes.hidden, self.device, self.dtype
        w_q, w_k, w_v, w_o = self.w_q, self.w_k, self.w_v, self.w_o
        w_gate, w_up, w_down, w_lm = self.w_gate, self.w_up, self.w_down, self.w_lm
        embedding, norm = self.embedding, self.norm
        ids = torch.randint(0, self.shapes.vocab, (n,), generator=self.generator).to(device)
        x = self._random(n, hidden)
        q = F.linear(x, w_q).view(n, heads, head_dim)
        k = F.linear(x, w_k).view(n, kv_heads, head_dim)
        v = F.linear(x, w_v).view(n, kv_heads, head_dim)
        angle = torch.rand(n, 1, head_dim, generator=self.generator).to(device=device)
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        # (1, heads, n, head_dim) for SDPA; grouped-query keys shared by enable_gqa.
        qa, ka, va = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        attn_out = self._random(n, heads * head_dim)
        gate = F.linear(x, w_gate)
        up = F.linear(x, w_up)
        act = F.silu(gate) * up
        return {
            "embedding": lambda: F.embedding(ids, embedding),
            "input_layernorm": lambda: F.rms_norm(x, (hidden,), norm, _RMS_EPS),
            "q_proj": lambda: F.linear(x, w_q),
            "k_proj": lambda: F.linear(x, w_k),
            "v_proj": lambda: F.linear(x, w_v),
            "rope": lambda: (_rotate(q, cos, sin), _rotate(k, cos, sin)),
            "attn": lambda: F.scaled_dot_product_attention(
                qa, ka, va, is_causal=True, enable_gqa=kv_heads != heads
            ),
            "o_proj": lambda: F.linear(attn_out, w_o),
            "post_layernorm": lambda: F.rms_norm(x, (hidden,), norm, _RMS_EPS),
            "gate_proj": lambda: F.linear(x, w_gate),
            "up_proj": lambda: F.linear(x, w_up),
            "act_fn": lambda: F.silu(gate) * up,
            "down_proj": lambda: F.linear(act, w_down),
            "final_layernorm": lambda: F.rms_norm(x, (hidden,), norm, _RMS_EPS),
            "lm_head": lambda: F.linear(x, w_lm),
        }

    def decode_attention(self, batch: int, context: int) -> Callable[[], object]:
        """One layer's attention for ``batch`` one-token queries over ``context`` keys each."""
        import torch.nn.functional as F  # noqa: N812 (torch's own convention)

        heads, kv_heads, head_dim = self.shapes.heads, self.shapes.kv_heads, self.shapes.head_dim
        q1 = self.torch.randn(batch, heads, 1, head_dim, generator=self.generator)
        kc = self.torch.randn(batch, kv_heads, context, head_dim, generator=self.generator)
        q1 = q1.to(device=self.device, dtype=self.dtype)
        kc = kc.to(device=self.device, dtype=self.dtype)
        vc = kc.clone()
        return lambda: F.scaled_dot_product_attention(q1, kc, vc, enable_gqa=kv_heads != heads)


def _check_buildable(model: ModelArch, dtype: str, tp: int) -> None:
    """ValueError for a dtype the profiler has no weights for, or a TP that splits no heads."""
    if dtype not in TORCH_DTYPES:
        raise ValueError(
            f"dtype: the profiler builds {', '.join(TORCH_DTYPES)} weights, not {dtype!r} "
            "(quantized kernels need the serving engine: calibrate with --launch)"
        )
    if tp < 1 or model.num_attention_heads % tp:
        raise ValueError(
            f"tensor_parallel_size: {tp} does not divide {model.name}'s "
            f"{model.num_attention_heads} attention heads"
        )


def _time_operators(
    operators: _LayerOperators,
    grid: ProfilerGrid,
    timer: _Timer,
    progress: Callable[[int, int, str], None] | None,
) -> tuple[list[tuple[str, int, int, float]], list[tuple[int, int, float]]]:
    """The ``layers.csv`` rows (module, tokens, 0, ns) of every token count of the grid, then the
    ``decode_attention.csv`` rows (batch, context, µs) of every decode point that fits in
    ``grid.max_decode_tokens``; ``progress(done, total, what)`` after each."""
    inputs = sorted(set(grid.prefill_tokens) | set(grid.decode_batches))
    decode_points = [
        (b, c)
        for b in grid.decode_batches
        for c in grid.decode_contexts
        if b * c <= grid.max_decode_tokens
    ]
    total = len(inputs) + len(decode_points)
    done = 0
    rows: list[tuple[str, int, int, float]] = []
    with operators.torch.inference_mode():
        for n in inputs:
            for name, operation in operators.layer(n).items():
                rows.append((name, n, 0, timer(operation) * 1e9))
            done += 1
            if progress is not None:
                progress(done, total, f"layer at {n} tokens")
        decode_rows: list[tuple[int, int, float]] = []
        for batch, context in decode_points:
            seconds = timer(operators.decode_attention(batch, context))
            decode_rows.append((batch, context, seconds * 1e6))
            done += 1
            if progress is not None:
                progress(done, total, f"decode attention {batch} × {context}")
    return rows, decode_rows


def _run_meta(
    model: ModelArch, shapes: _LayerShapes, tp: int, dtype: str, device: str, grid: ProfilerGrid
) -> dict[str, Any]:
    """``meta.json``: what was profiled, where, with which torch, and when."""
    import torch

    device_name = (
        torch.cuda.get_device_name(torch.device(device))
        if device.startswith("cuda")
        else platform.processor() or platform.machine()
    )
    return {
        "model": model.name,
        "tensor_parallel_size": tp,
        "dtype": dtype,
        "device": device,
        "device_name": device_name,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "shapes": shapes.as_meta(),
        "grid": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(grid).items()},
        "created": now_iso(),
    }


def profile_operators(
    model: ModelArch,
    *,
    tensor_parallel_size: int = 1,
    dtype: str = "bf16",
    device: str = "auto",
    grid: ProfilerGrid | None = None,
    threads: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> OperatorTables:
    """Time one decoder layer's operators (and the embedding, final norm and LM head) of
    ``model`` at its per-GPU shapes under ``tensor_parallel_size``; see the module docstring.

    ``grid`` defaults to :meth:`ProfilerGrid.for_gpu` on a GPU and :meth:`ProfilerGrid.quick`
    on a CPU. ``threads`` sets torch's intra-op threads (vLLM's CPU backend uses one core per
    rank). Raises ValueError for a dtype or TP the profiler cannot build.
    """
    import torch

    tp = tensor_parallel_size
    _check_buildable(model, dtype, tp)
    device = resolve_device(device)
    if grid is None:
        grid = (
            ProfilerGrid.for_gpu(model.max_position_embeddings, 256)
            if device.startswith("cuda")
            else ProfilerGrid.quick()
        )
    if threads is not None:
        torch.set_num_threads(threads)
    shapes = _LayerShapes.of(model, tp)
    operators = _LayerOperators(shapes, device, getattr(torch, TORCH_DTYPES[dtype]))
    timer = _Timer(device, grid.repetitions, grid.warmup)
    rows, decode_rows = _time_operators(operators, grid, timer, progress)
    return OperatorTables(
        pd.DataFrame(rows, columns=["layer_name", "input", "kv_cache", "latency(ns)"]),
        pd.DataFrame(decode_rows, columns=["batch_size", "kv_len", "latency_us"]),
        _run_meta(model, shapes, tp, dtype, device, grid),
    )


def check_tables_match(tables: OperatorTables, model: ModelArch, tensor_parallel_size: int) -> None:
    """ValueError naming the field when profiled tables are for another model or TP."""
    meta = tables.meta
    if meta.get("model") != model.name:
        raise ValueError(
            f"model: the tables were profiled for {meta.get('model')!r}, the scenario is "
            f"{model.name!r}"
        )
    if meta.get("tensor_parallel_size") != tensor_parallel_size:
        raise ValueError(
            f"engine.tensor_parallel_size: the tables were profiled at TP="
            f"{meta.get('tensor_parallel_size')}, the scenario has {tensor_parallel_size}"
        )


def sizes_summary(values: Sequence[int]) -> str:
    """``16..2048 (12 points)`` for a sorted list of sizes."""
    values = sorted(values)
    return f"{values[0]}..{values[-1]} ({len(values)} points)" if values else "none"
