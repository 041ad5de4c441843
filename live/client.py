"""Stream one request to an OpenAI-compatible server and timestamp every token it sends back.

This is the only place live/ touches HTTP. :func:`stream_completion` sends one streaming request
(``/v1/completions`` with exact token-id prompts, or ``/v1/chat/completions`` for servers that
offer only chat), reads the Server-Sent Events stream as it arrives, and returns a
:class:`StreamResult` whatever happened: every fault the network or the server can produce becomes
a :class:`~sim.engine.request.RequestStatus` and an error message, with the tokens received before
it kept. The one exception that escapes is :class:`asyncio.CancelledError`, because a cancelled
replay must stop; the partial result is handed to ``on_partial`` first.

No retries happen here: an open-loop replay sends each request once at its arrival time, and
retrying would change the load offered to the server. ``Retry-After`` is reported, not obeyed.

The steps of a request: :func:`_build_request` makes the POST, :func:`_exchange` reads the
answer (the SSE bytes decoded by :mod:`live.sse`, each event applied to a :class:`_StreamState`),
and :mod:`live.stream_faults` turns whatever went wrong into a status and a message.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from live.sse import MalformedSseError, SseDecoder, SseEvent, excerpt
from live.stream_faults import (
    REJECTED_HTTP_STATUSES,
    error_message,
    error_message_from_body,
    exception_fault,
    http_error_fault,
    parse_retry_after,
)
from sim.engine.request import RequestStatus

#: How much of an error body is read and quoted in an error message.
_MAX_ERROR_BODY_BYTES = 4096


@dataclass(slots=True)
class StreamResult:
    """What one streamed request produced, with client-side timestamps (``clock()`` values).

    ``token_times_s`` has one entry per output token: a chunk carrying *k* token ids gives *k*
    entries with the chunk's arrival time. When the server returns no ``token_ids`` (chat
    servers without ``return_token_ids``), each chunk with non-empty text counts as one token,
    ``output_token_ids`` stays empty, and ``note`` says so if ``usage.completion_tokens``
    disagrees with the count (byte-level tokens often stream as empty text, so counting text
    chunks undercounts; the times of uncounted tokens are unknown).

    A stream that ends normally with fewer tokens than ``max_tokens`` is still OK; compare
    :attr:`num_output_tokens` with the request's output length to see it.
    """

    send_s: float  # clock() just before the request was sent
    token_times_s: list[float]  # arrival clock() of every output token
    output_token_ids: list[int]  # from "token_ids" in each chunk; empty when the server omits them
    finish_s: float  # clock() when the stream ended ([DONE]) or failed; NaN if never sent
    prompt_tokens: int | None  # from the last usage the server reported
    completion_tokens: int | None
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, when reported
    status: RequestStatus
    error: str  # "" when ok
    http_status: int | None  # None when no response arrived
    retry_after_s: float | None  # parsed Retry-After on 429/503
    note: str = ""  # disagreements that are not errors (token count vs usage, early finish)

    @property
    def num_output_tokens(self) -> int:
        """How many output tokens arrived (the length of ``token_times_s``)."""
        return len(self.token_times_s)


async def stream_completion(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    prompt_token_ids: list[int],
    max_tokens: int,
    *,
    endpoint: Literal["completions", "chat"] = "completions",
    timeout_s: float = 600.0,
    read_timeout_s: float = 60.0,
    clock: Callable[[], float] = time.perf_counter,
    extra_body: Mapping[str, Any] | None = None,
    on_partial: Callable[[StreamResult], None] | None = None,
) -> StreamResult:
    """Send one streaming request and return what came back, token by token.

    ``endpoint="completions"`` posts the exact ``prompt_token_ids`` to ``/v1/completions``, so
    the server computes exactly the prompt the workload describes and its prefix cache hits
    where the simulator's does. ``endpoint="chat"`` (for servers that offer only chat) cannot
    send token ids: decoding is not available client side, so the ids are sent as
    space-separated text, which the server re-tokenizes into a different, longer prompt, wrapped
    in its chat template; neither exact prompt tokens nor prefix-cache matching is guaranteed.

    Both ask for ``ignore_eos`` and ``max_tokens`` (chat: also ``max_completion_tokens``) so the
    server generates the workload's output length, greedy sampling, usage in the final chunk,
    and ``return_token_ids`` (vLLM) so that tokens are counted exactly. ``extra_body`` is merged
    last and overrides any of these.

    Faults end the request with a status and keep the tokens received so far:

    - connect failures (refused, DNS, connect timeout) and client-pool timeouts → ERROR;
    - HTTP 400/413/422 → REJECTED with the server's message; 429, 5xx and other statuses →
      ERROR, with ``retry_after_s`` parsed from ``Retry-After`` on 429 and 503;
    - no bytes for ``read_timeout_s``, or the whole request past ``timeout_s`` → TIMEOUT;
    - a stream that ends without ``data: [DONE]``, malformed SSE or JSON, an error object in
      the stream, a connection dropped mid-stream → ERROR.

    Cancellation (Ctrl-C, an aborted run) is not swallowed: the result, with status CANCELLED
    and the tokens so far, is passed to ``on_partial`` (which must not raise) and then
    :class:`asyncio.CancelledError` is re-raised.

    Bad arguments (an unknown ``endpoint``, an ``extra_body`` that is not JSON) raise before
    anything is sent. The caller owns ``client``; its connection-pool limits must allow every
    request a replay keeps in flight, or requests wait for a connection (and fail after
    ``timeout_s``).
    """
    # Built before send_s so that a body that cannot be serialized is the caller's bug (it
    # raises) rather than a request that was "sent".
    url, request = _build_request(
        client,
        endpoint,
        base_url,
        model,
        prompt_token_ids,
        max_tokens,
        extra_body=extra_body,
        timeout_s=timeout_s,
        read_timeout_s=read_timeout_s,
    )
    stream = _StreamState(clock=clock, max_tokens=max_tokens)
    stream.send_s = clock()
    try:
        # The deadline is inside the CancelledError handler below: asyncio.timeout cancels the
        # task when it expires, and turns that cancellation into TimeoutError on exit.
        async with asyncio.timeout(timeout_s):
            await _exchange(client, request, stream)
    except asyncio.CancelledError:
        result = stream.end(RequestStatus.CANCELLED, f"cancelled after {stream.num_tokens} tokens")
        if on_partial is not None:
            on_partial(result)
        raise
    except Exception as exc:
        # Every other fault, the deadline included, ends the request with a status and a record.
        status, message = exception_fault(exc, url, stream.num_tokens, timeout_s, read_timeout_s)
        return stream.end(status, message)
    return stream.result()


@dataclass(slots=True)
class _StreamState:
    """What has arrived so far; turned into a :class:`StreamResult` however the request ends."""

    clock: Callable[[], float]
    max_tokens: int
    send_s: float = math.nan
    finish_s: float = math.nan
    token_times_s: list[float] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_text_tokens: int = 0  # tokens counted from text because the chunk had no token_ids
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    retry_after_s: float | None = None
    status: RequestStatus = RequestStatus.OK
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_times_s)

    def end(self, status: RequestStatus, error: str) -> StreamResult:
        """End the request now with a fault."""
        self.finish_s = self.clock()
        self.status = status
        self.error = error
        return self.result()

    def result(self) -> StreamResult:
        assert not math.isnan(self.finish_s), "result() before the stream ended"
        assert (self.status is RequestStatus.OK) == (self.error == ""), (self.status, self.error)
        return StreamResult(
            send_s=self.send_s,
            token_times_s=list(self.token_times_s),
            output_token_ids=list(self.output_token_ids),
            finish_s=self.finish_s,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            status=self.status,
            error=self.error,
            http_status=self.http_status,
            retry_after_s=self.retry_after_s,
            note="; ".join(self.notes),
        )

    def on_event(self, event: SseEvent, now_s: float) -> bool:
        """Apply one event that arrived at ``now_s``; True when the stream is over."""
        if event.data == "[DONE]":
            self.finish_s = now_s
            self._reconcile()
            return True
        try:
            chunk = json.loads(event.data)
        except json.JSONDecodeError as exc:
            raise MalformedSseError(
                event.line_number, f"invalid JSON ({exc.msg})", event.data
            ) from None
        if not isinstance(chunk, dict):
            raise MalformedSseError(event.line_number, "expected a JSON object", event.data)
        if event.event_type == "error" or chunk.get("error") is not None:
            return self._fail_in_stream(now_s, error_message(chunk) or excerpt(event.data))
        if chunk.get("object") == "error":
            return self._fail_in_stream(now_s, error_message(chunk) or excerpt(event.data))
        self._read_usage(chunk.get("usage"), event)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise MalformedSseError(event.line_number, "'choices' is not a list", event.data)
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedSseError(event.line_number, "a choice is not an object", event.data)
            self._read_choice(choice, event, now_s)
        if self.finish_reason in ("abort", "error"):
            return self._fail_in_stream(now_s, f"finish_reason {self.finish_reason!r}")
        return False

    def _read_choice(self, choice: dict[str, Any], event: SseEvent, now_s: float) -> None:
        token_ids = choice.get("token_ids")
        if token_ids is not None:
            if not isinstance(token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in token_ids
            ):
                raise MalformedSseError(
                    event.line_number, "'token_ids' is not a list of ints", event.data
                )
            self.output_token_ids.extend(token_ids)
            self.token_times_s.extend([now_s] * len(token_ids))
        elif _choice_text(choice):
            self.num_text_tokens += 1
            self.token_times_s.append(now_s)
        finish_reason = choice.get("finish_reason")
        if isinstance(finish_reason, str) and finish_reason:
            self.finish_reason = finish_reason

    def _read_usage(self, usage: object, event: SseEvent) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise MalformedSseError(event.line_number, "'usage' is not an object", event.data)
        self.prompt_tokens = _int_or(usage.get("prompt_tokens"), self.prompt_tokens)
        self.completion_tokens = _int_or(usage.get("completion_tokens"), self.completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = _int_or(details.get("cached_tokens"), self.cached_tokens)

    def _fail_in_stream(self, now_s: float, message: str) -> bool:
        self.finish_s = now_s
        self.status = RequestStatus.ERROR
        self.error = f"server error in stream after {self.num_tokens} tokens: {message}"
        return True

    def _reconcile(self) -> None:
        """Note where the counted tokens disagree with usage (not an error: the stream is OK)."""
        if self.num_text_tokens:
            self.notes.append(
                f"{self.num_text_tokens} tokens counted from text chunks (no token_ids)"
            )
        if self.completion_tokens is not None and self.completion_tokens != self.num_tokens:
            self.notes.append(
                f"usage reports {self.completion_tokens} completion tokens but "
                f"{self.num_tokens} arrived; token times cover only those"
            )
        if self.num_tokens < self.max_tokens:
            self.notes.append(
                f"finish_reason {self.finish_reason!r} after {self.num_tokens} of "
                f"max_tokens {self.max_tokens}"
            )


async def _exchange(
    client: httpx.AsyncClient, request: httpx.Request, stream: _StreamState
) -> None:
    """Send the request and read the response into ``stream`` (faults raise, or set status)."""
    response = await client.send(request, stream=True)
    try:
        stream.http_status = response.status_code
        if not response.is_success:
            await _http_error(response, stream)
            return
        content_type = response.headers.get("content-type", "")
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type and media_type != "text/event-stream":
            body = await _read_excerpt(response)
            message = error_message_from_body(body)
            stream.end(
                RequestStatus.ERROR,
                f"expected text/event-stream, got {content_type!r}: {message}",
            )
            return
        decoder = SseDecoder()
        async for data in response.aiter_bytes():
            now_s = stream.clock()
            for event in decoder.feed(data):
                if stream.on_event(event, now_s):
                    return
        stream.end(
            RequestStatus.ERROR, f"stream ended without [DONE] after {stream.num_tokens} tokens"
        )
    finally:
        await response.aclose()


async def _http_error(response: httpx.Response, stream: _StreamState) -> None:
    """End ``stream`` with the status and message of an HTTP error answer."""
    code = response.status_code
    body = await _read_excerpt(response)
    if code in (429, 503):
        stream.retry_after_s = parse_retry_after(response.headers.get("retry-after"))
    status, message = http_error_fault(code, response.reason_phrase, body, stream.retry_after_s)
    stream.end(status, message)


async def _read_excerpt(response: httpx.Response) -> bytes:
    """The first few KiB of a body: enough to quote, without reading an endless one."""
    body = bytearray()
    async for data in response.aiter_bytes():
        body += data
        if len(body) >= _MAX_ERROR_BODY_BYTES:
            break
    return bytes(body[:_MAX_ERROR_BODY_BYTES])


def base_url(url: str) -> str:
    """``http://host:port`` from a server URL that may end in ``/`` or ``/v1``."""
    return url.rstrip("/").removesuffix("/v1")


def _build_request(
    client: httpx.AsyncClient,
    endpoint: Literal["completions", "chat"],
    server_url: str,
    model: str,
    prompt_token_ids: list[int],
    max_tokens: int,
    *,
    extra_body: Mapping[str, Any] | None,
    timeout_s: float,
    read_timeout_s: float,
) -> tuple[str, httpx.Request]:
    """The URL and the streaming POST of one request (``extra_body`` merged last).

    Raises for an unknown ``endpoint`` or a body that is not JSON, before anything is sent.
    """
    url, body = _request_body(endpoint, server_url, model, prompt_token_ids, max_tokens)
    if extra_body:
        body.update(extra_body)
    request = client.build_request(
        "POST",
        url,
        json=body,
        headers={"Accept": "text/event-stream"},
        timeout=httpx.Timeout(timeout_s, read=read_timeout_s),
    )
    return url, request


def _request_body(
    endpoint: Literal["completions", "chat"],
    server_url: str,
    model: str,
    prompt_token_ids: list[int],
    max_tokens: int,
) -> tuple[str, dict[str, Any]]:
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "temperature": 0,
    }
    root = base_url(server_url)
    match endpoint:
        case "completions":
            return f"{root}/v1/completions", {**common, "prompt": list(prompt_token_ids)}
        case "chat":
            text = " ".join(str(token_id) for token_id in prompt_token_ids)
            return f"{root}/v1/chat/completions", {
                **common,
                # max_tokens is deprecated in chat but still the one older servers read.
                "max_completion_tokens": max_tokens,
                "messages": [{"role": "user", "content": text}],
            }
        case _:
            raise ValueError(f"endpoint={endpoint!r}: use 'completions' or 'chat'")


def _choice_text(choice: Mapping[str, Any]) -> bool:
    """Whether a choice without token ids carries generated text (completions or chat delta)."""
    text = choice.get("text")
    if isinstance(text, str) and text:
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return any(
            isinstance(delta.get(key), str) and delta[key]
            for key in ("content", "reasoning_content", "reasoning")
        )
    return False


def _int_or(value: object, default: int | None) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return default


__all__ = [
    "REJECTED_HTTP_STATUSES",
    "MalformedSseError",
    "SseDecoder",
    "SseEvent",
    "StreamResult",
    "base_url",
    "parse_retry_after",
    "stream_completion",
]
