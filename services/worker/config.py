"""The worker process's configuration, built by the ``worker`` command (cli/cmd_worker.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.outbox import OutboxLimits
from common.protocol import Role
from common.transport import TransportConfig


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    role: Role
    model: str
    router_endpoint: str
    # Where frontends reach this worker; port 0 picks a free one (the real one is registered).
    endpoint: str = "tcp://127.0.0.1:0"
    # What the router tells frontends to dial when it is not the bound endpoint (a socket bound to 0.0.0.0
    # advertises this host's routable address or name): an endpoint, or a bare host (the bound port on it);
    # "" registers the bound endpoint (a wildcard is refused: common/addresses.py).
    advertise_endpoint: str = ""
    # The machine this worker runs on and its optional zone, registered for the router's topology.
    node: str = ""
    zone: str = ""
    engine_kind: str = "mock"
    hash_seed: int = 0
    heartbeat_interval_s: float = 0.25
    # The least time between beats when requests end (each ending asks for a beat early): under load, at most
    # one beat per gap instead of one per request.
    early_report_gap_s: float = 0.02
    register_timeout_s: float = 2.0
    metrics_port: int = 0  # 0: no Prometheus endpoint
    metrics_host: str = "127.0.0.1"  # bind address of /metrics
    drain_timeout_s: float = 30.0
    drain_quiet_s: float = 0.5
    drain_transfer_grace_s: float = 2.0
    # The engine serves either side of P/D (vLLM kv_both, the mock engine): routers may move this worker
    # between the prefill and decode pools in place (SetRole; docs/architecture.md#roles).
    switchable: bool = False
    transport: TransportConfig = field(default_factory=TransportConfig)
    # What may wait for a slow frontend, and how long it may read nothing before its requests are aborted.
    outbox: OutboxLimits = field(default_factory=OutboxLimits)
