"""The calibrated step-time model's coefficients: the numbers a calibration profile holds.

A module of its own, apart from :mod:`sim.engine.latency`, because it is data that pydantic reads
(the profile file's schema): latency's step-time code is compiled by mypyc
(tools/build_native.py), which keeps annotations only as runtime classes, and pydantic needs
the written ones (``float | None``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CalibratedCoefficients:
    """Coefficients of the measured (calibrated) iteration-time model, in seconds.

    ``frontend_overhead_s`` is not part of a step: it is the time a request spends in the
    server's front end (HTTP, validation, streaming the first token back), which a client sees
    in TTFT and end-to-end latency.

    ``per_streamed_token_s`` is not part of a step either: the host time the front end spends
    on each token it streams (vLLM's API server detokenizes it, frames it as a server-sent
    event and writes it; a client on the same host parses it). One front-end thread serves a
    replica, so under load the tokens of a step wait for those of earlier steps (see
    :meth:`sim.engine.replica.Replica.delivered_s`). 0: tokens reach the client as the step ends.

    ``per_arrival_s``: what receiving a request costs an engine that is not idle: the server's
    host work to take it in (parse, validate, build the request, hash its blocks) shares the
    engine's core, so the steps in progress take that much longer. A request that finds the
    engine idle pays it in its TTFT, inside ``frontend_overhead_s`` as lone prefills measure it.
    Measured by benchmarks/step_context.py ("arrivals that wait") and fitted from loaded steps
    during which requests arrived. 0: arrivals cost the engine nothing.
    """

    step_overhead_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float
    per_prefill_pair_s: float
    frontend_overhead_s: float = 0.0
    # Context tokens the backend reads once for several requests (BatchShape
    # .shared_context_tokens). None: as dear as any context token (profiles measured without
    # shared prefixes, and those written before this term existed).
    per_shared_context_token_s: float | None = None
    # The least time the linear layers take in a step, however few tokens it computes: reading
    # their weights from memory once (the roofline's memory-bound side; the per-token terms are
    # its compute-bound side). 0: the purely linear model of profiles fitted before this term.
    linear_floor_s: float = 0.0
    per_streamed_token_s: float = 0.0
    per_arrival_s: float = 0.0

    def __post_init__(self) -> None:
        if self.per_shared_context_token_s is None:
            object.__setattr__(self, "per_shared_context_token_s", self.per_context_token_s)
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {value}")

    @property
    def shared_context_s(self) -> float:
        """``per_shared_context_token_s``, never None once constructed."""
        value = self.per_shared_context_token_s
        assert value is not None
        return value
