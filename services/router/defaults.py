"""Router defaults the CLI shows as well (no imports here, so `splitserve --help` stays fast)."""

# Uncached prompt tokens at or below which the decode worker prefills locally instead of sending the prompt to
# a prefill worker (no KV transfer). `splitserve plan` computes a threshold for a workload and its SLOs.
LOCAL_PREFILL_MAX_TOKENS = 256
# ...but on a decode worker that is streaming, only when the prefill's predicted length (uncached tokens / prefill
# rate) is at most this: it stalls every stream for that long (services/router/policy.py, PolicyConfig).
LOCAL_PREFILL_MAX_STALL_S = 0.025
ROUTER_ENDPOINT = "tcp://127.0.0.1:5550"  # where workers, frontends and the planner reach the router
