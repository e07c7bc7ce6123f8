"""kvtier metrics (``splitserve_kvtier_*``) in a registry of their own (tests run several kvtiers)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class KvTierMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.hits = Counter("splitserve_kvtier_hits", "Blocks served, per tier", ["tier"], registry=r)
        self.misses = Counter("splitserve_kvtier_misses", "Lookups whose first block was held nowhere",
                              registry=r)
        self.bytes_in = Counter("splitserve_kvtier_bytes_in", "Block bytes stored", registry=r)
        self.bytes_out = Counter("splitserve_kvtier_bytes_out", "Block bytes served", registry=r)
        self.stores = Counter("splitserve_kvtier_store_blocks", "Blocks offered to kvtier", ["result"], registry=r)
        self.occupancy = Gauge("splitserve_kvtier_occupancy_blocks", "Blocks held, per tier", ["tier"], registry=r)
        self.capacity = Gauge("splitserve_kvtier_capacity_blocks", "Slots, per tier", ["tier"], registry=r)
        self.evictions = Gauge("splitserve_kvtier_evictions", "Blocks dropped, per tier (cumulative)", ["tier"],
                               registry=r)
        self.demotions = Gauge("splitserve_kvtier_demotions", "Blocks moved host -> disk (cumulative)", registry=r)
        self.checksum_failures = Counter("splitserve_kvtier_checksum_failures",
                                         "Blocks whose bytes failed their checksum on read", ["tier"], registry=r)

    def set_evictions(self, host: int, disk: int, demotions: int) -> None:
        self.evictions.labels(tier="host").set(host)
        self.evictions.labels(tier="disk").set(disk)
        self.demotions.set(demotions)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
