"""Frontend metrics (``splitserve_frontend_*``), in a registry of their own."""

from __future__ import annotations

from collections import deque

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from common.loop_metrics import LoopCounter, LoopHistogram

# Fine enough around usual SLOs (ITL 20-100 ms, TTFT 0.2-2 s) that the planner's p90 (interpolated inside a
# bucket, as Prometheus' histogram_quantile does) is within ~10% of the true one.
_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125,
                      0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0,
                      30.0)

_LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_ISL_BUCKETS = (32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
                65536, 131072)


class FrontendMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("splitserve_frontend_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)
        self.inflight = Gauge("splitserve_frontend_inflight_requests", "Generate requests in flight", registry=r)
        # Observed several times a request (ITL once per output): the loop's own kind (common/loop_metrics.py).
        self.ttft_seconds = LoopHistogram("splitserve_frontend_ttft_seconds", "Time to first token",
                                          _LATENCY_BUCKETS_S, r)
        self.itl_seconds = LoopHistogram("splitserve_frontend_itl_seconds", "Inter-token latency",
                                         _LATENCY_BUCKETS_S, r)
        self.e2e_seconds = LoopHistogram("splitserve_frontend_request_seconds", "Request latency, end to end",
                                         _LATENCY_BUCKETS_S, r)
        # Counted when a request arrives: the planner reads the incoming mix (rate, ISL distribution), not only
        # what finished. Buckets in tokens; _count is the arrivals, _sum their prompt tokens.
        self.arrival_prompt_tokens = LoopHistogram("splitserve_frontend_arrival_prompt_tokens",
                                                   "Prompt tokens of the requests received", _ISL_BUCKETS, r)
        # max_tokens of the arrivals that set one (a client that sets none asks for the rest of the context,
        # which says nothing of its answer): the planner reads the decode load coming before it runs.
        self.arrival_max_tokens = LoopHistogram("splitserve_frontend_arrival_max_tokens",
                                                "max_tokens of the requests received that set one", _ISL_BUCKETS, r)
        self.prompt_tokens = LoopCounter("splitserve_frontend_prompt_tokens", "Prompt tokens", r)
        self.cached_tokens = LoopCounter("splitserve_frontend_cached_prompt_tokens",
                                         "Prompt tokens served from a prefix cache", r)
        self.output_tokens = LoopCounter("splitserve_frontend_output_tokens", "Generated tokens", r)
        self.cancelled = Counter("splitserve_frontend_cancelled_requests", "Requests whose client hung up",
                                 registry=r)
        self.prefill_decisions = Counter("splitserve_frontend_prefill_decisions",
                                         "Where prefill ran", ["where"], registry=r)
        self.prefill_fallbacks = Counter("splitserve_frontend_prefill_fallbacks",
                                         "Remote prefills that failed and ran on the decode worker", registry=r)
        self.transfer_failures = Counter("splitserve_frontend_kv_transfer_failures",
                                         "KV pulls that failed and were recomputed", registry=r)
        self.migrations = Counter("splitserve_frontend_migrations", "Requests moved after losing a worker",
                                  registry=r)
        self.loop_lag_seconds = Histogram("splitserve_frontend_event_loop_lag_seconds",
                                          "How late the event loop ran a timer (work blocking it)",
                                          buckets=_LOOP_LAG_BUCKETS_S, registry=r)

        # The last few latencies, for the live dashboard (histograms lose the recent picture).
        self.recent_ttft_s: deque[float] = deque(maxlen=512)
        self.recent_itl_s: deque[float] = deque(maxlen=2048)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_seconds.observe(seconds)
        self.recent_ttft_s.append(seconds)

    def observe_itl(self, seconds: float) -> None:
        self.itl_seconds.observe(seconds)
        self.recent_itl_s.append(seconds)

    def value(self, sample: str, **labels: str) -> float:
        """A sample's current value through prometheus_client's public API (0 before the first observation)."""
        return self.registry.get_sample_value(sample, labels or None) or 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """This process's metrics on a port of its own too: with several frontends sharing one HTTP port
        (SO_REUSEPORT), /metrics there answers from whichever process the kernel picked."""
        start_http_server(port, addr=host, registry=self.registry)
