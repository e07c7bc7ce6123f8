"""The served context: the smallest max_model_len a worker of that model registered, else the model's."""

from __future__ import annotations

import pytest

from common.protocol import WorkerInfo, WorkerList, WorkerLoad
from services.frontend.context import (
    OFFLOAD_MIN_CHARS,
    min_prompt_tokens,
    offload_tokenization,
    served_context_len,
)


def _workers(*specs: tuple[str, int]) -> WorkerList:
    infos = tuple(WorkerInfo(worker_id=f"w{i}", role="both", model=model, block_size=32, num_blocks=8,
                             endpoint="tcp://127.0.0.1:1", max_model_len=n) for i, (model, n) in enumerate(specs))
    return WorkerList(request_id="r", workers=infos, loads=tuple(WorkerLoad() for _ in infos))


@pytest.mark.parametrize(("workers", "expected"), [
    (None, 4096),                                              # no list yet: the model's own context
    (_workers(), 4096),
    (_workers(("tiny", 8192)), 8192),                          # the engines' --max-model-len may exceed the config
    (_workers(("tiny", 2000), ("tiny", 3000)), 2000),          # the smallest: any of them may get the request
    (_workers(("tiny", 0)), 4096),                             # 0 = not reported
    (_workers(("other", 100), ("tiny", 3000)), 3000),          # other models' workers do not count
])
def test_served_context_len(workers, expected) -> None:
    assert served_context_len(4096, workers, "tiny") == expected


@pytest.mark.parametrize(("num_chars", "max_token_chars", "expected"), [
    (0, 80, 0),
    (1, 80, 1),
    (80, 80, 1),
    (81, 80, 2),
    (7_000_000, 80, 87_500),   # the 7 MB prompt: far over a 4,096-token context, known without tokenizing
    (10, 0, 10),               # a degenerate vocabulary never divides by zero
])
def test_min_prompt_tokens(num_chars: int, max_token_chars: int, expected: int) -> None:
    assert min_prompt_tokens(num_chars, max_token_chars) == expected


def test_min_prompt_tokens_is_a_lower_bound_for_the_tiny_model() -> None:
    from tests.harness.graph import tiny_model_dir
    from services.frontend.tokenizer import ModelTokenizer

    tok = ModelTokenizer(tiny_model_dir())
    for text in ["hello world", "#" * 500, " " * 300, "日本語のテキスト" * 20, "<|endoftext|>" * 10]:
        assert min_prompt_tokens(len(text), tok.max_token_chars) <= len(tok.encode(text)), text


@pytest.mark.parametrize(("num_chars", "offload"), [(10, False), (OFFLOAD_MIN_CHARS - 1, False),
                                                    (OFFLOAD_MIN_CHARS, True), (10_000_000, True)])
def test_offload_tokenization(num_chars: int, offload: bool) -> None:
    assert offload_tokenization(num_chars) is offload
