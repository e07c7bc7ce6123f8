"""A bare VllmEngine in its own process, driven by JSON lines: for tests and manual P/D checks.

    python -m tests.harness.vllm_smoke '<VllmEngineConfig fields as JSON>'

Reads one JSON command per stdin line, answers one stdout line prefixed ``SMOKE `` (vLLM may log to stdout
too). Commands: {"op": "generate", ...EngineRequest fields, sampling fields flat}, {"op": "stats"},
{"op": "abort", "request_id": ...}, {"op": "shutdown"}. The first answer is {"ready": true, "start_s": ...} or {"error": ...}.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from common.errors import SplitserveError
from common.protocol import Handoff, SamplingParams
from services.worker.engine import EngineRequest
from services.worker.engines.vllm.config import VllmEngineConfig
from services.worker.engines.vllm.engine import VllmEngine

PREFIX = "SMOKE "


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + msgspec.json.encode(obj).decode() + "\n")
    sys.stdout.flush()


async def _generate(engine: VllmEngine, cmd: dict[str, Any]) -> dict[str, Any]:
    handoff = cmd.get("handoff")
    request = EngineRequest(
        request_id=cmd["request_id"],
        token_ids=tuple(cmd["token_ids"]),
        sampling=msgspec.convert(cmd.get("sampling", {}), SamplingParams),
        prefill_only=bool(cmd.get("prefill_only", False)),
        handoff=msgspec.convert(handoff, Handoff) if handoff else None,
    )
    token_ids: list[int] = []
    slices: list[int] = []  # tokens per output, in order
    queued: list[int] = []  # the engine's queued prompt tokens (WorkerLoad.num_waiting_tokens) every 5 ms meanwhile

    async def sample_load() -> None:
        while True:
            queued.append(engine.load().num_waiting_tokens)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample_load())
    try:
        outputs = [out async for out in engine.generate(request)]
    finally:
        sampler.cancel()
    for out in outputs:
        token_ids.extend(out.token_ids)
        slices.append(len(out.token_ids))
        if out.finish_reason is not None:
            return {
                "token_ids": token_ids,
                "slices": slices,
                "max_queued_tokens": max(queued, default=-1),
                "queued_tokens_after": engine.load().num_waiting_tokens,
                "finish_reason": out.finish_reason,
                "num_cached_tokens": out.num_cached_tokens,
                "kv_transfer": msgspec.to_builtins(out.kv_transfer) if out.kv_transfer else None,
                "transfer_failed": out.transfer_failed,
            }
    return {"error": "stream ended without finish_reason"}


def _stats(engine: VllmEngine) -> dict[str, Any]:
    sources = engine.prompt_token_sources()
    return {
        "counters": msgspec.to_builtins(engine.counters()),
        "load": msgspec.to_builtins(engine.load()),
        "prompt_sources": {
            "num_computed": sources.num_computed,
            "num_local_cache_hit": sources.num_local_cache_hit,
            "num_external_kv_transfer": sources.num_external_kv_transfer,
        },
        "num_blocks": engine.num_blocks,
    }


async def main(config_json: str) -> int:
    fields = msgspec.json.decode(config_json)
    fields["model"] = Path(fields["model"])
    # The KV events socket beside vLLM's own (tests/services/worker/engines/vllm/conftest.py), removed with them.
    fields.setdefault("socket_dir", os.environ.get("VLLM_RPC_BASE_PATH", ""))
    engine = VllmEngine(VllmEngineConfig(**fields))
    try:
        await engine.start()
    except SplitserveError as exc:
        _answer({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _answer({"ready": True, "start_s": engine.start_s, "num_blocks": engine.num_blocks})
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            cmd = msgspec.json.decode(line)
            try:
                if cmd["op"] == "generate":
                    _answer(await _generate(engine, cmd))
                elif cmd["op"] == "stats":
                    await asyncio.sleep(0.2)  # let the last step's stats arrive
                    _answer(_stats(engine))
                elif cmd["op"] == "abort":
                    await engine.abort(cmd["request_id"])
                    _answer({"aborted": cmd["request_id"]})
                elif cmd["op"] == "shutdown":
                    break
                else:
                    _answer({"error": f"unknown op {cmd['op']!r}"})
            except SplitserveError as exc:
                _answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        await engine.shutdown()
    _answer({"bye": True})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
