"""Values in a trace: token counts, session ids, times and timestamps, checked one by one.

Each parser accepts a CSV cell (a string) or a JSON value and raises a
:class:`~sim.workload.trace_text.TraceFormatError` naming the line and column when the value is
not what the format needs. Integers are exact up to the int64 range; times keep integers as
integers so that differences of large timestamps are exact.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import date

from sim.workload.trace_text import TraceSource

_INT64_MAX = 2**63 - 1

_TIMESTAMP_PATTERN = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
)
_UNIX_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _integer(
    source: TraceSource, line: int, column: str, value: object, minimum: int, what: str
) -> int:
    """An integer >= ``minimum``: an int, an integral float or a string of one ("12", "12.0")."""
    number: int | None = None
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            # Tools that wrote the column through a float dtype give "12.0".
            try:
                as_float = float(value)
            except ValueError:
                as_float = math.nan
            if math.isfinite(as_float) and as_float.is_integer():
                number = int(as_float)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if number is None or number < minimum or number > _INT64_MAX:
        raise source.error(line, column, f"expected {what}, got {value!r}")
    return number


def parse_count(source: TraceSource, line: int, column: str, value: object) -> int:
    """A token count: an integer >= 1."""
    return _integer(source, line, column, value, 1, "a positive integer")


def parse_session_id(source: TraceSource, line: int, column: str, value: object) -> int:
    """A session id: an integer >= -1, where -1 means unknown."""
    return _integer(source, line, column, value, -1, "an integer >= -1 (-1 = unknown)")


def parse_priority(source: TraceSource, line: int, column: str, value: object) -> int:
    """A vLLM request priority: any integer in int64 (lower is served first)."""
    return _integer(source, line, column, value, -_INT64_MAX, "an integer (lower is served first)")


def parse_time(source: TraceSource, line: int, column: str, value: object) -> int | float:
    """A finite number; ints stay ints so that differences of large timestamps are exact."""
    number: int | float | None = None
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                number = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    if number is None or (isinstance(number, float) and not math.isfinite(number)):
        raise source.error(line, column, f"expected a finite number, got {_short(value)}")
    if isinstance(number, int) and abs(number) > _INT64_MAX:
        # Beyond any real clock; and differences of such ints overflow a float.
        raise source.error(
            line, column, f"expected a number within ±{_INT64_MAX}, got {_short(value)}"
        )
    return number


def parse_int_list(source: TraceSource, line: int, column: str, value: object) -> list[int]:
    """A JSON list of integers within the int64 range (block ids or token ids)."""
    if not isinstance(value, list) or not all(
        type(item) is int and abs(item) <= _INT64_MAX for item in value
    ):
        raise source.error(line, column, f"expected a list of integers, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=1024)
def _days_since_epoch(year: int, month: int, day: int) -> int:
    return date(year, month, day).toordinal() - _UNIX_EPOCH_ORDINAL


def parse_timestamp_ns(source: TraceSource, line: int, column: str, value: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fffffffff]`` as integer nanoseconds since 1970 (exact)."""
    match = _TIMESTAMP_PATTERN.fullmatch(value.strip())
    if match is None:
        raise source.error(
            line, column, f"expected a timestamp like '2023-11-16 18:15:46.6805900', got {value!r}"
        )
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        days = _days_since_epoch(int(year), int(month), int(day))
    except ValueError:
        raise source.error(line, column, f"not a valid date: {value!r}") from None
    if int(hour) > 23 or int(minute) > 59 or int(second) > 60:
        raise source.error(line, column, f"not a valid time of day: {value!r}")
    seconds = ((days * 24 + int(hour)) * 60 + int(minute)) * 60 + int(second)
    nanoseconds = int((fraction or "0").ljust(9, "0"))
    return seconds * 1_000_000_000 + nanoseconds
