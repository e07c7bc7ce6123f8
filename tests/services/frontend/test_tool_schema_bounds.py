"""Tool schemas count in a chat request's size (openai_api.message_chars): the prompt-size bound refuses a
request of small messages and huge tool schemas before any template work, and long schemas send the template
work off the event loop, as long text does."""

from __future__ import annotations

import json
import threading

import pytest

from services.frontend.openai_api import message_chars
from tests.services.frontend.test_service import MODEL, call, frontend


def _tool(description: str) -> dict:
    return {"type": "function", "function": {"name": "lookup", "description": description,
                                             "parameters": {"type": "object", "properties": {}}}}


def _chat_with_tools(description: str) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                       "tools": [_tool(description)], "tool_choice": "required"}).encode()


@pytest.mark.parametrize(("messages", "tools", "at_least"), [
    ([{"role": "user", "content": "hello"}], None, 5),
    ([{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}], None, 4),
    ([{"role": "user", "content": "hi"}], [_tool("x" * 1000)], 1002),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "y" * 500}}]}], None, 500),
    ([{"role": "assistant", "content": "", "reasoning": "z" * 300}], None, 300),
])
def test_message_chars_counts_what_the_template_renders(messages, tools, at_least: int) -> None:
    assert message_chars(messages, tools) >= at_least


async def test_huge_tool_schemas_are_refused_before_any_template_work() -> None:
    async with frontend() as service:
        def must_not_run(*_a, **_k):
            raise AssertionError("templated a prompt that cannot fit")

        service.tokenizer.apply_chat_template = must_not_run
        reply = await call(service, "POST", "/v1/chat/completions", _chat_with_tools("word " * 1_400_000))
        assert reply.status == 400, reply.body
        assert json.loads(reply.body)["error"]["code"] == "context_length_exceeded"


async def test_long_tool_schemas_are_templated_off_the_event_loop() -> None:
    async with frontend() as service:
        loop_thread = threading.current_thread()
        seen: list[threading.Thread] = []
        real = service.tokenizer.apply_chat_template

        def record(messages, **kwargs):
            seen.append(threading.current_thread())
            return real(messages, **kwargs)

        service.tokenizer.apply_chat_template = record
        await call(service, "POST", "/v1/chat/completions", _chat_with_tools("short"))
        await call(service, "POST", "/v1/chat/completions",
                   _chat_with_tools("a fox jumps " * (service.tokenizer.offload_min_chars // 12 + 1)))
        assert len(seen) == 2 and seen[0] is loop_thread and seen[1] is not loop_thread
