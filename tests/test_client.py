"""live/client.py against a fault-injecting local server: every fault ends in a status."""

from __future__ import annotations

import asyncio
import itertools
import socket
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from live.client import (
    MalformedSseError,
    SseDecoder,
    SseEvent,
    StreamResult,
    parse_retry_after,
    stream_completion,
)
from sim.engine.request import RequestStatus
from tests.fault_server import (
    CACHED_TOKENS,
    REJECT_MESSAGE,
    STREAM_ERROR_MESSAGE,
    TOKENS_BEFORE_FAULT,
    FaultServer,
    fault_server,
)

# pytest finds the fixture by name in this module's namespace; listing it here tells ruff the
# import is used (otherwise F401 on the import and F811 on every test that takes it).
__all__ = ["fault_server"]

PROMPT = [11, 12, 13, 14]


def stream(base_url: str, max_tokens: int = 5, **kwargs: Any) -> StreamResult:
    """Run one stream_completion in a fresh event loop with a fresh client."""

    async def main() -> StreamResult:
        async with httpx.AsyncClient() as client:
            return await stream_completion(client, base_url, "tiny", PROMPT, max_tokens, **kwargs)

    return asyncio.run(main())


def assert_ordered(result: StreamResult) -> None:
    """Client timestamps never go backwards: send ≤ each token ≤ finish."""
    times = [result.send_s, *result.token_times_s, result.finish_s]
    assert times == sorted(times), times


# --- streams that end well ------------------------------------------------------------------


def test_normal_stream_counts_tokens_and_reads_usage(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("normal"), max_tokens=5)

    assert result.status is RequestStatus.OK
    assert result.error == ""
    assert result.note == ""
    assert result.http_status == 200
    assert result.retry_after_s is None
    assert result.num_output_tokens == 5
    assert result.output_token_ids == [1000, 1001, 1002, 1003, 1004]
    assert (result.prompt_tokens, result.completion_tokens) == (len(PROMPT), 5)
    assert result.cached_tokens == CACHED_TOKENS
    assert_ordered(result)


def test_completions_request_asks_for_exact_tokens(fault_server: FaultServer) -> None:
    stream(fault_server.url("normal"), max_tokens=3)

    sent = fault_server.requests[-1]
    assert (sent.method, sent.path) == ("POST", "/normal/v1/completions")
    assert sent.body == {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "temperature": 0,
    }


def test_several_token_ids_in_one_chunk_share_its_arrival_time(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("multi"), max_tokens=7)

    assert result.status is RequestStatus.OK
    assert result.output_token_ids == list(range(1000, 1007))
    assert result.num_output_tokens == 7
    times = result.token_times_s
    assert times[0] == times[1] == times[2]
    assert times[3] == times[4] == times[5]
    assert_ordered(result)


def test_comments_keepalives_crlf_and_split_data_lines(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("quirky"), max_tokens=4)

    assert result.status is RequestStatus.OK, result.error
    assert result.output_token_ids == [1000, 1001, 1002, 1003]
    assert (result.completion_tokens, result.cached_tokens) == (4, CACHED_TOKENS)


def test_without_token_ids_each_text_chunk_is_a_token(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("text_only"), max_tokens=4)

    assert result.status is RequestStatus.OK
    assert result.num_output_tokens == 4
    assert result.output_token_ids == []
    assert "counted from text chunks" in result.note


def test_fewer_tokens_than_asked_is_ok_and_noted(fault_server: FaultServer) -> None:
    # The server honours the overriding max_tokens of extra_body and sends 3 of 5.
    result = stream(fault_server.url("normal"), max_tokens=5, extra_body={"max_tokens": 3})

    assert result.status is RequestStatus.OK
    assert result.num_output_tokens == 3
    assert "after 3 of max_tokens 5" in result.note
    assert fault_server.requests[-1].body["max_tokens"] == 3


def test_chat_sends_ids_as_text_and_counts_token_ids(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("chat"), max_tokens=4, endpoint="chat")

    assert result.status is RequestStatus.OK
    assert result.output_token_ids == [1000, 1001, 1002, 1003]
    sent = fault_server.requests[-1]
    assert sent.path == "/chat/v1/chat/completions"
    assert sent.body["messages"] == [{"role": "user", "content": "11 12 13 14"}]
    assert sent.body["max_completion_tokens"] == sent.body["max_tokens"] == 4
    assert "prompt" not in sent.body


def test_chat_without_token_ids_undercounts_and_notes_usage(fault_server: FaultServer) -> None:
    # Odd tokens stream as empty content (half a UTF-8 character), the role chunk has none.
    result = stream(fault_server.url("chat_text"), max_tokens=6, endpoint="chat")

    assert result.status is RequestStatus.OK
    assert result.num_output_tokens == 3
    assert result.completion_tokens == 6
    assert "usage reports 6 completion tokens but 3 arrived" in result.note


# --- HTTP errors ----------------------------------------------------------------------------


def test_429_reports_retry_after(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("too_many_requests"))

    assert result.status is RequestStatus.ERROR
    assert result.error.startswith("429 Too Many Requests (retry after 2 s)")
    assert result.http_status == 429
    assert result.retry_after_s == 2.0
    assert result.num_output_tokens == 0
    assert_ordered(result)


def test_503_with_an_http_date_in_the_past_retries_now(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("unavailable"))

    assert result.status is RequestStatus.ERROR
    assert result.error == "503 Service Unavailable (retry after 0 s): overloaded"
    assert result.retry_after_s == 0.0


def test_500_is_an_error_with_the_body(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("server_error"))

    assert result.status is RequestStatus.ERROR
    assert result.error == "500 Internal Server Error: Internal Server Error: engine dead"
    assert result.http_status == 500
    assert result.retry_after_s is None


def test_400_is_rejected_with_the_servers_message(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("reject"))

    assert result.status is RequestStatus.REJECTED
    assert result.error == f"400 Bad Request: {REJECT_MESSAGE}"
    assert result.http_status == 400


def test_other_4xx_is_an_error(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("not_found"))

    assert result.status is RequestStatus.ERROR
    assert result.error == "404 Not Found: Not Found"
    assert result.http_status == 404


def test_a_non_streamed_200_is_an_error(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("json_200"))

    assert result.status is RequestStatus.ERROR
    assert result.error.startswith("expected text/event-stream, got 'application/json'")


# --- faults inside the stream keep the tokens -----------------------------------------------


def test_stream_without_done_is_an_error(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("no_done"))

    assert result.status is RequestStatus.ERROR
    assert result.error == f"stream ended without [DONE] after {TOKENS_BEFORE_FAULT} tokens"
    assert result.num_output_tokens == TOKENS_BEFORE_FAULT
    assert_ordered(result)


def test_malformed_json_names_the_line(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("malformed"))

    # Two token events take lines 1-4; the broken data line is line 5.
    assert result.status is RequestStatus.ERROR
    assert result.error.startswith("malformed SSE line 5: invalid JSON")
    assert result.output_token_ids == [1000, 1001]


def test_stall_longer_than_read_timeout_is_a_timeout(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("stall"), read_timeout_s=0.3)

    assert result.status is RequestStatus.TIMEOUT
    assert result.error == f"read timeout: no bytes for 0.3 s after {TOKENS_BEFORE_FAULT} tokens"
    assert result.num_output_tokens == TOKENS_BEFORE_FAULT
    assert result.http_status == 200
    assert_ordered(result)


def test_whole_request_deadline_is_a_timeout(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("slow"), max_tokens=1000, timeout_s=0.3)

    assert result.status is RequestStatus.TIMEOUT
    assert result.error.startswith("deadline of 0.3 s exceeded after ")
    assert 0 < result.num_output_tokens < 1000
    assert result.error.endswith(f" after {result.num_output_tokens} tokens")
    assert_ordered(result)


@pytest.mark.parametrize("mode", ["stream_error", "object_error"])
def test_error_object_in_stream(fault_server: FaultServer, mode: str) -> None:
    result = stream(fault_server.url(mode))

    assert result.status is RequestStatus.ERROR
    assert result.error == (
        f"server error in stream after {TOKENS_BEFORE_FAULT} tokens: {STREAM_ERROR_MESSAGE}"
    )
    assert result.num_output_tokens == TOKENS_BEFORE_FAULT


def test_aborted_finish_reason_is_an_error(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("abort"))

    assert result.status is RequestStatus.ERROR
    assert result.error.endswith("finish_reason 'abort'")
    assert result.num_output_tokens == TOKENS_BEFORE_FAULT


def test_connection_closed_mid_stream(fault_server: FaultServer) -> None:
    result = stream(fault_server.url("close"))

    assert result.status is RequestStatus.ERROR
    assert result.error.startswith(f"connection closed by server after {TOKENS_BEFORE_FAULT}")
    assert result.num_output_tokens == TOKENS_BEFORE_FAULT


def test_connection_refused() -> None:
    # A bound socket that does not listen refuses connections, and no one else can take its port.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = stream(f"http://127.0.0.1:{port}")

    assert result.status is RequestStatus.ERROR
    assert result.error.startswith("connection refused")
    assert result.http_status is None
    assert result.num_output_tokens == 0
    assert_ordered(result)


def test_cancellation_propagates_after_reporting_the_partial_result(
    fault_server: FaultServer,
) -> None:
    partials: list[StreamResult] = []

    async def main() -> None:
        fault_server.stalling.clear()
        async with httpx.AsyncClient() as client:
            task = asyncio.create_task(
                stream_completion(
                    client,
                    fault_server.url("stall"),
                    "tiny",
                    PROMPT,
                    10,
                    read_timeout_s=10,
                    on_partial=partials.append,
                )
            )
            await asyncio.to_thread(fault_server.stalling.wait, 5)
            await asyncio.sleep(0.2)  # let the tokens sent before the stall arrive
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())

    [partial] = partials
    assert partial.status is RequestStatus.CANCELLED
    assert partial.error == f"cancelled after {TOKENS_BEFORE_FAULT} tokens"
    assert partial.output_token_ids == [1000, 1001]
    assert_ordered(partial)


# --- the SSE decoder and Retry-After on their own -------------------------------------------

SSE_STREAM = (
    b"\xef\xbb\xbf: comment\r\n"
    b'data: {"a":\r\ndata: 1}\r\n\r\n'
    b"event: error\rid: 7\rretry: 100\rdata:x\r\r"
    b"data: \xc3\xa9\n\n"
    b"data\n\n"
    b"\n\n"
    b"data: [DONE]\n\n"
    b"data: never dispatched"
)
SSE_EVENTS = [
    SseEvent('{"a":\n1}', "", 2),
    SseEvent("x", "error", 8),
    SseEvent("é", "", 10),
    SseEvent("", "", 12),
    SseEvent("[DONE]", "", 16),
]


def test_sse_decoder_follows_the_standard() -> None:
    assert SseDecoder().feed(SSE_STREAM) == SSE_EVENTS


@given(st.lists(st.integers(0, len(SSE_STREAM)), max_size=12))
def test_sse_decoder_gives_the_same_events_however_bytes_are_split(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(SSE_STREAM)]
    decoder = SseDecoder()
    events = [e for a, b in itertools.pairwise(bounds) for e in decoder.feed(SSE_STREAM[a:b])]
    assert events == SSE_EVENTS


def test_sse_decoder_rejects_unknown_fields() -> None:
    with pytest.raises(MalformedSseError, match="malformed SSE line 2: unknown field 'dta'"):
        SseDecoder().feed(b": ok\ndta: {}\n\n")


def test_parse_retry_after() -> None:
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=now) == 30.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now=now) == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") is None
