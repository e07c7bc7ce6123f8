"""chat_template_kwargs reach the chat template as variables (vLLM's behaviour), beside messages and tools."""

from __future__ import annotations

import json
import shutil

from tests.harness.graph import tiny_model_dir
from services.frontend.tokenizer import ModelTokenizer

# The switch Qwen3-style templates read: no "think" block when the client turns thinking off.
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{% endif %}")


def test_template_kwargs_are_template_variables(tmp_path) -> None:
    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir(), model, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    tok = ModelTokenizer(model)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages).text == "<|user|>hi<|assistant|>"
    off = tok.apply_chat_template(messages, template_kwargs={"enable_thinking": False})
    assert off.text == "<|user|>hi<|assistant|><think></think>"
    assert off.token_ids == tok.encode(off.text)
