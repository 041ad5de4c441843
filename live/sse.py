"""Incremental decoding of a Server-Sent Events stream, for :mod:`live.client`.

:class:`SseDecoder` turns the bytes of a streamed response, split anywhere, into
:class:`SseEvent` objects; anything an OpenAI-compatible server would never send raises
:class:`MalformedSseError`, which :func:`live.client.stream_completion` turns into an ERROR
record. :func:`excerpt` shortens offending text for the messages here and in
:mod:`live.stream_faults`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: How much of an offending text is quoted in an error message.
MAX_EXCERPT_CHARS = 300
#: A line longer than this is not SSE from an inference server; stop buffering it.
_MAX_LINE_BYTES = 16 * 1024 * 1024

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff"


class MalformedSseError(ValueError):
    """The stream is not the SSE/JSON an OpenAI-compatible server sends.

    The message reads ``malformed SSE line 7: <reason>: '<the offending text>'``.
    """

    def __init__(self, line_number: int, reason: str, text: str) -> None:
        super().__init__(f"malformed SSE line {line_number}: {reason}: {excerpt(text)!r}")
        self.line_number = line_number


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched Server-Sent Event: its data (lines joined by newlines) and event type.

    ``line_number`` is the 1-based line of the stream where the event's first data line was.
    """

    data: str
    event_type: str
    line_number: int


class SseDecoder:
    """Incremental Server-Sent Events parser (WHATWG HTML, "Parsing an event stream").

    Bytes may be split anywhere (inside a line, a UTF-8 sequence, or a CRLF pair); lines end
    with CRLF, LF or CR; lines starting with ``:`` are comments (keep-alives); ``data`` lines of
    one event are joined with ``\\n``; a blank line dispatches the event; an event left without
    a blank line at the end of the stream is discarded, as the standard says.

    Stricter than the standard in one way: a field other than ``data``, ``event``, ``id`` or
    ``retry`` raises :class:`MalformedSseError` instead of being ignored, because an inference
    server never sends one, and silently skipping a line we do not understand could hide tokens.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip_leading_lf = False  # the previous chunk ended with CR, maybe half a CRLF
        self._data_lines: list[str] = []
        self._event_type = ""
        self._first_data_line = 0
        self.line_number = 0  # lines completed so far

    def feed(self, data: bytes) -> list[SseEvent]:
        """Parse the next bytes of the stream; return the events they complete."""
        if not data:
            return []
        if self._skip_leading_lf and data[:1] == b"\n":
            data = data[1:]
        self._skip_leading_lf = False
        self._buffer += data
        events: list[SseEvent] = []
        start = 0
        for match in _LINE_END.finditer(self._buffer):
            line = bytes(self._buffer[start : match.start()])
            start = match.end()
            if match.group() == b"\r" and start == len(self._buffer):
                self._skip_leading_lf = True
            event = self._line(line)
            if event is not None:
                events.append(event)
        del self._buffer[:start]
        if len(self._buffer) > _MAX_LINE_BYTES:
            raise MalformedSseError(
                self.line_number + 1,
                f"line longer than {_MAX_LINE_BYTES} bytes",
                self._buffer[:MAX_EXCERPT_CHARS].decode("utf-8", errors="replace"),
            )
        return events

    def _line(self, raw: bytes) -> SseEvent | None:
        self.line_number += 1
        line = raw.decode("utf-8", errors="replace")
        if self.line_number == 1 and line.startswith(_BOM):
            line = line[1:]
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            if not self._data_lines:
                self._first_data_line = self.line_number
            self._data_lines.append(value)
        elif name == "event":
            self._event_type = value
        elif name not in ("id", "retry"):
            raise MalformedSseError(self.line_number, f"unknown field {name!r}", line)
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._data_lines:
            self._event_type = ""
            return None
        event = SseEvent("\n".join(self._data_lines), self._event_type, self._first_data_line)
        self._data_lines = []
        self._event_type = ""
        return event


def excerpt(text: str) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to :data:`MAX_EXCERPT_CHARS`."""
    text = " ".join(text.split())
    if len(text) <= MAX_EXCERPT_CHARS:
        return text
    return text[:MAX_EXCERPT_CHARS] + "…"
