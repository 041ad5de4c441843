"""Exact token ids for a workload's prompts, so the server's prefix cache hits where sim's does.

A prompt is a list of segments ``(source_id, num_tokens)`` (see :mod:`sim.engine.request`); the
tokens of a source are a deterministic pseudo-random stream. Streams are generated in fixed chunks
of :data:`CHUNK_TOKENS`, each from its own generator seeded by ``(source_id, chunk index)``, so the
first *n* tokens of a source are the same whatever length was asked for: equal segments give
equal token ids, and vLLM's block hashes (over token ids) match the simulator's block keys.

A ``salt`` enters every seed: two runs of the same workload with different salts share no
tokens, so the second does not hit what the first left in the server's prefix cache (the
simulator starts every run with an empty cache). Within one run the sharing is unchanged.

In a multi-turn session a later turn's prompt contains an earlier answer. The client then sends
the tokens the server actually generated for that answer (``outputs``), as a chat client sends
the assistant's reply back, so the server can hit the blocks it cached while decoding.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

from sim.engine.request import Request

CHUNK_TOKENS = 64
_MASK_64 = (1 << 64) - 1


def fresh_salt() -> int:
    """A salt no earlier run used (with overwhelming probability): for a live run's prompts,
    recorded in its ``records.meta.json`` and summary so the run can be sent again exactly."""
    return secrets.randbits(31) + 1


class PromptTokens:
    """Token ids for segments: deterministic, in ``[first_id, vocab_size)``.

    ``first_id`` keeps clear of the low ids where tokenizers put special tokens (BOS, EOS, pad).
    """

    def __init__(
        self, vocab_size: int, *, first_id: int = 3, cache_chunks: int = 4096, salt: int = 0
    ) -> None:
        if vocab_size <= first_id + 1:
            raise ValueError(f"vocab_size: must be > {first_id + 1}, got {vocab_size}")
        if salt < 0:
            raise ValueError(f"salt: must be >= 0, got {salt}")
        self.salt = salt
        self.vocab_size = vocab_size
        self.first_id = first_id
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._cache_chunks = cache_chunks

    def _chunk(self, source_id: int, index: int) -> np.ndarray:
        key = (source_id, index)
        chunk = self._cache.get(key)
        if chunk is None:
            # Salt 0 keeps the seeds (and so the tokens) of runs from before salts existed.
            seed = [source_id & _MASK_64, index, *([self.salt] if self.salt else [])]
            rng = np.random.default_rng(seed)
            chunk = rng.integers(self.first_id, self.vocab_size, CHUNK_TOKENS, dtype=np.int64)
            self._cache[key] = chunk
            if len(self._cache) > self._cache_chunks:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return chunk

    def stream(self, source_id: int, num_tokens: int) -> list[int]:
        """The first ``num_tokens`` tokens of a source."""
        num_chunks = -(-num_tokens // CHUNK_TOKENS)
        parts = [self._chunk(source_id, i) for i in range(num_chunks)]
        return np.concatenate(parts)[:num_tokens].tolist() if parts else []

    def prompt_ids(
        self, request: Request, outputs: Mapping[int, Sequence[int]] | None = None
    ) -> list[int]:
        """The request's prompt as token ids.

        ``outputs`` maps an output source id to the tokens the server generated for it; where a
        segment names one, those tokens are used (topped up from the stream if the answer was
        shorter than planned, e.g. after an error).
        """
        ids: list[int] = []
        for source, length in request.segments:
            actual = outputs.get(source) if outputs else None
            if actual is None:
                ids.extend(self.stream(source, length))
                continue
            taken = list(actual[:length])
            if len(taken) < length:
                taken.extend(self.stream(source, length)[len(taken) :])
            ids.extend(taken)
        assert len(ids) == request.prompt_tokens
        return ids
