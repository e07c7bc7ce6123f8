"""The launcher's worker commands (pure)."""

from __future__ import annotations

from pathlib import Path

from cli.launcher import GraphSpec, worker_command, worker_commands


def test_decode_step_budget_goes_to_decode_workers_only() -> None:
    spec = GraphSpec(engine="vllm", num_prefill=1, num_decode=1, decode_max_batched_tokens=64)
    prefill, decode = worker_commands(spec, Path("m"), "tcp://127.0.0.1:1")
    assert "--max-num-batched-tokens" not in prefill
    assert decode[decode.index("--max-num-batched-tokens") + 1] == "64"
    assert "--max-num-batched-tokens" not in worker_command(GraphSpec(), Path("m"), "tcp://127.0.0.1:1", "decode", 1)


def test_workers_get_distinct_ids() -> None:
    cmds = worker_commands(GraphSpec(num_prefill=1, num_decode=2), Path("m"), "tcp://127.0.0.1:1")
    assert [c[c.index("--worker-id") + 1] for c in cmds] == ["prefill-0", "decode-1", "decode-2"]
