"""`splitserve bench`: load generation, metrics, results and plots for OpenAI-compatible servers.

Modules: ``workloads`` (deterministic generators), ``client`` (streaming HTTP client with per-chunk times),
``runner`` (closed/open loop), ``metrics`` (pure math), ``server`` (models, worker layout, /metrics deltas),
``report`` (conditions, schema), ``plots``, ``compare``, ``bench`` (the whole run).
"""
