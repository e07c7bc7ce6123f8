"""The reference the real P/D tests compare with: one vLLM engine doing both (``--aggregated 1`` with VLLM_ARGS:
tiny model, fp32), greedy completions of token prompts.

Such a completion is a function of the prompt and ``max_tokens`` alone (the premise of every P/D == aggregated
test here), so the session keeps each one computed: a test, or a test's second arm, whose prompts were all
computed before starts no engine (start-up and stop: ~40 s on a loaded 2-core machine). The engine runs only
while outputs are computed: it is stopped before the caller starts its own (two more engines beside a P/D graph
would not fit on 2 cores)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.harness.graph import Graph, start_graph
from tests.e2e.test_openai_api import MODEL, client

VLLM_ARGS = ("--engine", "vllm", "--dtype", "float32", "--local-prefill-max-tokens", "64")
MAX_TOKENS = 16


def prompt(length: int, salt: int = 0) -> list[int]:
    return [(97 * i + 13 * salt) % 8000 + 100 for i in range(length)]


def complete(graph: Graph, tokens: list[int], max_tokens: int = MAX_TOKENS) -> tuple[str, int]:
    out = client(graph).completions.create(model=MODEL, prompt=tokens, max_tokens=max_tokens, temperature=0,
                                           extra_body={"ignore_eos": True})
    return out.choices[0].text, out.usage.completion_tokens


class Reference:
    """Aggregated outputs ``(text, num_tokens)`` by prompt, ``max_tokens`` MAX_TOKENS, computed on demand."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._outputs: dict[tuple[int, ...], tuple[str, int]] = {}
        self.num_starts = 0  # engines this reference started

    def record(self, tokens: Sequence[int], output: tuple[str, int]) -> None:
        """An output the caller computed on its own aggregated VLLM_ARGS graph."""
        self._outputs[tuple(tokens)] = output

    def outputs(self, prompts: Iterable[Sequence[int]], extra: Iterable[Sequence[int]] = (),
                graph: Graph | None = None) -> list[tuple[str, int]]:
        """The outputs of ``prompts``. Missing ones are computed on ``graph`` (an aggregated VLLM_ARGS graph the
        caller runs) or else on an engine started and stopped here; ``extra`` prompts (ones a later test will ask
        for) are computed too while an engine is up, but start none."""
        keys = [tuple(p) for p in prompts]
        todo = [k for k in dict.fromkeys([*keys, *(tuple(p) for p in extra)]) if k not in self._outputs]
        if todo and (graph is not None or any(k not in self._outputs for k in keys)):
            self._compute(todo, graph)
        return [self._outputs[k] for k in keys]

    def _compute(self, todo: list[tuple[int, ...]], graph: Graph | None) -> None:
        agg = graph
        if agg is None:
            self.num_starts += 1
            # No kvtier: one engine's outputs do not depend on it, and it costs CPU at start-up.
            agg = start_graph(self._log_dir, *VLLM_ARGS, "--aggregated", "1", "--no-kvtier",
                              log_name=f"reference-{self.num_starts}.log")
        try:
            for key in todo:
                self._outputs[key] = complete(agg, list(key))
        finally:
            if graph is None:
                agg.stop()
