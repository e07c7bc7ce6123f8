"""`splitserve bench` and what the issue benchmarks and tests share with it (see bench/__init__.py).

Product: ``bench`` (the whole run), ``workloads`` (deterministic generators), ``runner`` (closed/open loop),
``report`` (schema of the result documents), ``compare``, ``plots``.
Shared: ``client`` (HTTP/SSE, aiohttp), ``metrics`` (pure math), ``server`` (target, models, worker layout,
Prometheus), ``machine`` (conditions of the machine), ``graph`` (`splitserve up` as processes, for tests and
benchmarks), ``procs`` (/proc: CPU, memory, process trees), ``load`` (fixed bodies, closed loop), ``results``
(a benchmark's model, conditions and JSON file).
"""
