"""Running one function over many items in worker processes, in order, with progress.

:func:`run_all` is how the planner evaluates candidates and a sweep runs its points: each
``function(shared, item)`` runs in a local process pool (or in this process with one worker),
and the results come back in the items' order whatever order the workers finish in.
:func:`collect` is the loop underneath, shared with other executors (a sweep on Ray): it
waits for each pending result in turn and reports ``progress(done, total)`` after each one.
Progress is a plain callback, so this module draws nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from functools import partial
from typing import TypeVar

P = TypeVar("P")
R = TypeVar("R")
S = TypeVar("S")
T = TypeVar("T")

#: ``progress(done, total)``: called after each result, ``done`` counting from 1.
Progress = Callable[[int, int], None]


def collect(
    pending: Sequence[P], result_of: Callable[[P], R], progress: Progress | None = None
) -> list[R]:
    """``result_of(p)`` for every ``p`` of ``pending``, in order, calling
    ``progress(done, len(pending))`` after each. An exception from ``result_of`` propagates."""
    results: list[R] = []
    for item in pending:
        results.append(result_of(item))
        if progress is not None:
            progress(len(results), len(pending))
    return results


def run_all(
    function: Callable[[S, T], R],
    shared: S,
    items: Sequence[T],
    *,
    workers: int = 2,
    progress: Progress | None = None,
) -> list[R]:
    """``[function(shared, item) for item in items]``, ``workers`` processes at a time (1 or
    fewer: in this process), reporting ``progress(done, total)`` as results arrive in order.

    ``function`` must be a top-level function (it is pickled to the workers, with ``shared``
    and each item). The first exception a call raises propagates, as from a plain loop.
    """
    if workers <= 1:
        return collect(items, partial(function, shared), progress)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(function, shared, item) for item in items]
        return collect(futures, _result, progress)


def _result(future: Future[R]) -> R:
    return future.result()
