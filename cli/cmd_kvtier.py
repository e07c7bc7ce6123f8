"""`splitserve kvtier`: the shared KV-block store (host pool + NVMe)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.logs import configure_logging
from cli.options import (
    DEFAULT_ROUTER,
    CurveDir,
    LogJson,
    LogLevel,
    MetricsHost,
    Node,
    Zone,
    address_checked,
    default_node,
    transport,
)
from cli.runner import run_service


def kvtier(
    endpoint: str = typer.Option("tcp://127.0.0.1:5570", envvar="SPLITSERVE_KVTIER", help="ZeroMQ bind address"),
    advertise_endpoint: Optional[str] = typer.Option(
        None, "--advertise", help="What workers on other hosts dial, registered with the router: an endpoint "
        "(tcp://10.0.0.5:5570) or a host (the bound port on it). Needed when --endpoint binds 0.0.0.0"),
    node: Optional[str] = Node,
    zone: str = Zone,
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router(s) to register with and publish KV events to, comma-separated (\"\": standalone)"),
    tier_id: Optional[str] = typer.Option(None, help="Source id of this tier in the router's index, unique in the "
                                          "cluster (default: kvtier-NODE)"),
    host_cache_gb: float = typer.Option(1.0, help="Host-memory pool, GiB"),
    disk_cache_gb: float = typer.Option(0.0, help="NVMe tier, GiB (0: none)"),
    disk_cache_dir: Optional[Path] = typer.Option(None, help="Directory of the NVMe tier's slab file"),
    block_bytes: int = typer.Option(36864 * 32, help="Slot size: the largest KV block held, bytes (vLLM workers: "
                                    "2 * layers * kv_heads * head_dim * dtype bytes * block_size; `up` sizes it)"),
    disk_min_hits: int = typer.Option(1, help="Hits a host block needs to move to disk on eviction"),
    nixl: bool = typer.Option(True, help="Register the pool with NIXL (UCX + POSIX backends)"),
    disk_nixl: bool = typer.Option(True, help="Disk I/O through NIXL's POSIX backend (else pread/pwrite)"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    metrics_host: str = MetricsHost,
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run kvtier: a shared KV-block store (host pool + NVMe) that workers offload to and load from."""
    import shutil
    import tempfile

    from services.kvtier.pool import GIB
    from services.kvtier.service import KvTierConfig, KvTierService

    from common.addresses import check_bind_advertise, loopback_to_remote_router

    configure_logging(log_level, log_json, "kvtier")
    address_checked(check_bind_advertise, endpoint, advertise_endpoint or "", "--endpoint", "--advertise")
    if loopback_to_remote_router(advertise_endpoint or endpoint, router_endpoint):
        typer.echo(f"note: kvtier registers {advertise_endpoint or endpoint}, a loopback address, with a router on "
                   "another host: it serves workers on this host only (the router names it to no other); give "
                   "--endpoint tcp://0.0.0.0:PORT --advertise HOST for workers on other hosts to load from it",
                   err=True)
    disk_dir, made_dir = disk_cache_dir, None
    if disk_cache_gb > 0 and disk_dir is None:
        # A private directory (mkdtemp: unpredictable name, mode 0700), removed when kvtier stops.
        disk_dir = made_dir = Path(tempfile.mkdtemp(prefix="splitserve-kvtier-"))
    node = node or default_node()
    config = KvTierConfig(tier_id=tier_id or f"kvtier-{node}", endpoint=endpoint,
                          advertise_endpoint=advertise_endpoint or "",
                          router_endpoint=router_endpoint, host_bytes=int(host_cache_gb * GIB),
                          disk_bytes=int(disk_cache_gb * GIB), disk_dir=disk_dir, block_bytes=block_bytes,
                          disk_min_hits=disk_min_hits, nixl=nixl, disk_nixl=disk_nixl, metrics_port=metrics_port,
                          metrics_host=metrics_host, node=node, zone=zone, transport=transport(curve_dir, "kvtier"))
    try:
        run_service(KvTierService(config).run)
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
