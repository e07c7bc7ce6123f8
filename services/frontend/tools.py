"""Function calling for ``tool_choice`` "required" or a named function: the call is guided decoding.

A named function: the output is the function's arguments, guided by its ``parameters`` schema. "required": the
output is a JSON array of ``{"name", "parameters"}`` objects, one schema branch per tool (as vLLM does), at
least one call (exactly one when ``parallel_tool_calls`` is false). Either way the answer comes back as
``tool_calls`` with ``finish_reason: tool_calls``. "none" renders the tools into the prompt and answers in
text. "auto" reads calls from the free answer with the parser of the template's format (tool_parsers); a
template without a known format gets a 400 for "auto" rather than a guess.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import orjson

from common.protocol import StructuredOutput
from services.frontend.openai_api import ApiError
from services.frontend.tool_parsers import parse_tool_calls


class FunctionDef(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class Tool(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDef
    defer_loading: bool | None = None

    def template_dict(self) -> dict[str, Any]:
        """The tool as vLLM hands it to the chat template (pydantic's model_dump of its request model): null
        description and parameters kept, strict and defer_loading only when set, the tool's defer_loading
        copied to its function's."""
        f = self.function
        function: dict[str, Any] = {"name": f.name, "description": f.description, "parameters": f.parameters}
        if f.strict is not None:
            function["strict"] = f.strict
        if (defer := f.defer_loading if f.defer_loading is not None else self.defer_loading) is not None:
            function["defer_loading"] = defer
        out = {"type": "function", "function": function}
        if self.defer_loading is not None:
            out["defer_loading"] = self.defer_loading
        return out


class NamedFunction(msgspec.Struct, frozen=True):
    name: str


class NamedChoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["function"]
    function: NamedFunction


@dataclass(frozen=True, slots=True)
class ToolPlan:
    tools: tuple[Tool, ...]
    # None: tool_choice "none" or "auto"; a name: that function; "": "required".
    forced: str | None
    structured: StructuredOutput | None
    # tool_choice "auto": the parser that reads calls from the free answer (tool_parsers).
    parser: str | None = None

    @property
    def shapes_answer(self) -> bool:
        """The answer may become tool_calls, so it is held back until it is whole."""
        return self.forced is not None or self.parser is not None

    def template_tools(self) -> list[dict[str, Any]]:
        return [t.template_dict() for t in self.tools]


_OBJECT = {"type": "object"}


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
               parser: str | None = None) -> ToolPlan | None:
    """``parser``: the tool-call format of the model's chat template (tool_parsers), None if it shows none."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    try:
        typed = tuple(msgspec.convert(tools, list[Tool]))
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid tools: {exc}", param="tools") from exc
    names = [t.function.name for t in typed]
    if len(set(names)) != len(names):
        raise ApiError(400, "tool function names must be unique", param="tools")
    if tool_choice is None or tool_choice == "auto":
        if parser is None:
            raise ApiError(400, "tool_choice 'auto' (the default with tools) needs a tool-call format in the model's "
                           "chat template (Hermes <tool_call> or Llama 3 JSON); this one has none: send "
                           "'required', a named function or 'none'", param="tool_choice", code="unsupported_field")
        return ToolPlan(typed, None, None, parser)
    if tool_choice == "none":
        return ToolPlan(typed, None, None)
    if tool_choice == "required":
        branches = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t.function.name]},
                                                      "parameters": t.function.parameters or _OBJECT},
                     "required": ["name", "parameters"], "additionalProperties": False} for t in typed]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
        if parallel_tool_calls is False:
            schema["maxItems"] = 1
        return ToolPlan(typed, "", StructuredOutput(json_schema=orjson.dumps(schema).decode()))
    try:
        named = msgspec.convert(tool_choice, NamedChoice)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid tool_choice: {exc}", param="tool_choice") from exc
    by_name = {t.function.name: t for t in typed}
    if named.function.name not in by_name:
        raise ApiError(400, f"tool_choice names {named.function.name!r}, which is not in tools", param="tool_choice")
    parameters = by_name[named.function.name].function.parameters or _OBJECT
    return ToolPlan(typed, named.function.name, StructuredOutput(json_schema=orjson.dumps(parameters).decode()))


def tool_answer(plan: ToolPlan, text: str, finish: str) -> tuple[str, str, list[dict[str, Any]] | None]:
    """(content, finish_reason, tool calls or None) of a whole answer under ``plan``."""
    if plan.parser is not None:
        content, found = parse_tool_calls(plan.parser, text, {t.function.name for t in plan.tools})
        return (content, "tool_calls", _calls(found)) if found else (text, finish, None)
    calls = tool_calls(plan, text) if finish == "stop" else None  # cut by max_tokens: not whole JSON
    return ("", "tool_calls", calls) if calls else (text, finish, None)


def tool_calls(plan: ToolPlan, text: str) -> list[dict[str, Any]] | None:
    """The calls in a guided answer; None when it is not complete JSON (cut by max_tokens)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if plan.forced:
        return _calls([(plan.forced, value)])
    return _calls([(c["name"], c["parameters"]) for c in value if isinstance(c, dict) and "name" in c])


def _calls(found: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": "call_" + secrets.token_hex(12), "type": "function",
             "function": {"name": name, "arguments": arguments if isinstance(arguments, str)
                          else json.dumps(arguments, separators=(",", ":"))}}
            for name, arguments in found]
