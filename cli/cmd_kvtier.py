"""`splitserve kvtier`: the shared KV-block store (host pool + NVMe)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.logs import configure_logging
from cli.options import (
    DEFAULT_ROUTER,
    LogJson,
    LogLevel,
)
from cli.runner import run_service


def kvtier(
    endpoint: str = typer.Option("tcp://127.0.0.1:5570", envvar="SPLITSERVE_KVTIER", help="ZeroMQ bind address"),
    advertise_endpoint: Optional[str] = typer.Option(None, "--advertise", help="Endpoint workers are told"),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router to register with and publish KV events to (\"\": standalone)"),
    tier_id: str = typer.Option("kvtier-0", help="Source id of this tier in the router's index"),
    host_cache_gb: float = typer.Option(1.0, help="Host-memory pool, GiB"),
    disk_cache_gb: float = typer.Option(0.0, help="NVMe tier, GiB (0: none)"),
    disk_cache_dir: Optional[Path] = typer.Option(None, help="Directory of the NVMe tier's slab file"),
    block_bytes: int = typer.Option(36864 * 32, help="Slot size: the largest KV block held, bytes (vLLM workers: "
                                    "2 * layers * kv_heads * head_dim * dtype bytes * block_size; `up` sizes it)"),
    disk_min_hits: int = typer.Option(1, help="Hits a host block needs to move to disk on eviction"),
    nixl: bool = typer.Option(True, help="Register the pool with NIXL (UCX + POSIX backends)"),
    disk_nixl: bool = typer.Option(True, help="Disk I/O through NIXL's POSIX backend (else pread/pwrite)"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run kvtier: a shared KV-block store (host pool + NVMe) that workers offload to and load from."""
    import shutil
    import tempfile

    from services.kvtier.pool import GIB
    from services.kvtier.service import KvTierConfig, KvTierService

    configure_logging(log_level, log_json, "kvtier")
    disk_dir, made_dir = disk_cache_dir, None
    if disk_cache_gb > 0 and disk_dir is None:
        # A private directory (mkdtemp: unpredictable name, mode 0700), removed when kvtier stops.
        disk_dir = made_dir = Path(tempfile.mkdtemp(prefix="splitserve-kvtier-"))
    config = KvTierConfig(tier_id=tier_id, endpoint=endpoint, advertise_endpoint=advertise_endpoint or "",
                          router_endpoint=router_endpoint, host_bytes=int(host_cache_gb * GIB),
                          disk_bytes=int(disk_cache_gb * GIB), disk_dir=disk_dir, block_bytes=block_bytes,
                          disk_min_hits=disk_min_hits, nixl=nixl, disk_nixl=disk_nixl, metrics_port=metrics_port)
    try:
        run_service(KvTierService(config).run)
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
