"""How a failed streaming request is classified and described, for :mod:`live.client`.

Every fault :func:`live.client.stream_completion` can meet (an exception from httpx or from
decoding the stream, an HTTP error answer, an error object in a body or in the stream) becomes
a :class:`~sim.engine.request.RequestStatus` and a one-line message quoting what the server
said. Nothing here does I/O.
"""

from __future__ import annotations

import email.utils
import json
import math
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

import httpx

from live.sse import MAX_EXCERPT_CHARS, MalformedSseError, excerpt
from sim.engine.request import RequestStatus

#: Status codes that mean "the server will never accept this request as sent" (vLLM answers 400
#: for a prompt longer than ``max_model_len``); they end a request as REJECTED, not ERROR.
REJECTED_HTTP_STATUSES: frozenset[int] = frozenset({400, 413, 422})


def exception_fault(
    exc: Exception, url: str, num_tokens: int, timeout_s: float, read_timeout_s: float
) -> tuple[RequestStatus, str]:
    """The status and message for an exception that ended a request after ``num_tokens``.

    The whole-request deadline (:class:`TimeoutError`), read and write timeouts → TIMEOUT;
    connect failures, pool timeouts, dropped connections, other httpx errors, malformed SSE and
    any unforeseen exception → ERROR.
    """
    match exc:
        case TimeoutError():
            return (
                RequestStatus.TIMEOUT,
                f"deadline of {timeout_s:g} s exceeded after {num_tokens} tokens",
            )
        case httpx.ConnectTimeout():
            return RequestStatus.ERROR, f"connection timeout: {_describe(exc)}"
        case httpx.PoolTimeout():
            return (
                RequestStatus.ERROR,
                f"no free connection in the client's pool (raise httpx.Limits): {_describe(exc)}",
            )
        case httpx.ReadTimeout():
            return (
                RequestStatus.TIMEOUT,
                f"read timeout: no bytes for {read_timeout_s:g} s after {num_tokens} tokens",
            )
        case httpx.WriteTimeout():
            return RequestStatus.TIMEOUT, f"write timeout: request not sent within {timeout_s:g} s"
        case httpx.ConnectError():
            return RequestStatus.ERROR, _connect_error_message(exc, url)
        case httpx.RemoteProtocolError():
            return (
                RequestStatus.ERROR,
                f"connection closed by server after {num_tokens} tokens: {_describe(exc)}",
            )
        case httpx.HTTPError():
            return (
                RequestStatus.ERROR,
                f"{type(exc).__name__} after {num_tokens} tokens: {_describe(exc)}",
            )
        case MalformedSseError():
            return RequestStatus.ERROR, str(exc)
        case _:
            # A fault nobody foresaw (or a bug here) must still end the request with a record.
            return (
                RequestStatus.ERROR,
                f"unexpected {type(exc).__name__} after {num_tokens} tokens: {_describe(exc)}",
            )


def http_error_fault(
    code: int, reason_phrase: str, body: bytes, retry_after_s: float | None
) -> tuple[RequestStatus, str]:
    """The status and message for an HTTP error answer: REJECTED for the codes in
    :data:`REJECTED_HTTP_STATUSES`, ERROR otherwise; the message quotes the body's error."""
    message = error_message_from_body(body)
    head = f"{code} {reason_phrase or _phrase(code)}"
    if retry_after_s is not None:
        head += f" (retry after {retry_after_s:g} s)"
    status = RequestStatus.REJECTED if code in REJECTED_HTTP_STATUSES else RequestStatus.ERROR
    return status, f"{head}: {message}" if message else head


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds or an HTTP-date.

    A date in the past gives 0; an absent or unparseable header gives None.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


def error_message(payload: Mapping[str, Any]) -> str:
    """The message of an OpenAI/vLLM/FastAPI error object, or "" if there is none."""
    error = payload.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    for key in ("message", "detail"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return value
        if value:
            return json.dumps(value)[:MAX_EXCERPT_CHARS]
    return ""


def error_message_from_body(body: bytes) -> str:
    """The error message of a response body: its JSON error object's, else an excerpt."""
    text = body.decode("utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return excerpt(text)
    message = error_message(payload) if isinstance(payload, dict) else ""
    return message or excerpt(text)


def _connect_error_message(exc: httpx.ConnectError, url: str) -> str:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return f"connection failed, DNS lookup: {url}: {cause}"
        cause = cause.__cause__ or cause.__context__
    return f"connection refused: {url}: {_describe(exc)}"


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "HTTP error"
