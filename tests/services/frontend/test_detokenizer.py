"""The incremental detokenizer decodes output in the prompt's context, as vLLM's does (its DecodeStream is
primed with the prompt's ids): streamed text equals the whole decode of prompt + output minus the prompt's."""

from __future__ import annotations

import random

from services.frontend.tokenizer import ModelTokenizer
from tests.harness.graph import tiny_model_dir


def test_output_continues_the_prompts_decode() -> None:
    tok = ModelTokenizer(tiny_model_dir())
    rng = random.Random(5)
    vocab = tok.tokenizer.get_vocab_size()
    for _ in range(200):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        whole, before = tok.tokenizer.decode(prompt + output), tok.tokenizer.decode(prompt)
        if not whole.startswith(before) or "\ufffd" in whole:
            continue  # the prompt ends inside a character: no clean split to compare with
        primed = tok.decoder(prompt)
        text = "".join(primed.feed([t]).text for t in output) + primed.flush()
        assert text == whole[len(before):], (prompt, output)

