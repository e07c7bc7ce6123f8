"""Chat templates for tests: one that renders tools the usual way (Qwen/Hermes style).

``TOOLS_TEMPLATE`` uses what the frontend's own sandbox used to get wrong: transformers' ``tojson`` (no sorted
keys, no HTML escapes), ``loop.first``, ``{% break %}``, ``strftime_now``, ``message.tool_calls`` with the
arguments as an object, and a tool reply rendered as a user turn. Its answers are Hermes ``<tool_call>`` blocks,
so vLLM's ``hermes`` parser reads them.
"""

from __future__ import annotations

from pathlib import Path

TOOLS_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "Today is " + strftime_now("%Y") + ". You may call functions. Signatures:\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools>\\nAnswer a call as <tool_call>{\\"name\\": ..., \\"arguments\\": {...}}</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if loop.first and message.role == 'system' %}{%- continue %}{%- endif %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if loop.index > 4 %}{%- break %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
{{- tool_call.function.arguments | tojson }}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.previtem is not defined or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def write_tools_template(directory: Path) -> Path:
    path = Path(directory) / "tools.jinja"
    path.write_text(TOOLS_TEMPLATE)
    return path
