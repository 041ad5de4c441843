"""The records file of a live run, read back to resume it.

:func:`live.replay.replay` appends one line per finished request to ``records.jsonl`` (the
:meth:`~sim.engine.request.Record.as_row` of its record, as JSON). :func:`read_records` reads
such a file back, checking that it belongs to the workload, and :func:`rewrite_records` replaces
it by the lines a resumed run keeps. Which records are kept is :data:`KEPT_STATUSES`.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.engine.request import Record, Request, RequestStatus


class RecordsFileError(ValueError):
    """A records file cannot be resumed from: missing, corrupt, or not this workload's."""


class RecordsFileWarning(UserWarning):
    """Something in a records file was ignored (a half-written last line)."""


#: Statuses whose records a resumed run keeps. ``rejected`` is a 400/413/422 from the server: the
#: same request would be rejected again, so sending it again would only repeat the answer.
KEPT_STATUSES: frozenset[RequestStatus] = frozenset({RequestStatus.OK, RequestStatus.REJECTED})


@dataclass(frozen=True)
class RecordsFile:
    """The records of an earlier (interrupted) run, read back for a resume.

    ``lines_by_id`` holds each record's line exactly as it was written, so a resumed run keeps
    the records it reuses byte for byte. ``note`` says what was ignored (empty when nothing was).
    """

    path: Path
    records_by_id: dict[int, Record]
    lines_by_id: dict[int, str]
    note: str = ""

    def kept(self) -> dict[int, Record]:
        """The records a resumed run reuses: those with a status in :data:`KEPT_STATUSES`."""
        return {i: r for i, r in self.records_by_id.items() if r.status in KEPT_STATUSES}


def requests_digest(requests: Sequence[Request]) -> str:
    """SHA-256 of the requests (every field), to tell whether a records file is theirs."""
    text = repr(sorted(requests, key=lambda r: r.request_id))
    return hashlib.sha256(text.encode()).hexdigest()


def _record_from_row(row: object) -> Record:
    """A record from one parsed line of ``records.jsonl`` (as :meth:`Record.as_row` wrote it)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    try:
        request_id = row["request_id"]
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            raise ValueError(f"request_id must be an integer, got {request_id!r}")
        record = Record(
            request_id,
            float(row["arrival_s"]),
            int(row["prompt_tokens"]),
            int(row["output_tokens"]),
            scheduled_s=float(row["scheduled_s"]),
            first_token_s=float(row["first_token_s"]),
            finish_s=float(row["finish_s"]),
            cached_tokens=int(row["cached_tokens"]),
            num_preemptions=int(row["num_preemptions"]),
            replica_id=int(row["replica_id"]),
            status=RequestStatus(row["status"]),
            error=str(row["error"]),
            priority=int(row.get("priority", 0)),  # absent from files written before it was
            token_times_s=[float(t) for t in row.get("token_times_s") or ()],
        )
    except KeyError as exc:
        raise ValueError(f"field {exc.args[0]!r} is missing") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    return record


def read_records(path: Path, requests: Sequence[Request]) -> RecordsFile:
    """Read ``records.jsonl`` of an earlier run of ``requests`` for a resume.

    A half-written last line (the run was killed while writing it) is ignored with a
    :class:`RecordsFileWarning`; its request is simply sent again. Raises
    :class:`RecordsFileError` when the file is missing, a line before the last is not a record,
    a request id appears twice, or a record's request id or prompt length is not in ``requests``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordsFileError(f"no records file at {path}: nothing to resume") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordsFileError(f"cannot read {path}: {exc}") from None
    by_id = {r.request_id: r for r in requests}
    lines = text.split("\n")
    # A file that ends with a newline splits into its lines plus one empty string.
    complete = text.endswith("\n") or not text
    records: dict[int, Record] = {}
    raw: dict[int, str] = {}
    line_of: dict[int, int] = {}
    note = ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)
        try:
            record = _record_from_row(json.loads(line))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            if last and not complete:
                note = f"{path}:{number}: ignored a half-written last line (the run was killed?)"
                warnings.warn(note, RecordsFileWarning, stacklevel=2)
                continue
            raise RecordsFileError(f"{path}:{number}: not a record: {exc}") from None
        request_id = record.request_id
        request = by_id.get(request_id)
        if request is None:
            raise RecordsFileError(
                f"{path}:{number}: request id {request_id} is not in this workload's "
                f"{len(by_id)} requests: the records are from another workload"
            )
        if record.prompt_tokens != request.prompt_tokens:
            raise RecordsFileError(
                f"{path}:{number}: request {request_id} has {record.prompt_tokens} prompt "
                f"tokens, this workload's has {request.prompt_tokens}: the records are from "
                "another workload"
            )
        if request_id in records:
            raise RecordsFileError(
                f"{path}:{number}: request id {request_id} already has a record (line "
                f"{line_of[request_id]}): not a file one servesim run wrote"
            )
        records[request_id] = record
        raw[request_id] = line
        line_of[request_id] = number
    return RecordsFile(path, records, raw, note)


def rewrite_records(path: Path, lines: Sequence[str]) -> None:
    """Replace ``path`` by exactly ``lines`` (atomically: a kill leaves the old or new file)."""
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as file:
        file.writelines(line + "\n" for line in lines)
        file.flush()
        os.fsync(file.fileno())
    partial.replace(path)
