"""Writing a run's tables and documents to a directory (the only file output of ``sim``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import pandas as pd


def write_outputs(
    out_dir: str | Path,
    tables: dict[str, pd.DataFrame],
    documents: dict[str, Any],
    fmt: Literal["parquet", "csv"] = "parquet",
) -> list[Path]:
    """Tables as ``NAME.parquet`` (or ``.csv``) and documents as ``NAME.json``; the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        path = out / f"{name}.{fmt}"
        if fmt == "parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
        written.append(path)
    for name, document in documents.items():
        path = out / f"{name}.json"
        path.write_text(json_text(document), encoding="utf-8")
        written.append(path)
    return written


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None: strict JSON has no NaN (a rate over
    no time, the latency of no completed request), and parsers other than Python's refuse it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def json_text(document: Any) -> str:
    """``document`` as indented strict JSON (see :func:`json_safe`), with a final newline."""
    return json.dumps(json_safe(document), indent=2, allow_nan=False) + "\n"


class TableWriter:
    """A table written in chunks as they come (Parquet row groups, or CSV rows appended), so
    a run need not hold it whole. The first chunk fixes the Parquet schema; a text column
    that is empty in it (all None) is typed as text."""

    def __init__(self, path: str | Path, fmt: Literal["parquet", "csv"] = "parquet") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fmt = fmt
        self._parquet: Any = None
        self._schema: Any = None
        self._started = False

    def write(self, frame: pd.DataFrame) -> None:
        """Append ``frame``'s rows."""
        if self.fmt == "csv":
            frame.to_csv(self.path, index=False, mode="a" if self._started else "w")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            if self._parquet is None:
                schema = pa.Schema.from_pandas(frame, preserve_index=False)
                for i, field in enumerate(schema):
                    if pa.types.is_null(field.type):
                        schema = schema.set(i, pa.field(field.name, pa.string()))
                self._schema = schema
                self._parquet = pq.ParquetWriter(self.path, schema)
            table = pa.Table.from_pandas(frame, schema=self._schema, preserve_index=False)
            self._parquet.write_table(table)
        self._started = True

    def close(self, empty: pd.DataFrame | None = None) -> Path:
        """Finish the file (``empty``, a table with the columns, if nothing was written)."""
        if not self._started and empty is not None:
            self.write(empty)
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        return self.path
