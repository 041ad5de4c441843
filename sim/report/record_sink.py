"""Where a run's finished records go: kept for one table at the end, or streamed.

A run of a few hundred thousand requests keeps its records and builds one table when it is
over (:class:`KeptRecords`). A run of millions cannot: :class:`StreamedRecords` turns every
:data:`CHUNK_RECORDS` finished records into a table, folds it into the summary's statistics
(:class:`~sim.report.summary.RecordStats`: exact percentiles up to a million values, a t-digest
past that) and appends it to ``records.parquet`` (or ``.csv``), so memory does not grow with the
number of requests. Streamed records are in the order requests ended, each chunk sorted by
request id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pandas as pd

from sim.engine.request import RECORD_COLUMNS, Record
from sim.report import sketch
from sim.report.outputs import TableWriter
from sim.report.summary import SLO, RecordStats, records_frame, token_times_frame

#: Records a stream gathers before it writes them and folds them into the statistics.
CHUNK_RECORDS = 100_000
#: Runs of more requests than this stream their records unless told otherwise (a kept record
#: and its share of the table cost about 1 KB).
STREAM_ABOVE = 1_000_000


class KeptRecords:
    """Every record, kept until the run is over; one table, in request-id order."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, record: Record) -> None:
        """A request that has its status."""
        self.records.append(record)

    def tables(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """The records and their token times (None if none were recorded), by request id."""
        self.records.sort(key=lambda r: r.request_id)
        return records_frame(self.records), token_times_frame(self.records)


class StreamedRecords:
    """Records written and summarised in chunks as requests end, then let go.

    With ``out_dir`` the chunks go to ``records.<fmt>`` there (and token times, if recorded,
    to ``token_times.<fmt>``); without it only the statistics remain. ``on_chunk`` runs after
    each chunk (the simulation drains its inter-token latencies there).
    """

    def __init__(
        self,
        slo: SLO,
        out_dir: str | Path | None = None,
        fmt: Literal["parquet", "csv"] = "parquet",
        *,
        chunk_records: int | None = None,
        on_chunk: Callable[[], None] | None = None,
    ) -> None:
        """``chunk_records`` defaults to :data:`CHUNK_RECORDS`."""
        self.stats = RecordStats(slo, exact_limit=sketch.EXACT_LIMIT)
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.fmt = fmt
        self.chunk_records = CHUNK_RECORDS if chunk_records is None else chunk_records
        self.on_chunk = on_chunk
        self.writer = None if self.out_dir is None else TableWriter(self.out_path("records"), fmt)
        self.token_writer: TableWriter | None = None
        self._buffer: list[Record] = []

    def out_path(self, name: str) -> Path:
        """Where table ``name`` is written."""
        assert self.out_dir is not None
        return self.out_dir / f"{name}.{self.fmt}"

    def add(self, record: Record) -> None:
        """A request that has its status: written with its chunk when the chunk is full."""
        self._buffer.append(record)
        if len(self._buffer) >= self.chunk_records:
            self.flush()

    def flush(self) -> None:
        """Write and summarise the records gathered since the last chunk."""
        if self._buffer:
            self._buffer.sort(key=lambda r: r.request_id)
            frame = records_frame(self._buffer)
            self.stats.add(frame)
            if self.writer is not None:
                self.writer.write(frame)
                token_times = token_times_frame(self._buffer)
                if token_times is not None:
                    if self.token_writer is None:
                        self.token_writer = TableWriter(self.out_path("token_times"), self.fmt)
                    self.token_writer.write(token_times)
            self._buffer = []
        if self.on_chunk is not None:
            self.on_chunk()

    def close(self) -> list[Path]:
        """Write what is left and finish the files; their paths."""
        self.flush()
        written = []
        if self.writer is not None:
            written.append(self.writer.close(pd.DataFrame(columns=list(RECORD_COLUMNS))))
        if self.token_writer is not None:
            written.append(self.token_writer.close())
        return written
