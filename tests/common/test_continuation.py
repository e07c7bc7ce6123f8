"""The one rule of what a request's budget counts at each hop: prefill, hand-off, migration."""

from __future__ import annotations

import pytest

from common.continuation import ForcedFirst, continuation, prefill_finish, prefill_sampling
from common.errors import EngineError
from common.protocol import SamplingParams


@pytest.mark.parametrize(("max_tokens", "min_tokens", "known", "expected_max", "expected_min"), [
    (10, 0, (7,), 9, 0),  # a hand-off served as its continuation (the mock)
    (10, 4, (7,), 9, 3),  # min_tokens counts the first token too
    (10, 2, (7, 8, 9), 7, 0),  # a migration after three streamed tokens: min_tokens already met
    (10, 4, (), 10, 4),  # nothing known: the request as it is
])
def test_continuation(max_tokens, min_tokens, known, expected_max, expected_min) -> None:
    sampling = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, seed=3, temperature=0.5)
    prompt, rest = continuation((1, 2), sampling, known)
    assert prompt == (1, 2, *known)
    assert (rest.max_tokens, rest.min_tokens) == (expected_max, expected_min)
    assert (rest.seed, rest.temperature) == (3, 0.5)  # every other control unchanged


@pytest.mark.parametrize(("min_tokens", "expected_min"), [(0, 0), (1, 1), (5, 1)])
def test_a_prefill_samples_one_token(min_tokens, expected_min) -> None:
    prefill = prefill_sampling(SamplingParams(max_tokens=20, min_tokens=min_tokens))
    assert (prefill.max_tokens, prefill.min_tokens) == (1, expected_min)


@pytest.mark.parametrize(("finish", "max_tokens", "expected"), [
    ("stop", 20, "stop"),  # a stop token ends the request however long it might have run
    ("stop", 1, "stop"),
    ("length", 1, "length"),  # the client asked for one token: it has it
    ("length", 20, None),  # handed off
])
def test_prefill_finish(finish, max_tokens, expected) -> None:
    assert prefill_finish(finish, SamplingParams(max_tokens=max_tokens)) == expected


def test_the_forced_first_token_is_dropped_once() -> None:
    forced = ForcedFirst("r", 42)
    assert forced.emitted((), ()) == ((), ())  # a step with no new token: still owed
    assert forced.emitted((42, 5), ("lp42", "lp5")) == ((5,), ("lp5",))
    assert forced.emitted((42, 6), ("a", "b")) == ((42, 6), ("a", "b"))  # later tokens pass as they are
    with pytest.raises(EngineError, match="where the prefill's token 42 was forced"):
        ForcedFirst("r", 42).emitted((41,), ())
