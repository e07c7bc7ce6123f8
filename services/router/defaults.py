"""Router defaults the CLI shows as well (no imports here, so `splitserve --help` stays fast)."""

# Uncached prompt tokens at or below which the decode worker prefills locally instead of sending the prompt to
# a prefill worker (no KV transfer). `splitserve plan` computes a threshold for a workload and its SLOs.
LOCAL_PREFILL_MAX_TOKENS = 256
ROUTER_ENDPOINT = "tcp://127.0.0.1:5550"  # where workers, frontends and the planner reach the router
