"""Which of `up`'s processes run under SCHED_BATCH (cli/cpu_sched.py): a table of graphs."""

from __future__ import annotations

import pytest

from cli.cpu_sched import batch_scheduled, engine_cores
from cli.graph_spec import control_plane_cores

CONTROL = ("frontend", "router", "kvtier", "planner")


def test_engines_take_cores_round_robin() -> None:
    assert engine_cores(2, 2) == {0, 1}
    assert engine_cores(3, 2) == {0, 1}
    assert engine_cores(2, 8) == {0, 1}


@pytest.mark.parametrize("engine,cpu_sched,num_workers,num_cores,pinned,control,worker", [
    # A mock graph: no real engine anywhere, everything batched (the serving layer alone).
    ("mock", "auto", 2, 2, False, True, True),
    # vLLM, 1 prefill + 1 decode on 2 cores: the control plane shares the prefill engine's core, where a token
    # waiting for the tick would wait behind a prefill: not batched.
    ("vllm", "auto", 2, 2, True, False, False),
    # vLLM with cores to spare: the control plane has its own, batched; the engines' workers never are.
    ("vllm", "auto", 2, 8, True, True, False),
    # vLLM, control plane unpinned (--no-pin-control-plane): it may land on any engine's core.
    ("vllm", "auto", 2, 8, False, False, False),
    # The user decides.
    ("vllm", "batch", 2, 2, True, True, False),
    ("mock", "normal", 2, 2, False, False, False),
    ("vllm", "normal", 2, 8, True, False, False),
])
def test_batch_scheduled(engine: str, cpu_sched: str, num_workers: int, num_cores: int, pinned: bool,
                         control: bool, worker: bool) -> None:
    roles = ["prefill", "decode"][:num_workers]
    control_cores = control_plane_cores(roles, num_cores) if pinned else frozenset()
    cores = engine_cores(num_workers, num_cores)
    assert {s: batch_scheduled(s, engine, cpu_sched, control_cores, cores) for s in CONTROL} == \
        {s: control for s in CONTROL}
    assert batch_scheduled("worker", engine, cpu_sched, control_cores, cores) is worker
