"""The one decision of a request's max_tokens: the client's figure when it fits, the default, or a 400."""

from __future__ import annotations

import pytest

from services.frontend.openai_api import ApiError
from services.frontend.token_budget import COMPLETION_DEFAULT_MAX_TOKENS, check_prompt_chars, max_tokens_for


@pytest.mark.parametrize(("requested", "num_prompt", "context", "default", "expected"), [
    (10, 5, 100, None, 10),  # asked and fits
    (95, 5, 100, None, 95),  # exactly fills the context
    (None, 5, 100, None, 95),  # chat: the rest of the context
    (None, 5, 100, COMPLETION_DEFAULT_MAX_TOKENS, 16),  # completions: OpenAI's 16
    (3, 5, 100, COMPLETION_DEFAULT_MAX_TOKENS, 3),  # the client's figure over the default
    (1, 99, 100, None, 1),  # one token left, one asked
])
def test_the_budget_when_it_fits(requested, num_prompt, context, default, expected) -> None:
    assert max_tokens_for(requested, num_prompt, context, default) == expected


@pytest.mark.parametrize(("requested", "num_prompt", "context", "default", "param", "code"), [
    (0, 5, 100, None, "max_tokens", None),  # below one
    (-3, 5, 100, None, "max_tokens", None),
    (96, 5, 100, None, "max_tokens", "context_length_exceeded"),  # prompt + asked over the context
    (None, 100, 100, None, "messages", "context_length_exceeded"),  # the prompt alone fills it
    (None, 90, 100, COMPLETION_DEFAULT_MAX_TOKENS, "max_tokens", "context_length_exceeded"),  # default over
])
def test_a_budget_that_cannot_be_served_is_a_400_naming_the_field(requested, num_prompt, context, default, param,
                                                                   code) -> None:
    with pytest.raises(ApiError) as err:
        max_tokens_for(requested, num_prompt, context, default)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


def test_a_prompt_surely_over_the_context_by_its_characters_is_refused_before_tokenizing() -> None:
    check_prompt_chars(396, max_token_chars=4, context_len=100, param="prompt")  # 99 tokens at least: may fit
    with pytest.raises(ApiError) as err:
        check_prompt_chars(397, max_token_chars=4, context_len=100, param="prompt")
    assert (err.value.param, err.value.code) == ("prompt", "context_length_exceeded")
