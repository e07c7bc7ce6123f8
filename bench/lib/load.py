"""A fixed list of request bodies sent ``concurrency`` at a time (closed loop), for the issue benchmarks.

`splitserve bench` drives generated workloads through ``runner.run_point``; the issue benchmarks that need
their own bodies (chat text, a mix of short and long prompts) send them here, through the same client and
summarised with the same definitions (bench/lib/metrics.py).

    result = run_load_sync(graph.url, "/v1/chat/completions", bodies, concurrency=64, expected_tokens=16)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from bench.lib.client import Client, StreamResult
from bench.lib.metrics import aggregate
from bench.lib.procs import self_cpu_s


@dataclass
class LoadResult:
    concurrency: int
    wall_s: float
    results: list[StreamResult]
    client_cpu_s: float  # this process's user+sys CPU while the load ran
    connections_opened: int

    @property
    def num_ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def num_errors(self) -> int:
        return len(self.results) - self.num_ok

    def summary(self, expected_tokens: int | None = None) -> dict[str, Any]:
        """``metrics.aggregate`` over the run (duration: its wall time), plus what a fixed load checks."""
        out = aggregate([r.timing() for r in self.results], self.wall_s)
        ok = [r for r in self.results if r.ok]
        chunks = [len(r.chunk_times_s) for r in ok]
        out.update({
            "concurrency": self.concurrency, "wall_s": round(self.wall_s, 4),
            "connections_opened": self.connections_opened,
            "prompt_tokens_seen": sorted({r.prompt_tokens for r in ok}, key=lambda x: (x is None, x)),
            "completion_tokens_seen": sorted({r.completion_tokens for r in ok}, key=lambda x: (x is None, x)),
            "content_chunks": {"min": min(chunks) if chunks else None, "max": max(chunks) if chunks else None,
                               "mean": round(sum(chunks) / len(chunks), 2) if chunks else None},
            "all_done": all(r.done for r in self.results),
            "client_cpu_s": round(self.client_cpu_s, 4),
            "client_cpu_ms_per_request": round(self.client_cpu_s * 1e3 / max(1, len(self.results)), 4),
        })
        if expected_tokens is not None:
            out["expected_completion_tokens"] = expected_tokens
            out["all_completion_tokens_match"] = all(r.completion_tokens == expected_tokens for r in ok)
        return out


def check_tokens(res: StreamResult, completion: int | None = None, prompt: int | None = None) -> StreamResult:
    """Turns an answer whose usage disagrees with what was asked (``ignore_eos`` bodies) into an error."""
    if res.ok and completion is not None and res.completion_tokens != completion:
        res.error = f"completion_tokens {res.completion_tokens} != {completion}"
    if res.ok and prompt is not None and res.prompt_tokens != prompt:
        res.error = f"prompt_tokens {res.prompt_tokens} != {prompt}"
    return res


async def run_load(url: str, path: str, bodies: list[dict[str, Any]], concurrency: int,
                   expected_tokens: int | None = None, timeout_s: float = 120.0) -> LoadResult:
    """Send every body once, ``concurrency`` at a time. An answer is an error when its status is not 200, its
    stream lacks [DONE], or (given ``expected_tokens``) its usage shows another completion token count."""
    client = Client(url)
    results: list[StreamResult] = [StreamResult() for _ in bodies]
    todo = iter(range(len(bodies)))

    async def slot() -> None:
        for i in todo:
            await client.stream(path, bodies[i], timeout_s, results[i])
            check_tokens(results[i], expected_tokens)

    cpu0, t0 = self_cpu_s(), time.perf_counter()
    try:
        await asyncio.gather(*(slot() for _ in range(concurrency)))
    finally:
        await client.aclose()
    wall, cpu = time.perf_counter() - t0, self_cpu_s() - cpu0
    return LoadResult(concurrency, wall, results, cpu, client.opened)


def run_load_sync(url: str, path: str, bodies: list[dict[str, Any]], concurrency: int,
                  expected_tokens: int | None = None, timeout_s: float = 120.0) -> LoadResult:
    import uvloop

    return uvloop.run(run_load(url, path, bodies, concurrency, expected_tokens, timeout_s))
