"""Tool calls read from a model's free answer (tool_choice "auto"), in the format its chat template teaches.

Hermes style (Qwen, Hermes, many fine-tunes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks,
text before the first one is the message content. Llama 3 JSON: the whole answer is one JSON object
``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``; several separated by ``;``). A template
that shows neither format gets no parser, and "auto" is refused for it.
"""

from __future__ import annotations

import json
import re
from typing import Any

HERMES = "hermes"
LLAMA3_JSON = "llama3_json"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parser_for_template(template: str) -> str | None:
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or ("ipython" in template and "tools" in template):
        return LLAMA3_JSON
    return None


def parse_tool_calls(parser: str, text: str, names: set[str]) -> tuple[str, list[tuple[str, Any]]]:
    """(content, [(function name, arguments)]) from an answer; no calls when none parse or none names a tool."""
    if parser == HERMES:
        at = text.find("<tool_call>")
        if at < 0:
            return text, []
        calls = [_call(json_text, "arguments") for json_text in _HERMES_CALL.findall(text[at:])]
        content = text[:at].strip()
    else:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        calls = [_call(part, "parameters") for part in body.split(";")]
        content = ""
    found = [c for c in calls if c is not None and c[0] in names]
    return (content, found) if found and len(found) == len(calls) else (text, [])


def _call(json_text: str, arguments_key: str) -> tuple[str, Any] | None:
    try:
        value = json.loads(json_text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    return value["name"], arguments
