"""Other hosts' kvtiers, as the connector reaches them when the router names one (``kvtier_remote``).

The own tier (``--kvtier``) is probed and loaded from first; a named tier only for the blocks right after the
own tier's run (``common.kvtier.sources``). Each named tier gets, lazily, a probe client (scheduler side) or a
loader with its own client and NIXL agent (worker side: an agent holds one kvtier pool in ``NixlOnboarder``).
At most ``max_tiers`` are kept: a name past that is not loaded from (a recompute, with a warning), so a
misbehaving router cannot make a worker open sockets and register its KV cache without bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import structlog

from common.kvtier.client import TierClientConfig
from common.kvtier.sync_client import SyncTierClient
from services.worker.engines.vllm.tier.layout import KvLayout
from services.worker.engines.vllm.tier.loader import TierLoader
from services.worker.engines.vllm.tier.nixl import NixlOnboarder

log = structlog.get_logger(__name__)

MAX_REMOTE_TIERS = 4


class RemoteTiers:
    def __init__(self, config: TierClientConfig, use_nixl: bool, fetch_timeout_s: float,
                 max_tiers: int = MAX_REMOTE_TIERS) -> None:
        self.config = config  # the own tier's client settings; only the endpoint differs
        self.use_nixl = use_nixl
        self.fetch_timeout_s = fetch_timeout_s
        self.max_tiers = max_tiers
        self._clients: dict[str, SyncTierClient] = {}  # scheduler side
        self._loaders: dict[str, TierLoader] = {}  # worker side

    def _room(self, known: dict, endpoint: str) -> bool:
        if endpoint in known or len(known) < self.max_tiers:
            return True
        log.warning("kvtier_remote_refused", endpoint=endpoint, max_tiers=self.max_tiers)
        return False

    def probe(self, endpoint: str, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of ``block_hashes`` the tier at ``endpoint`` holds (0 on any failure)."""
        if not self._room(self._clients, endpoint):
            return 0
        client = self._clients.get(endpoint)
        if client is None:
            client = self._clients[endpoint] = SyncTierClient(dataclasses.replace(self.config, endpoint=endpoint))
        return client.probe(block_hashes)

    def loader(self, endpoint: str, layout: KvLayout, name: str) -> TierLoader | None:
        """The loader for the tier at ``endpoint`` (made on first use), None past ``max_tiers``."""
        if not self._room(self._loaders, endpoint):
            return None
        loader = self._loaders.get(endpoint)
        if loader is None:
            nixl = None
            if self.use_nixl:
                try:
                    nixl = NixlOnboarder(layout, f"{name}-r{len(self._loaders)}")
                except Exception as exc:  # registration refused: inline bytes only
                    log.warning("kvtier_nixl_unavailable", endpoint=endpoint, error=repr(exc))
            client = SyncTierClient(dataclasses.replace(self.config, endpoint=endpoint))
            loader = self._loaders[endpoint] = TierLoader(layout, client, nixl, self.fetch_timeout_s)
            log.info("kvtier_remote_added", endpoint=endpoint, nixl=nixl is not None and nixl.usable)
        return loader

    def close(self) -> None:
        for loader in self._loaders.values():
            if loader.nixl is not None:
                loader.nixl.close()
            loader.client.close()
        for client in self._clients.values():
            client.close()
        self._loaders, self._clients = {}, {}
