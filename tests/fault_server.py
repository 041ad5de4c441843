"""A local HTTP server that misbehaves on demand, for testing live/client.py.

This is the one place where tests fake a server: a real vLLM cannot be made to answer 429, stall,
drop the connection or send broken SSE when a test wants it to. It speaks raw HTTP/1.1 over
``asyncio.start_server`` in a background thread, so tests that run their own event loop
(``asyncio.run``) can talk to it.

The behaviour is chosen by the first path segment: a client given
``base_url = server.url("stall")`` posts to ``/stall/v1/completions``. Streams send as many
tokens as the request's ``max_tokens`` asks for (one token id per chunk unless the mode says
otherwise), token ``i`` having id ``1000 + i`` and text ``" t{i}"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

#: Prompt tokens the normal stream reports as served from the prefix cache.
CACHED_TOKENS = 16
#: Tokens sent before a fault that happens mid-stream.
TOKENS_BEFORE_FAULT = 2
#: How long the "stall" mode keeps quiet (tests use read timeouts far shorter).
STALL_S = 30.0
#: Gap between tokens in the "slow" mode.
SLOW_GAP_S = 0.02
#: The message the "reject" mode answers with, as vLLM words a too-long prompt.
REJECT_MESSAGE = (
    "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens "
    "(2900 in the messages, 100 in the completion). Please reduce the length of the messages "
    "or completion."
)
STREAM_ERROR_MESSAGE = "Internal server error"

MODES = (
    "normal",  # max_tokens chunks with token_ids, usage with cached tokens, [DONE]
    "multi",  # three token ids per chunk
    "quirky",  # CRLF, comments, keep-alive blank lines, split data lines, odd TCP splits
    "text_only",  # completions without token_ids
    "chat",  # chat chunks with token_ids
    "chat_text",  # chat without token_ids: a role chunk and empty-content (byte) tokens
    "too_many_requests",  # 429 with Retry-After: 2
    "unavailable",  # 503 with an HTTP-date Retry-After
    "server_error",  # 500 with a plain text body
    "reject",  # 400 with vLLM's error JSON
    "not_found",  # 404 with FastAPI's {"detail": ...}
    "json_200",  # 200 with a non-streamed JSON body
    "no_done",  # tokens, then a clean end of body without [DONE]
    "malformed",  # tokens, then a data line that is not JSON
    "stall",  # tokens, then silence for STALL_S
    "stream_error",  # tokens, then {"error": {...}} and [DONE], as vLLM does
    "object_error",  # tokens, then an older-style {"object": "error", ...}
    "abort",  # tokens, then finish_reason "abort" and [DONE]
    "close",  # tokens, then the connection dropped inside the chunked body
    "slow",  # tokens SLOW_GAP_S apart
    "dies",  # "normal" for the first FaultServer.dies_after POSTs, then drops every connection
)


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One request the server got: its method, path (mode prefix included) and JSON body."""

    method: str
    path: str
    body: dict[str, Any]


class FaultServer:
    """The fault-injecting server, running on 127.0.0.1 and a free port in its own thread."""

    def __init__(self) -> None:
        self.requests: list[ReceivedRequest] = []
        #: Set when a "stall" response has sent its tokens and started to stall.
        self.stalling = threading.Event()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        #: How many requests the "dies" mode answers before it drops every connection unanswered.
        self.dies_after = 0
        self._num_dies_requests = 0

    def url(self, mode: str) -> str:
        """The base URL that selects ``mode`` (one of :data:`MODES`)."""
        assert mode in MODES, mode
        return f"http://127.0.0.1:{self.port}/{mode}"

    def start(self) -> None:
        """Start listening; returns once the port is bound."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(timeout=10)

    def stop(self) -> None:
        """Stop serving, cancel responses still running (stalls), and end the thread."""
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            request = await _read_request(reader)
            if request is not None:
                self.requests.append(request)
                await self._respond(request, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away (a timeout or cancellation test)
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _respond(self, request: ReceivedRequest, writer: asyncio.StreamWriter) -> None:
        mode = request.path.strip("/").split("/", 1)[0]
        max_tokens = int(request.body.get("max_tokens", 4))
        num_prompt_tokens = len(request.body.get("prompt", ()))
        if mode == "dies" and request.method == "POST":  # GET /metrics does not count
            self._num_dies_requests += 1
            if self._num_dies_requests > self.dies_after:
                writer.transport.abort()  # accepted, then gone: an engine that crashed
                return
        match mode:
            case "too_many_requests":
                error = _error_json("Too many requests, slow down", "RateLimitError", 429)
                await _send(writer, 429, "Too Many Requests", error, retry_after="2")
            case "unavailable":
                await _send(
                    writer,
                    503,
                    "Service Unavailable",
                    b"overloaded",
                    content_type="text/plain",
                    retry_after="Wed, 21 Oct 2015 07:28:00 GMT",
                )
            case "server_error":
                body = b"Internal Server Error: engine dead"
                await _send(writer, 500, "Internal Server Error", body, content_type="text/plain")
            case "reject":
                await _send(
                    writer, 400, "Bad Request", _error_json(REJECT_MESSAGE, "BadRequestError", 400)
                )
            case "not_found":
                await _send(writer, 404, "Not Found", b'{"detail":"Not Found"}')
            case "json_200":
                body = json.dumps({"object": "text_completion", "choices": []}).encode()
                await _send(writer, 200, "OK", body)
            case _:
                await self._stream(writer, mode, max_tokens, num_prompt_tokens)

    async def _stream(
        self, writer: asyncio.StreamWriter, mode: str, max_tokens: int, num_prompt_tokens: int
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        chat = mode.startswith("chat")
        faulty = mode in ("no_done", "malformed", "stall", "stream_error", "object_error", "close")
        num_tokens = TOKENS_BEFORE_FAULT if faulty or mode == "abort" else max_tokens
        per_chunk = 3 if mode == "multi" else 1
        if mode == "quirky":
            await _chunk(writer, b": connected\r\n\r\n")
        if mode == "chat_text":
            role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await _chunk(writer, _event(role))
        for first in range(0, num_tokens, per_chunk):
            ids = list(range(1000 + first, 1000 + min(first + per_chunk, num_tokens)))
            last = first + per_chunk >= num_tokens
            finish = ("abort" if mode == "abort" else "length") if last and not faulty else None
            await _chunk(writer, _token_event(mode, ids, finish, chat))
            if mode == "quirky":
                await _chunk(writer, b":keep-alive\r\n\r\n")
            if mode == "slow":
                await asyncio.sleep(SLOW_GAP_S)
        match mode:
            case "no_done":
                await _chunk(writer, b"")
                return
            case "malformed":
                await _chunk(writer, b'data: {"choices": [{"index": 0, "text": \n\n')
                await _chunk(writer, b"data: [DONE]\n\n")
                return
            case "stall":
                await writer.drain()
                self.stalling.set()
                await asyncio.sleep(STALL_S)
                return
            case "stream_error":
                error = _error_json(STREAM_ERROR_MESSAGE, "InternalServerError", 500)
                await _chunk(writer, b"data: " + error + b"\n\n")
                await _chunk(writer, b"data: [DONE]\n\n")
                await _chunk(writer, b"")
                return
            case "object_error":
                old_style = {"object": "error", "message": STREAM_ERROR_MESSAGE, "code": 500}
                await _chunk(writer, _event(old_style))
                return
            case "close":
                # Half a chunk, then drop the connection: the chunked body never completes.
                writer.write(b"40\r\ndata: {")
                await writer.drain()
                writer.transport.abort()
                return
        usage = {
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": num_prompt_tokens + max_tokens,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
        }
        usage_event = _event({"choices": [], "usage": usage})
        if mode == "quirky":
            # One JSON object spread over two data lines, and "data:" without its space.
            text = usage_event.decode().removeprefix("data: ").strip()
            middle = text.index(",")
            split = f"data:{text[: middle + 1]}\r\ndata: {text[middle + 1 :]}\r\n\r\n".encode()
            await _chunk(writer, split[:7])  # TCP may split anywhere, even inside a field name
            await _chunk(writer, split[7:])
            await _chunk(writer, b"data: [DONE]\r")
            await _chunk(writer, b"\n\r\n")
        else:
            await _chunk(writer, usage_event)
            await _chunk(writer, b"data: [DONE]\n\n")
        await _chunk(writer, b"")


def _token_event(mode: str, ids: list[int], finish: str | None, chat: bool) -> bytes:
    text = "".join(f" t{i - 1000}" for i in ids)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        # Byte-level tokens (half a UTF-8 character) stream as empty content.
        content = "" if mode == "chat_text" and ids[0] % 2 else text
        choice["delta"] = {"content": content}
    else:
        choice["text"] = text
    if mode not in ("text_only", "chat_text"):
        choice["token_ids"] = ids
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _event({"object": kind, "choices": [choice]})


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _error_json(message: str, error_type: str, code: int) -> bytes:
    error = {"message": message, "type": error_type, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One HTTP/1.1 chunk (an empty one ends the body), flushed so it leaves now."""
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    reason: str,
    body: bytes,
    *,
    content_type: str = "application/json",
    retry_after: str | None = None,
) -> None:
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if retry_after is not None:
        head += f"retry-after: {retry_after}\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> ReceivedRequest | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return ReceivedRequest(method, path, json.loads(body) if body else {})


@pytest.fixture(scope="module")
def fault_server() -> Iterator[FaultServer]:
    """A running :class:`FaultServer`, stopped after the module's tests."""
    server = FaultServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
