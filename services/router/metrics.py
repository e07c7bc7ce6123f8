"""Router metrics (``splitserve_router_*``), in a registry of its own so tests can run several routers."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from common.protocol import WorkerInfo, WorkerLoad


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.routes = Counter("splitserve_router_routes", "Route decisions", ["prefill"], registry=r)
        self._routes: dict[str, Any] = {}  # observe_route's labelled children
        self._predicted: dict[tuple[str, str], Any] = {}
        self.routes_failed = Counter("splitserve_router_routes_failed", "Routes with no worker", registry=r)
        self.decision_seconds = Histogram(
            "splitserve_router_decision_seconds", "Time to hash, look up and choose", registry=r,
            buckets=(5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2),
        )
        self.predicted_hit_blocks = Counter(
            "splitserve_router_predicted_hit_blocks", "Prefill blocks the chosen worker's cached prefix saves (host/disk blocks priced in seconds)",
            registry=r)
        self.request_blocks = Counter("splitserve_router_request_blocks", "Full blocks in routed prompts",
                                      registry=r)
        self.best_overlap_blocks = Counter(
            "splitserve_router_best_overlap_blocks", "Prefill blocks saved on the best worker, chosen or not (host/disk blocks priced in seconds)",
            registry=r)
        self.events_applied = Counter("splitserve_router_kv_events_applied", "KV events applied", registry=r)
        self.events_stale = Counter("splitserve_router_kv_events_stale",
                                    "Workers that promised KV events and went silent while getting requests",
                                    registry=r)
        self.index_blocks = Gauge("splitserve_router_index_blocks", "Blocks in the prefix index (all workers)",
                                  registry=r)
        self.event_gaps = Counter("splitserve_router_kv_event_gaps", "Event-number gaps (snapshot asked)",
                                  registry=r)
        self.registrations_refused = Counter("splitserve_router_registrations_refused",
                                             "Registrations refused for a broken contract", registry=r)
        self.messages_refused = Counter("splitserve_router_messages_refused",
                                        "Messages dropped: not from the peer (identity, CURVE key kind) allowed "
                                        "to send them", ["message"], registry=r)
        self.worker_free_blocks = Gauge("splitserve_router_worker_free_blocks", "Free KV blocks per worker",
                                        ["worker_id"], registry=r)
        self.worker_running = Gauge("splitserve_router_worker_running", "Running requests per worker",
                                    ["worker_id"], registry=r)
        # Constant 1 per registered worker; its labels say where it runs (join on worker_id).
        self.worker_info = Gauge("splitserve_router_worker_info", "Registered workers and where they run",
                                 ["worker_id", "role", "node", "zone"], registry=r)
        self.predicted_prefill_seconds = Histogram(
            "splitserve_router_predicted_prefill_seconds",
            "kv policy: predicted seconds until a routed prompt's KV is on its decode worker (queue + prefill + move)",
            ["where", "relation"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
        self.link_bandwidth = Gauge(
            "splitserve_router_link_bandwidth_bytes_per_second",
            "KV pull bandwidth learned per node pair (median of recent decode-worker samples)",
            ["src_node", "dst_node"], registry=r)
        # Seeded with the configured (or profiled) speeds, so a scrape shows what the cost uses before any load.
        self.tier_bandwidth = Gauge(
            "splitserve_router_tier_bytes_per_second",
            "KV tier load bandwidth the router prices tier blocks with (fitted to recent worker tier loads; "
            "the configured seed until a tier has some)", ["tier"], registry=r)
        self.tier_latency = Gauge(
            "splitserve_router_tier_latency_seconds", "Fixed seconds per KV tier load the router prices with",
            ["tier"], registry=r)
        self.tier_samples = Counter("splitserve_router_tier_load_samples", "Worker KV tier loads reported",
                                    ["tier"], registry=r)
        self.transfer_samples = Counter(
            "splitserve_router_transfer_samples", "KV transfer samples (pulls and pushes) reported by workers, by "
            "whether a link learned from them", ["used"], registry=r)
        # A mock engine's made-up transfers and tier loads: no link or tier speed is learned from them.
        self.simulated_samples = Counter(
            "splitserve_router_simulated_samples", "Simulated samples (mock engine) workers reported, ignored for "
            "link and tier speed learning, by kind (transfer, tier_load)", ["kind"], registry=r)
        # Constant 1 per registered worker at its current role (a SetRole moves it: docs/architecture.md#roles).
        self.worker_role = Gauge("splitserve_router_worker_role", "Each worker's current role", ["worker_id", "role"],
                                 registry=r)
        self.role_switches = Counter("splitserve_router_role_switches", "SetRole requests by outcome",
                                     ["result"], registry=r)
        self.role_switch_seconds = Histogram(
            "splitserve_router_role_switch_seconds", "SetRole: from the router's decision to the worker serving "
            "its new role (the worker confirmed, the registry moved it)", registry=r,
            buckets=(1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.worker_waiting = Gauge("splitserve_router_worker_waiting", "Queued requests per worker",
                                    ["worker_id"], registry=r)

    def observe_route(self, choice, num_blocks: int, seconds: float) -> None:
        where = "remote" if choice.prefill_worker_id else "local"
        routes = self._routes.get(where)  # a labelled child looked up once, not per route (a lock and a tuple each)
        if routes is None:
            routes = self._routes[where] = self.routes.labels(prefill=where)
        routes.inc()
        self.decision_seconds.observe(seconds)
        self.request_blocks.inc(num_blocks)
        # Credits as the cost function sees them, in blocks' worth of prefill: a device block 1, a host or disk
        # block (recompute s - fetch s) / recompute s on that worker, in [0, 1] (services/router/tier_credit.py).
        self.predicted_hit_blocks.inc(choice.decode.overlap_blocks)
        self.best_overlap_blocks.inc(choice.decode.best_overlap_blocks)
        if choice.predicted_s > 0:
            key = (where, choice.relation)
            predicted = self._predicted.get(key)
            if predicted is None:
                predicted = self._predicted[key] = self.predicted_prefill_seconds.labels(where=where,
                                                                                         relation=choice.relation)
            predicted.observe(choice.predicted_s)

    def observe_load(self, worker_id: str, load: WorkerLoad) -> None:
        self.worker_free_blocks.labels(worker_id=worker_id).set(load.num_free_blocks)
        self.worker_running.labels(worker_id=worker_id).set(load.num_running)
        self.worker_waiting.labels(worker_id=worker_id).set(load.num_waiting)

    def observe_worker(self, info: WorkerInfo) -> None:
        self.forget_worker_info(info.worker_id)  # a re-registration may have moved it
        self.worker_info.labels(worker_id=info.worker_id, role=info.role, node=info.node, zone=info.zone).set(1)
        self.worker_role.labels(worker_id=info.worker_id, role=info.role).set(1)

    def forget_worker_info(self, worker_id: str) -> None:
        for labels in [s.labels for m in self.worker_info.collect() for s in m.samples
                       if s.labels.get("worker_id") == worker_id]:
            self.worker_info.remove(labels["worker_id"], labels["role"], labels["node"], labels["zone"])
        for labels in [s.labels for m in self.worker_role.collect() for s in m.samples
                       if s.labels.get("worker_id") == worker_id]:
            self.worker_role.remove(labels["worker_id"], labels["role"])

    def forget_link(self, src_node: str, dst_node: str) -> None:
        """A link back at its default: no learned figure to show."""
        try:
            self.link_bandwidth.remove(src_node, dst_node)
        except KeyError:
            pass

    def forget_worker(self, worker_id: str) -> None:
        self.forget_worker_info(worker_id)
        for gauge in (self.worker_free_blocks, self.worker_running, self.worker_waiting):
            try:
                gauge.remove(worker_id)
            except KeyError:
                pass

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
