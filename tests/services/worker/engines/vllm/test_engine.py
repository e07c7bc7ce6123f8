"""Proof that prefill on one vLLM engine + NIXL pull + decode on another equals aggregated output.

Two real engine processes (``tests.harness.vllm_smoke``), each pinned to its own core, fp32, tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from common.errors import ModelError
from common.protocol import KvTransferParams, SamplingParams
from common.tiny_model import make_tiny_model
from services.worker.engine import EngineRequest
from tests.services.worker.handoff_contract import Outcome, check_handoff

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

REPO = Path(__file__).resolve().parents[5]  # the checkout: `python -m tests.harness.vllm_smoke` runs from it
PROMPT_LENGTHS = (5, 17, 64, 100, 700)  # 64: the prompt ends exactly on a block boundary (block 32)
MAX_TOKENS = 12
START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SmokeEngine:
    """One engine process spoken to with JSON lines."""

    def __init__(self, model: Path, core_id: int, engine_id: str, kv_role: str, log_dir: Path,
                 kv_transfer: str = "pull") -> None:
        from services.worker.engines.vllm.config import (
            VllmEngineConfig,
            engine_process_env,
        )

        port = _free_port()
        config = VllmEngineConfig(
            model=model, dtype="float32", kv_role=kv_role, nixl_side_channel_port=port, engine_id=engine_id,
            kv_transfer=kv_transfer,
        )
        fields = {
            "model": str(model),
            "dtype": "float32",
            "kv_role": kv_role,
            "nixl_side_channel_port": port,
            "engine_id": engine_id,
            "kv_transfer": kv_transfer,
        }
        env = {**os.environ, **engine_process_env(config, core_id), "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
        self.log_path = log_dir / f"{engine_id}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.vllm_smoke", json.dumps(fields)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        # A reader thread, so a hung engine fails the test at a timeout instead of hanging it.
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # end of stream

    def read(self, timeout_s: float) -> dict[str, Any]:
        while True:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no answer within {timeout_s} s; log: {self.log_path}") from None
            if not line:
                raise AssertionError(f"engine exited (rc={self.proc.poll()}); log: {self.log_path}")
            if line.startswith("SMOKE "):
                answer = json.loads(line[len("SMOKE ") :])
                if "error" in answer:
                    raise AssertionError(f"{answer['error']} (log: {self.log_path})")
                return answer

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read(REQUEST_TIMEOUT_S)

    def request_stop(self) -> None:
        """Ask the engine to shut down, without waiting (vLLM's takes seconds: engines stop side by side)."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # exited meanwhile, or its pipe broke: stop() kills what is left

    def stop(self) -> None:
        self.request_stop()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def stop_engines(*engines: SmokeEngine) -> None:
    """Stop engines side by side: each is asked first, then each waited for."""
    for engine in engines:
        engine.request_stop()
    for engine in engines:
        engine.stop()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny")


@pytest.fixture(scope="module")
def engines(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SmokeEngine, SmokeEngine]]:
    logs = tmp_path_factory.mktemp("logs")
    prefill = SmokeEngine(tiny_model, core_id=0, engine_id="prefill-0", kv_role="prefill", log_dir=logs)
    decode = SmokeEngine(tiny_model, core_id=1, engine_id="decode-0", kv_role="decode", log_dir=logs)
    try:
        for engine in (prefill, decode):
            ready = engine.read(START_TIMEOUT_S)
            assert ready["ready"], ready
        yield prefill, decode
    finally:
        stop_engines(prefill, decode)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(1234)
    # Ids 3.. avoid the special tokens (0-2 are end-of-text / ChatML markers).
    return [rng.integers(3, 8192, size=n).tolist() for n in PROMPT_LENGTHS]


def _generate(engine: SmokeEngine, rid: str, token_ids: list[int], sampling: dict, **extra: Any) -> dict:
    cmd = {"op": "generate", "request_id": rid, "token_ids": token_ids, "sampling": sampling}
    return engine.call({**cmd, **extra})


def _disaggregated(
    prefill: SmokeEngine, decode: SmokeEngine, rid: str, prompt: list[int], sampling: dict,
    first_slices: list[int] | None = None,
) -> list[int]:
    first = _generate(prefill, f"{rid}-p", prompt, sampling, prefill_only=True)
    assert len(first["token_ids"]) == 1 and first["kv_transfer"]["remote_engine_id"] == "prefill-0"
    kv = first["kv_transfer"]
    # As the frontend does: the prefill's prompt and the whole budget, handed off with the first token.
    rest = _generate(decode, f"{rid}-d", prompt, sampling, handoff={"first_token_id": first["token_ids"][0],
                                                                    "kv_transfer": kv})
    assert rest["finish_reason"] == "length" and not rest["transfer_failed"]
    if first_slices is not None:
        first_slices.append(rest["slices"][0])
    return first["token_ids"] + rest["token_ids"]


def test_disaggregated_equals_aggregated(engines: tuple[SmokeEngine, SmokeEngine]) -> None:
    prefill, decode = engines
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    seeded = {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    prompts = _prompts()
    # Baselines run on the prefill engine: the decode engine must not have these prompts cached locally.
    expected = [_generate(prefill, f"agg-{i}", p, greedy)["token_ids"] for i, p in enumerate(prompts)]
    # Seeded sampling: the forced first step still draws from the request's generator (vllm_first_token).
    seeded_prompt = prompts[-1][::-1][:150]
    expected_seeded = _generate(prefill, "agg-seeded", seeded_prompt, seeded)["token_ids"]

    first_slices: list[int] = []
    got = [_disaggregated(prefill, decode, f"pd-{i}", p, greedy, first_slices) for i, p in enumerate(prompts)]
    # The forced step comes out alone and empty (the frontend sends the first token then), unless vLLM merged it
    # with the next step's output for a slow reader: never for all of them.
    assert 0 in first_slices, first_slices
    got_seeded = _disaggregated(prefill, decode, "pd-seeded", seeded_prompt, seeded)

    for n, want, have in zip(PROMPT_LENGTHS, expected, got, strict=True):
        assert have == want, f"prompt of {n} tokens: disaggregated {have} != aggregated {want}"
    assert len(expected_seeded) == MAX_TOKENS and got_seeded == expected_seeded

    stats = decode.call({"op": "stats"})
    sources = stats["prompt_sources"]
    num_pulled_prompts = len(prompts) + 1
    total_prompt = sum(PROMPT_LENGTHS) + len(seeded_prompt)
    # Every prompt token's KV came over NIXL; the decode engine recomputed only each prompt's last position.
    # (vLLM counts the recomputed last position as transferred, so nothing shows as computed.)
    assert sources == {"num_computed": 0, "num_local_cache_hit": 0, "num_external_kv_transfer": total_prompt}
    counters = stats["counters"]
    assert counters["num_transfers"] == num_pulled_prompts, counters
    assert counters["num_transfer_failures"] == 0
    # 4-byte K and V, 4 layers x 2 KV heads x 64 dims, 32-token blocks: 128 KiB per block pulled.
    num_blocks = sum(-(-n // 32) for n in (*PROMPT_LENGTHS, len(seeded_prompt)))
    assert counters["num_transfer_bytes"] == num_blocks * 32 * 2 * 4 * 2 * 64 * 4


def _runner(engine: SmokeEngine):
    async def run(request: EngineRequest) -> Outcome:
        extra = {"prefill_only": request.prefill_only}
        if request.handoff is not None:
            extra["handoff"] = msgspec.to_builtins(request.handoff)
        out = _generate(engine, request.request_id, list(request.token_ids), msgspec.to_builtins(request.sampling),
                        **extra)
        kv = msgspec.convert(out["kv_transfer"], KvTransferParams) if out["kv_transfer"] else None
        return Outcome(tuple(out["token_ids"]), out["finish_reason"], kv)
    return run


@pytest.mark.parametrize("with_kv", [True, False])
async def test_the_handoff_contract(engines: tuple[SmokeEngine, SmokeEngine], with_kv: bool) -> None:
    """Pulled, or on one engine with the prompt computed again (the hand-off without KV): forced, dropped."""
    prefill, decode = engines
    prompt = tuple(_prompts()[2][::-1])  # 64 tokens: its last block full
    seeded = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=3, ignore_eos=True)
    await check_handoff(f"contract-{with_kv}", _runner(prefill), _runner(prefill),
                        _runner(decode if with_kv else prefill), prompt, seeded, with_kv)


def test_load_counts_a_prompt_as_queued_until_its_first_output(engines: tuple[SmokeEngine, SmokeEngine]) -> None:
    """WorkerLoad.num_waiting_tokens, which the router prices a prefill queue by: a prompt counts whole until its
    first output, a hand-off's (pulled, not computed) not at all, and nothing once the request is done."""
    prefill, decode = engines
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    prompt = _prompts()[-1][::-1]
    first = _generate(prefill, "queued-p", prompt, greedy, prefill_only=True)
    assert (first["max_queued_tokens"], first["queued_tokens_after"]) == (len(prompt), 0)
    rest = _generate(decode, "queued-d", prompt, greedy, handoff={"first_token_id": first["token_ids"][0],
                                                                  "kv_transfer": first["kv_transfer"]})
    assert (rest["max_queued_tokens"], rest["queued_tokens_after"]) == (0, 0) and not rest["transfer_failed"]


def test_failed_pull_recomputes(engines: tuple[SmokeEngine, SmokeEngine]) -> None:
    prefill, decode = engines
    greedy = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    prompt = _prompts()[1][::-1]
    expected = _generate(prefill, "agg-fail", prompt, greedy)["token_ids"]
    # Nothing listens on the ghost's side channel: vLLM's handshake fails (~5 s) and the prompt is recomputed.
    ghost = {
        "remote_engine_id": "ghost",
        "remote_block_ids": [7],
        "remote_host": "127.0.0.1",
        "remote_port": _free_port(),
        "remote_request_id": "ghost-req",
    }
    out = _generate(decode, "pd-fail", prompt, greedy, handoff={"first_token_id": expected[0], "kv_transfer": ghost})
    assert out["transfer_failed"] and out["finish_reason"] == "length"
    assert expected[:1] + out["token_ids"] == expected
    assert decode.call({"op": "stats"})["counters"]["num_transfer_failures"] == 1


async def test_missing_model_dir_is_a_model_error(tmp_path: Path) -> None:
    from services.worker.engines.vllm.config import VllmEngineConfig
    from services.worker.engines.vllm.engine import VllmEngine

    with pytest.raises(ModelError, match="does not exist"):
        await VllmEngine(VllmEngineConfig(model=tmp_path / "absent")).start()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    with pytest.raises(ModelError, match="not valid JSON"):
        await VllmEngine(VllmEngineConfig(model=tmp_path / "broken")).start()
