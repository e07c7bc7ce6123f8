"""Which of `up`'s processes run under Linux's SCHED_BATCH policy (`up --cpu-sched`).

A request crosses the frontend, the router and a worker, each a process with a ZeroMQ I/O thread beside its event
loop: about ten wake-ups a request. Under the default policy (SCHED_OTHER) each wake-up preempts whatever runs on
that core, so on a saturated core the sender is switched out after every message and back in for the next one.
SCHED_BATCH marks a process as throughput-bound: the kernel never preempts a running task to run it on wake-up (it
waits for an idle core or the tick, 4 ms at HZ=250), so a process runs until its work is done and handles the
messages that came meanwhile in one turn. Measured on the serving layer alone (zero-delay mocks, 2 cores, 5
alternated pairs): 0.64-0.84 ms of server CPU a request instead of 1.01-1.21, 1,616-2,110 req/s instead of
1,161-1,334 (docs/measuring.md#the-serving-layer-alone-against-nvidia-dynamo).

The price is latency where a wake-up has to take a core from a busy process: up to a tick before a frontend waiting
on a core that a prefill engine is computing on would stream the next token. So ``auto`` batches only processes
that share no core with a real engine: all of a mock graph's, and a vLLM graph's control plane when it has cores
of its own. A vLLM worker is never batched: its engine's steps and outputs are the latency a stream sees.
"""

from __future__ import annotations

CPU_SCHED_CHOICES = ("auto", "batch", "normal")


def engine_cores(num_workers: int, num_cores: int) -> frozenset[int]:
    """The cores `up` gives its vLLM engines: worker i on core i mod the machine's cores."""
    return frozenset(i % num_cores for i in range(num_workers))


def batch_scheduled(service: str, engine: str, cpu_sched: str, control_cores: frozenset[int],
                    engine_core_ids: frozenset[int]) -> bool:
    """Whether `up` starts ``service`` (frontend, router, kvtier, planner, worker) under SCHED_BATCH.

    ``control_cores``: where the control plane is pinned (empty: unpinned, so it shares every core);
    ``engine_core_ids``: the vLLM engines' cores."""
    if cpu_sched == "normal" or (service == "worker" and engine == "vllm"):
        return False
    if cpu_sched == "batch" or engine != "vllm":
        return True
    return bool(control_cores) and control_cores.isdisjoint(engine_core_ids)
