"""Planner defaults the CLI shows as well (no imports here, so `splitserve --help` stays fast)."""

SLO = "ttft_ms=1000,itl_ms=100"  # p90 targets
INTERVAL_S = 5.0  # between decisions
WINDOW_S = 30.0  # each decision reads the last this-many seconds of metrics
MAX_PREFILL = 4  # workers in the prefill pool, at most
MAX_DECODE = 4
MAX_WORKERS = 8  # prefill + decode, e.g. the machine's cores or GPUs
EVENTS_ENDPOINT = "tcp://127.0.0.1:5590"  # `splitserve planner`'s PUB socket for ScaleRequests
