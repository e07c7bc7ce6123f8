"""Chat prompts built byte for byte as vLLM's OpenAI server builds them.

vLLM turns a request's messages into its "conversation" (renderers/chat_utils.py: text parts joined with "\\n",
``None`` content as "", a tool message's text parts joined, assistant tool-call ``arguments`` parsed from their
JSON string into an object, ``developer`` turned into ``system`` for templates that do not name it) and hands it
to the Hugging Face tokenizer's ``apply_chat_template``, which renders with transformers' own jinja environment
(``render_jinja_template``: its ``tojson`` — no sorted keys, no HTML escapes —, loop controls, ``strftime_now``,
``raise_exception``, the ``{% generation %}`` tag) and the tokenizer's special tokens as variables.

Here the conversation is built the same way (``conversation``) and rendered by transformers' own
``render_jinja_template`` where transformers is installed (``RENDERER = "transformers"``); without it (the mock
image) by an environment set up as transformers sets up its own (``RENDERER = "jinja2"``), which
tests/services/frontend/test_chat_render.py holds to the same bytes. vLLM itself is not imported here: importing
it costs ~10 s and ~1 GB per frontend process; its own functions are what the tests compare against.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

try:  # what vLLM renders with (transformers' apply_chat_template calls it)
    from transformers.utils.chat_template_utils import render_jinja_template as _hf_render
    RENDERER = "transformers"
except ImportError:  # the mock image: no transformers
    _hf_render = None
    RENDERER = "jinja2"

# transformers' SPECIAL_TOKENS_ATTRIBUTES: each set one is a template variable (apply_chat_template).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Appended to the last message by transformers for continue_final_message, then cut off the rendered text.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatRenderError(ValueError):
    """The template or the messages cannot give a prompt (a 400 for the client)."""


def special_tokens(tok_config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = tok_config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            out[name] = str(value)
    return out


def conversation(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """vLLM's conversation from OpenAI messages (content format "string": text parts joined with a newline)."""
    out = []
    for m in messages:
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            content = "\n".join(p["text"] for p in content if p.get("type") == "text" and p.get("text") is not None)
        msg: dict[str, Any] = {"role": m["role"], "content": content}
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = [_with_object_arguments(c) for c in m["tool_calls"]]
            if not msg["tool_calls"]:
                del msg["tool_calls"]  # an empty list: the template's plain assistant path, as vLLM does
        if m["role"] == "assistant" and m.get("reasoning") is not None:
            msg["reasoning"] = msg["reasoning_content"] = m["reasoning"]
        if m["role"] == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if m["role"] == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    if any(m["role"] == "developer" for m in out) and not ('"developer"' in template or "'developer'" in template):
        out = _developer_as_system(out)
    return out


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """Chat templates take a tool call's arguments as an object (transformers' convention, vLLM's too)."""
    call = copy.deepcopy(call)
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if not arguments:
        function["arguments"] = {}
    elif not isinstance(arguments, dict):
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = None  # vLLM keeps the conversation going with {} rather than failing every later turn
        function["arguments"] = parsed if isinstance(parsed, dict) else {}
    return call


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM: developer messages become system ones, all merged into one first system message."""
    converted = []
    for m in messages:
        if m["role"] == "developer":
            m = {k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
        converted.append(m)
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    texts = [converted[i]["content"] for i in systems if converted[i]["content"]]
    return [{"role": "system", "content": "\n\n".join(texts)}] + [m for m in converted if m["role"] != "system"]


def render(template: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool, continue_final_message: bool, variables: dict[str, Any],
           renderer: str = RENDERER) -> str:
    """The prompt text; ``variables``: the special tokens, then the request's chat_template_kwargs over them.
    ``renderer``: "transformers" (its render_jinja_template) or "jinja2" (this module's copy of its environment)."""
    if continue_final_message and add_generation_prompt:
        raise ChatRenderError("continue_final_message and add_generation_prompt cannot both be true")
    try:
        if renderer == "transformers" and _hf_render is not None:
            rendered, _ = _hf_render(conversations=[messages], tools=tools, chat_template=template,
                                     add_generation_prompt=add_generation_prompt,
                                     continue_final_message=continue_final_message, **variables)
            return rendered[0]
        return _render_own(template, messages, tools, add_generation_prompt, continue_final_message, variables)
    except ChatRenderError:
        raise
    except Exception as exc:  # a template may raise anything (raise_exception, a bad filter argument, ...)
        raise ChatRenderError(str(exc)) from exc


def compile_check(template: str) -> None:
    """Raises ChatRenderError if the template does not compile (checked at start, not on the first request)."""
    try:
        if _hf_render is not None:
            from transformers.utils.chat_template_utils import _compile_jinja_template
            _compile_jinja_template(template)
        else:
            _compiled(template)
    except jinja2.TemplateError as exc:
        raise ChatRenderError(f"chat template does not compile: {exc}") from exc


# ------------------------------------------------------------------ without transformers: its environment
class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (assistant-mask tracking): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' tojson: json.dumps as is (jinja2's own sorts keys and escapes <, >, &, ').
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _render_own(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool, continue_final_message: bool, variables: dict[str, Any]) -> str:
    """As transformers' render_jinja_template renders one conversation (no documents, no assistant mask)."""
    final = None
    if continue_final_message:
        messages = copy.deepcopy(messages)
        if (final := messages[-1].get("content")) is None:
            raise ChatRenderError('continue_final_message is set but the final message has no "content" to '
                                  'continue!')
        if "content" not in template:
            raise ChatRenderError('continue_final_message is set to "content" but this is not an accepted field '
                                  'in the chat_template')
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final, block["text"] = block["text"], block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ChatRenderError("continue_final_message is set but we could not find any text to continue "
                                      "in the final message!")
        else:
            messages[-1]["content"] = final + _CONTINUE_TAG
    text = _compiled(template).render(messages=messages, tools=tools, documents=None,
                                      add_generation_prompt=add_generation_prompt, **variables)
    if final is not None:
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ChatRenderError("continue_final_message is set but the final message does not appear in the chat "
                                  "after applying the chat template!")
        at = text.rindex(_CONTINUE_TAG.strip())
        # The tag whole: the template kept the message's spacing; cut there. Else it trimmed it: strip too.
        text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text
