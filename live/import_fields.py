"""What every benchmark importer shares: the import error, the imported run, and field readers.

:mod:`live.importers` is the entry point; :mod:`live.import_vllm_bench` and
:mod:`live.import_guidellm` each read one tool's format with the readers here, so that a bad
field is reported the same way whichever tool wrote the file: the file, the field (as a dotted
path with indices) and the offending value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

_T = TypeVar("_T")


class BenchmarkImportError(ValueError):
    """A benchmark result file that cannot be imported; the message names the file and the
    field (or line) at fault."""


@dataclass(frozen=True)
class ImportedRun:
    """One benchmark run read from a file, in the record schema shared by sim/ and live/.

    ``records`` has exactly :data:`sim.engine.request.RECORD_COLUMNS`, one row per request.
    ``itl_s`` holds every inter-token latency of the completed requests, flattened, when the
    file records them (vLLM does; GuideLLM does not, and then it is empty and
    ``metadata["itl_known"]`` is False). ``metadata`` carries what the file says about the run
    (model, backend, request rate, concurrency, date, duration, number of prompts …) and how
    the import filled what the file lacks.
    """

    format: str
    path: str
    records: pd.DataFrame
    itl_s: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)


def require_object(value: object, path: Path, where: str) -> dict[str, Any]:
    """``value`` if it is a JSON object; otherwise raise, naming ``where`` it was found."""
    if not isinstance(value, dict):
        raise BenchmarkImportError(
            f"{path}: {where} must be a JSON object, got {type(value).__name__}"
        )
    return value


def choose_index(count: int, requested: int | None, path: Path, what: str) -> int:
    """Which of ``count`` runs in a file to import: ``requested``, or the only one.

    Raises when the file holds several and none was requested, or the index is out of range.
    """
    if requested is None:
        if count != 1:
            raise BenchmarkImportError(
                f"{path}: the file holds {count} {what}; pick one with --benchmark 0…{count - 1} "
                "or a name, or import them all with --benchmark all (benchmark_index=0…"
                f"{count - 1} in Python)"
            )
        return 0
    if not 0 <= requested < count:
        raise BenchmarkImportError(
            f"{path}: benchmark_index={requested} is out of range; the file holds {count} {what}"
        )
    return requested


def read_number(value: object, path: Path, where: str) -> float:
    """``value`` as a float; a bool, a string or null is an error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BenchmarkImportError(f"{path}: {where} must be a number, got {value!r}")
    return float(value)


def read_numbers(value: object, path: Path, where: str) -> list[float]:
    """``value`` as a list of floats (each checked by :func:`read_number`)."""
    if not isinstance(value, list):
        raise BenchmarkImportError(f"{path}: {where} must be a list of numbers, got {value!r}")
    return [read_number(v, path, f"{where}[{k}]") for k, v in enumerate(value)]


def read_count(value: object, path: Path, where: str) -> int:
    """``value`` as a non-negative int; an integral float (``3.0``) counts as one."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BenchmarkImportError(f"{path}: {where} must be a non-negative integer, got {value!r}")
    return value


def optional_reader(
    read: Callable[[object, Path, str], _T], path: Path, where: str
) -> Callable[[dict[str, Any], str, str], _T | None]:
    """A reader of ``mapping[key]`` that gives None for a missing or null entry."""

    def read_optional(mapping: dict[str, Any], key: str, parent: str) -> _T | None:
        value = mapping.get(key)
        if value is None:
            return None
        dotted = ".".join(part for part in (where, parent, key) if part)
        return read(value, path, f"field {dotted!r}")

    return read_optional
