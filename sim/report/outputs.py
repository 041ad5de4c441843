"""Writing a run's tables and documents to a directory (the only file output of ``sim``)."""

from __future__ import annotations

import json
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
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
