"""vLLM's extra request fields in the frontend: detokenization options, truncation, bad_words as vLLM tokenizes
them, structured outputs of every kind, prompt logprobs and echo, response ids; the utility endpoints."""

from __future__ import annotations

import importlib.util
import json

import pytest

from common.protocol import StructuredOutput, TokenLogprobs, Tokens
from services.frontend.choice_text import ChoiceText, detokenize_options
from services.frontend.context import truncate_prompt
from services.frontend.echo import chat_echo, completion_echo, prompt_logprobs_json
from services.frontend.logprobs import LogprobsRenderer
from services.frontend.openai_api import ApiError, parse_chat, parse_completion
from services.frontend.request_ids import response_ids
from services.frontend.sampling import bad_words_token_ids, refusal_for_engines, sampling_params
from services.frontend.tokenizer import DetokenizeOptions, ModelTokenizer
from services.frontend.utility_api import detokenize, parse_detokenize, parse_tokenize, tokenize
from tests.harness.graph import tiny_model_dir

TOK = ModelTokenizer(tiny_model_dir())
IM_END = 2  # <|im_end|>, a special token of the tiny model


def chat(**fields):
    return parse_chat(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode())


def completion(**fields):
    return parse_completion(json.dumps({"model": "m", "prompt": "hi", **fields}).encode())


def params(req):
    return sampling_params(req, 16, TOK.eos_token_ids, TOK.vocab_size, encode=TOK.encode)


def feed_all(options: DetokenizeOptions, ids: list[int], stop: tuple[str, ...] = (),
             finish: str = "length") -> tuple[str, str]:
    choice = ChoiceText(TOK.decoder((), options), None)
    for i, token_id in enumerate(ids):
        choice.feed(Tokens("r", (token_id,), finish if i == len(ids) - 1 else None), TOK.eos_token_ids, stop)
        if choice.stopped:
            break
    text, finish_reason, _ = choice.result()
    return text, finish_reason


def test_special_tokens_are_shown_only_when_not_skipped() -> None:
    ids = [*TOK.encode("a b"), 1, IM_END, *TOK.encode(" c")]
    assert feed_all(DetokenizeOptions(), ids)[0] == "a b c"
    shown = feed_all(DetokenizeOptions(skip_special_tokens=False), ids)[0]
    assert shown == "a b<|im_start|><|im_end|> c"
    # Without spaces between special tokens: consecutive ones are their bare text (here already so).
    assert feed_all(DetokenizeOptions(skip_special_tokens=False, spaces_between_special_tokens=False), ids)[0] \
        == shown


def test_include_stop_str_in_output_keeps_the_stop_string_and_the_stop_token() -> None:
    ids = TOK.encode("one two three four")
    assert feed_all(DetokenizeOptions(), ids, (" three",)) == ("one two", "stop")
    assert feed_all(DetokenizeOptions(include_stop_str_in_output=True), ids, (" three",)) == \
        ("one two three", "stop")
    # A stop token (EOS) ends the answer unseen, or, kept and not skipped, shown.
    with_eos = [*TOK.encode("one"), IM_END]
    assert feed_all(DetokenizeOptions(skip_special_tokens=False), with_eos, finish="stop")[0] == "one"
    assert feed_all(DetokenizeOptions(skip_special_tokens=False, include_stop_str_in_output=True), with_eos,
                    finish="stop")[0] == "one<|im_end|>"


def test_the_stop_string_completing_first_wins_as_in_vllm() -> None:
    # " two" completes before "wo three" although listed second.
    ids = TOK.encode("one two three")
    assert feed_all(DetokenizeOptions(), ids, ("wo three", " two"))[0] == "one"


def test_detokenize_options_come_from_the_request() -> None:
    options = detokenize_options(completion(skip_special_tokens=False, include_stop_str_in_output=True))
    assert options == DetokenizeOptions(skip_special_tokens=False, include_stop_str_in_output=True)


@pytest.mark.parametrize(("truncate", "side", "expected"), [
    (None, None, [1, 2, 3, 4, 5]), (3, None, [3, 4, 5]), (3, "left", [3, 4, 5]), (3, "right", [1, 2, 3]),
    (5, None, [1, 2, 3, 4, 5]), (-1, None, [2, 3, 4, 5]), (0, None, []),
])
def test_truncate_prompt_tokens_as_vllm(truncate, side, expected) -> None:
    # max_len 5: -1 keeps the context less one token for the output.
    assert list(truncate_prompt([1, 2, 3, 4, 5], truncate, side, 5)) == expected


def test_truncation_beyond_the_context_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be greater than max_model_len"):
        truncate_prompt([1, 2], 6, None, 5)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (the reference)")
def test_bad_words_are_tokenized_as_vllm_does() -> None:
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.tokenizers import get_tokenizer

    words = ["hello", " world", "Zürich", "queue socket", "東京", "a"]
    reference = VllmSamplingParams(bad_words=words)
    reference.update_from_tokenizer(get_tokenizer(str(tiny_model_dir())))
    ours = bad_words_token_ids(words, TOK.encode, TOK.vocab_size)
    assert [list(ids) for ids in ours] == reference.bad_words_token_ids


def test_bad_words_refusals() -> None:
    with pytest.raises(ApiError, match="empty string"):
        bad_words_token_ids([""], TOK.encode, TOK.vocab_size)


def test_new_sampling_fields_travel_to_the_workers() -> None:
    sampling = params(chat(allowed_token_ids=[5, 3, 5], bad_words=["x"], prompt_logprobs=2))
    assert sampling.allowed_token_ids == (5, 3) and sampling.bad_words_token_ids
    assert sampling.prompt_logprobs == 2
    # echo asks for the prompt's logprobs with the answer's count (completions: logprobs; chat: top_logprobs).
    assert params(completion(echo=True, logprobs=3)).prompt_logprobs == 3
    assert params(completion(echo=True)).prompt_logprobs is None
    assert params(chat(echo=True)).prompt_logprobs == 0  # vLLM's chat: top_logprobs, default 0


@pytest.mark.parametrize(("fields", "param"), [
    ({"allowed_token_ids": []}, "allowed_token_ids"), ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ({"guided_regex": "a+"}, "guided_regex"),
])
def test_bad_values_are_400_naming_the_field(fields: dict, param: str) -> None:
    with pytest.raises(ApiError) as info:
        params(chat(**fields))
    assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize(("given", "expected"), [
    ({"json": {"type": "object"}}, StructuredOutput(json_schema='{"type":"object"}')),
    ({"json": '{"type": "object"}'}, StructuredOutput(json_schema='{"type":"object"}')),
    ({"regex": "[0-9]+"}, StructuredOutput(regex="[0-9]+")),
    ({"choice": ["yes", "no"]}, StructuredOutput(choice=("yes", "no"))),
    ({"grammar": 'root ::= "a"'}, StructuredOutput(grammar='root ::= "a"')),
    ({"json_object": True, "disable_any_whitespace": True},
     StructuredOutput(json_object=True, disable_any_whitespace=True)),
])
def test_structured_outputs_of_every_kind(given: dict, expected: StructuredOutput) -> None:
    assert params(chat(structured_outputs=given)).structured == expected
    assert params(completion(structured_outputs=given)).structured == expected


def test_completions_take_response_format_too() -> None:
    assert params(completion(response_format={"type": "json_object"})).structured == \
        StructuredOutput(json_object=True)


def test_the_mock_engine_refuses_what_needs_a_model_by_name() -> None:
    for fields, name in (({"allowed_token_ids": [1]}, "allowed_token_ids"), ({"bad_words": ["x"]}, "bad_words"),
                         ({"prompt_logprobs": 0}, "prompt_logprobs")):
        refusal = refusal_for_engines(params(chat(**fields)), {"mock"})
        assert refusal is not None and refusal.param == name
        assert refusal_for_engines(params(chat(**fields)), {"vllm"}) is None
    refusal = refusal_for_engines(params(chat(structured_outputs={"regex": "a"})), {"mock"}, "structured_outputs")
    assert refusal is not None and refusal.param == "structured_outputs"


def test_completion_echo_with_the_prompts_logprobs_first() -> None:
    prompt_ids = tuple(TOK.encode("a b"))
    echo = completion_echo(completion(echo=True, logprobs=1), "a b", prompt_ids, TOK.tokenizer.decode)
    assert echo is not None and echo.text == "a b" and echo.token_ids == prompt_ids
    scored = tuple(TokenLogprobs(t, -1.5, ((7, -0.5),), rank=2) for t in prompt_ids[1:])
    renderer = LogprobsRenderer(lambda i: TOK.tokenizer.decode([i]), is_chat=False)
    choice = ChoiceText(TOK.decoder(prompt_ids), renderer, echo)
    choice.feed(Tokens("r", (5,), "length", logprobs=(TokenLogprobs(5, -0.1, ((5, -0.1),)),),
                       prompt_logprobs=scored), (), ())
    text, _, logprobs = choice.result()
    assert text == "a b" + TOK.decoder(prompt_ids).feed([5]).text
    assert logprobs["token_logprobs"] == [None, *([-1.5] * (len(prompt_ids) - 1)), -0.1]
    assert logprobs["top_logprobs"][0] is None and len(logprobs["tokens"]) == len(prompt_ids) + 1
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"][-1] == len("a b")
    assert completion_echo(completion(), "a b", prompt_ids, TOK.tokenizer.decode) is None


def test_chat_echo_repeats_the_last_message_of_the_answers_role() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The"}]
    echo = chat_echo(chat(echo=True), messages)  # the answer is the assistant's, and so is the last message
    assert echo is not None and echo.text == "The"
    # The last message is the user's: with a generation prompt the answer's role differs (nothing echoed); without
    # one the answer continues the user's role, and echoes it.
    assert chat_echo(chat(echo=True), messages[:1]) is None
    echo = chat_echo(chat(echo=True, add_generation_prompt=False), messages[:1])
    assert echo is not None and echo.text == "q"
    assert chat_echo(chat(), messages) is None


def test_prompt_logprobs_in_vllms_shape() -> None:
    scored = (TokenLogprobs(8, -0.3, ((8, -0.3), (4, -1.2)), rank=1), TokenLogprobs(9, -6.0, ((4, -0.5),), rank=57))
    out = prompt_logprobs_json((5, 8, 9), scored, lambda i: f"t{i}")
    assert out[0] is None
    assert out[1] == {"8": {"logprob": -0.3, "rank": 1, "decoded_token": "t8"},
                      "4": {"logprob": -1.2, "rank": 2, "decoded_token": "t4"}}
    assert out[2]["9"]["rank"] == 57 and out[2]["4"]["rank"] == 1


def test_response_ids_follow_the_client_as_vllm_but_stay_unique_inside() -> None:
    public, internal = response_ids("chatcmpl", {"x-request-id": "abc"}, chat(request_id="body-id"))
    assert public == "chatcmpl-abc" and internal is not None and internal != public
    assert response_ids("cmpl", {}, completion(request_id="r1"))[0] == "cmpl-r1"
    public, internal = response_ids("cmpl", {}, completion())
    assert public.startswith("cmpl-") and internal is None


def test_tokenize_and_detokenize_as_vllm() -> None:
    out = json.loads(tokenize(parse_tokenize(b'{"prompt": "hello world", "return_token_strs": true}'), TOK, 64))
    assert out["tokens"] == TOK.encode("hello world") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 64 and len(out["token_strs"]) == out["count"]
    chat_out = json.loads(tokenize(parse_tokenize(b'{"messages": [{"role": "user", "content": "hi"}]}'), TOK, 64))
    prompt = TOK.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat_out["tokens"] == prompt.token_ids and chat_out["token_strs"] is None
    back = json.loads(detokenize(parse_detokenize(json.dumps({"tokens": prompt.token_ids}).encode()), TOK))
    assert back == {"prompt": prompt.text}
    with pytest.raises(ApiError):
        parse_tokenize(b'{"prompt": "a", "messages": []}')
    with pytest.raises(ApiError):
        detokenize(parse_detokenize(b'{"tokens": [999999999]}'), TOK)


async def test_utility_routes_and_the_request_id_header() -> None:
    from tests.services.frontend.test_service import call, frontend

    async with frontend() as service:
        version = await call(service, "GET", "/version")
        assert version.status == 200 and set(json.loads(version.body)) == {"version"}
        ping = await call(service, "GET", "/ping")  # no router behind this frontend: unavailable, as /health
        assert ping.status == (await call(service, "GET", "/health")).status and ping.body == b""
        assert (await call(service, "POST", "/ping")).status == ping.status
        reply = await call(service, "POST", "/tokenize", b'{"model": "tiny", "prompt": "hello"}',
                           headers={"X-Request-Id": "client-7"})
        assert reply.status == 200 and json.loads(reply.body)["tokens"] == TOK.encode("hello")
        assert reply.headers["x-request-id"] == "client-7"
        assert (await call(service, "POST", "/tokenize", b'{"model": "other", "prompt": "a"}')).status == 404
        reply = await call(service, "POST", "/detokenize", b'{"tokens": [284, 78, 338]}')
        assert json.loads(reply.body) == {"prompt": "hello"}
        # An error carries the client's id too.
        reply = await call(service, "POST", "/v1/completions", b'{"model": "tiny", "prompt": "a", "echo": 3}',
                           headers={"X-Request-Id": "client-8"})
        assert reply.status == 400 and reply.headers["x-request-id"] == "client-8"


class _HoldingToolParser:
    """A tool parser that streams a call's arguments but holds back the last '}' (as some of vLLM's do)."""

    def extract_tool_calls_streaming(self, previous, current, delta, previous_ids, current_ids, delta_ids, request):
        class Delta:
            def model_dump(self, exclude_none=True):
                return {"tool_calls": [{"index": 0, "function": {"arguments": delta.rstrip("}")}}]}
        return Delta()

    def get_remaining_unstreamed_args(self) -> str:
        return "}"


def test_the_streams_last_tool_call_delta_gets_the_held_back_arguments_as_vllm() -> None:
    from services.frontend.vllm_parsers import ParseSession

    session = ParseSession(request=None, tool=_HoldingToolParser(), reasoning=None)
    first = session.stream('{"a": 1', [1])
    assert first["tool_calls"][0]["function"]["arguments"] == '{"a": 1'
    last = session.stream("}", [2], finished=True)  # vLLM's Parser.finalize_generation
    assert last["tool_calls"][0]["function"]["arguments"] == "}"
    unfinished = ParseSession(request=None, tool=_HoldingToolParser(), reasoning=None).stream("}", [2])
    assert unfinished["tool_calls"][0]["function"]["arguments"] == ""
