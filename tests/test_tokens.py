"""Token ids for prompts: deterministic, prefix-stable, equal segments give equal ids."""

from __future__ import annotations

import pytest

from live.tokens import CHUNK_TOKENS, PromptTokens
from tests.factories import make_request


def test_streams_are_deterministic_and_prefix_stable() -> None:
    tokens = PromptTokens(1000)
    long = tokens.stream(42, 300)
    assert PromptTokens(1000).stream(42, 300) == long
    for n in (1, CHUNK_TOKENS - 1, CHUNK_TOKENS, CHUNK_TOKENS + 1, 299):
        assert tokens.stream(42, n) == long[:n]
    assert tokens.stream(43, 300) != long
    assert all(3 <= t < 1000 for t in long)


def test_requests_sharing_a_prefix_share_its_token_ids() -> None:
    tokens = PromptTokens(32000)
    a = tokens.prompt_ids(make_request(1, prompt_tokens=300, shared_prefix_tokens=256))
    b = tokens.prompt_ids(make_request(2, prompt_tokens=280, shared_prefix_tokens=256))
    assert len(a) == 300 and len(b) == 280
    assert a[:256] == b[:256]
    assert a[256:276] != b[256:276]


def test_real_answers_replace_the_planned_output_stream() -> None:
    tokens = PromptTokens(100)
    request = make_request(1, prompt_tokens=40)
    source = request.segments[0][0]
    answer = [7, 8, 9]
    ids = tokens.prompt_ids(request, {source: answer})
    # Shorter than planned: topped up from the stream so the prompt keeps its length.
    assert ids[:3] == answer and len(ids) == 40
    assert ids[3:] == tokens.stream(source, 40)[3:]


def test_vocab_must_leave_room_for_tokens() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        PromptTokens(3)


def test_a_salt_changes_every_token_but_keeps_the_sharing_within_a_run() -> None:
    # A repeated live run must not hit what the previous one left in the prefix cache.
    plain, salted = PromptTokens(32000), PromptTokens(32000, salt=7)
    first = make_request(1, prompt_tokens=300, shared_prefix_tokens=256)
    second = make_request(2, prompt_tokens=280, shared_prefix_tokens=256)
    a, b = salted.prompt_ids(first), salted.prompt_ids(second)
    assert a[:256] == b[:256]
    unsalted = plain.prompt_ids(first)
    assert sum(x == y for x, y in zip(a, unsalted, strict=True)) < 10  # chance collisions only
    assert PromptTokens(32000, salt=7).prompt_ids(first) == a
    assert PromptTokens(32000, salt=8).prompt_ids(first) != a
    with pytest.raises(ValueError, match="salt"):
        PromptTokens(32000, salt=-1)
