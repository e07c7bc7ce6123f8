"""CURVE for the vLLM kvtier connector's client, which runs inside vLLM's engine processes and so gets its keys as a
path in ``kv_connector_extra_config``: the client the connector builds from that config (``tier_client_config``,
the very call in its ``__init__``) is served by a kvtier with CURVE on; one built without keys, or with a valid key
kvtier does not list, is refused, and kvtier keeps serving. The real-engine path: tests/e2e/test_curve_vllm.py."""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path

import pytest

from common.errors import SplitserveError
from common.kvtier.sync_client import SyncTierClient
from common.security import load_curve_keys, make_curve_keys
from common.transport import TransportConfig
from services.worker.engines.vllm.tier.settings import tier_client_config
from tests.common.kvtier.test_sync_client import BLOCK_BYTES, kvtier_service


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Path]:
    ours, theirs = make_curve_keys(tmp_path / "ours"), make_curve_keys(tmp_path / "theirs")
    # Another cluster's worker that knows our kvtier's public key (public keys are no secret): a valid CURVE
    # client whose key our kvtier does not list.
    outsider = tmp_path / "outsider"
    shutil.copytree(theirs / "worker", outsider)
    shutil.copy(ours / "worker" / "servers" / "kvtier.key", outsider / "servers" / "kvtier.key")
    return {"root": ours, "worker": ours / "worker", "kvtier": ours / "kvtier", "outsider": outsider}


@pytest.fixture()
def kvtier(keys):
    yield from kvtier_service(transport=TransportConfig(curve=load_curve_keys(keys["kvtier"])))


def _extra(endpoint: str, curve_dir: Path | None) -> dict:
    extra = {"kvtier_endpoint": endpoint, "worker_id": "w", "lookup_timeout_s": 0.5}
    return extra | ({"curve_dir": str(curve_dir)} if curve_dir is not None else {})


def _stored(client: SyncTierClient, blocks: list[tuple[int, bytes]], timeout_s: float = 5.0) -> int:
    client.store(blocks)
    deadline = time.monotonic() + timeout_s
    while client.num_stored + client.num_dropped < len(blocks) and time.monotonic() < deadline:
        time.sleep(0.01)
    return client.num_stored


def test_connector_client_with_keys_served_without_refused(kvtier, keys) -> None:
    blocks = [(10 + i, bytes([i]) * BLOCK_BYTES) for i in range(3)]
    for who in (None, keys["outsider"]):
        refused = SyncTierClient(tier_client_config(_extra(kvtier.endpoint, who)))
        try:
            assert refused.probe([10]) == 0 and refused.num_failures == 1  # no handshake: a timeout, a recompute
            refused._down_until = 0.0  # past its backoff: a store is tried, and goes nowhere
            assert _stored(refused, blocks, timeout_s=3.0) == 0
        finally:
            refused.close()
    assert kvtier.store is not None and kvtier.store.index.num_used("host") == 0  # nothing planted
    client = SyncTierClient(tier_client_config(_extra(kvtier.endpoint, keys["worker"])))
    try:
        assert _stored(client, blocks) == 3
        assert client.probe([10, 11, 12, 13]) == 3
        assert client.fetch([10, 11], BLOCK_BYTES, 2.0) == [blocks[0][1], blocks[1][1]]
    finally:
        client.close()


def test_connector_refuses_keys_others_can_read(keys) -> None:
    (keys["worker"] / "worker.key_secret").chmod(0o644)
    with pytest.raises(SplitserveError, match="readable by others"):
        tier_client_config(_extra("tcp://127.0.0.1:1", keys["worker"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_engine_hands_the_connector_a_key_path_not_key_material(keys) -> None:
    from services.worker.engines.vllm.config import VllmEngineConfig
    from services.worker.engines.vllm.engine import VllmEngine

    for role in ("both", "decode"):
        cfg = VllmEngine(VllmEngineConfig(model=Path("m"), kv_role=role, kvtier_endpoint="tcp://127.0.0.1:1",
                                          kvtier_curve_dir=str(keys["worker"])))._kv_transfer_config()
        extra = cfg.kv_connector_extra_config
        tier = extra["connectors"][1]["kv_connector_extra_config"] if role == "decode" else extra
        assert tier["curve_dir"] == str(keys["worker"])
        secret = load_curve_keys(keys["worker"]).secret
        assert secret.decode() not in repr(cfg)  # vLLM logs its config: a path there reveals nothing
