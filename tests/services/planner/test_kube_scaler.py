"""The Kubernetes scaler: its decisions as a table, and its calls against a stand-in for AppsV1Api."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from common.protocol import ScaleRequest, encode
from services.planner.kube_scaler import (
    DEFAULT_DEPLOYMENTS,
    KubernetesScaler,
    ScaleAction,
    decide_scale,
    scale_patch,
)


def req(pool: str = "decode", target: int = 3, seq: int = 5, current: int = 2) -> ScaleRequest:
    return ScaleRequest(seq=seq, pool=pool, current=current, target=target)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "last_seq", "spec", "expected"),
    [
        # A new target: patch the pool's Deployment.
        (req(target=3), None, 2, ScaleAction("patch", "splitserve-decode", 3, "2 -> 3")),
        (req(pool="prefill", target=1), 4, 3, ScaleAction("patch", "splitserve-prefill", 1, "3 -> 1")),
        # Republished every interval: the Deployment already has it.
        (req(target=3), 4, 3, ScaleAction("skip", "splitserve-decode", 3, "at target")),
        # Older or repeated requests never undo a newer one.
        (req(target=1, seq=5), 5, 3, ScaleAction("skip", "splitserve-decode", reason="stale")),
        (req(target=1, seq=3), 5, 3, ScaleAction("skip", "splitserve-decode", reason="stale")),
        # Nothing to patch.
        (req(target=3), None, None, ScaleAction("skip", "splitserve-decode", reason="deployment not found")),
        (req(pool="aggregated"), None, 1, ScaleAction("skip", reason="no deployment for pool 'aggregated'")),
        # Clamped to [0, max_replicas]: a guard, the planner has its own bounds.
        (req(target=99), None, 2, ScaleAction("patch", "splitserve-decode", 10, "2 -> 10")),
        (req(target=-1), None, 2, ScaleAction("patch", "splitserve-decode", 0, "2 -> 0")),
        (req(target=12), None, 10, ScaleAction("skip", "splitserve-decode", 10, "at target")),
    ],
)
def test_decide_scale(request_: ScaleRequest, last_seq: int | None, spec: int | None, expected: ScaleAction) -> None:
    assert decide_scale(request_, last_seq, spec, DEFAULT_DEPLOYMENTS, max_replicas=10) == expected


def test_scale_patch_sets_only_spec_replicas() -> None:
    assert scale_patch(4) == {"spec": {"replicas": 4}}


class FakeApps:
    """AppsV1Api's two scale calls over a dict of Deployments; records the patches."""

    def __init__(self, replicas: dict[str, int]) -> None:
        self.replicas = replicas
        self.patches: list[tuple[str, str, dict[str, Any]]] = []

    def read_namespaced_deployment_scale(self, name: str, namespace: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        if name not in self.replicas:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(spec=SimpleNamespace(replicas=self.replicas[name]))

    def patch_namespaced_deployment_scale(self, name: str, namespace: str, body: dict[str, Any]) -> Any:
        self.patches.append((name, namespace, body))
        self.replicas[name] = body["spec"]["replicas"]


@pytest.fixture()
def fake() -> FakeApps:
    pytest.importorskip("kubernetes", reason="no kubernetes client (extra `kubernetes`)")
    return FakeApps({"splitserve-prefill": 1, "splitserve-decode": 1})


def test_apply_patches_once_per_new_target(fake: FakeApps) -> None:
    scaler = KubernetesScaler(fake, "serving")
    assert scaler.apply(req(target=3, seq=1)).kind == "patch"
    assert scaler.apply(req(target=3, seq=2)).reason == "at target"
    assert scaler.apply(req(target=2, seq=1)).reason == "stale"
    assert scaler.apply(req(pool="prefill", target=2, seq=3)).kind == "patch"
    assert fake.patches == [("splitserve-decode", "serving", {"spec": {"replicas": 3}}),
                            ("splitserve-prefill", "serving", {"spec": {"replicas": 2}})]


def test_apply_skips_a_missing_deployment(fake: FakeApps) -> None:
    scaler = KubernetesScaler(fake, "serving", deployments={"decode": "gone"})
    assert scaler.apply(req()).reason == "deployment not found"
    assert fake.patches == []


async def test_follow_acts_on_published_requests_and_drops_garbage(fake: FakeApps) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    scaler = KubernetesScaler(fake, "serving")
    task = asyncio.create_task(scaler.follow(f"tcp://127.0.0.1:{port}"))
    try:
        # PUB drops what is sent before the subscriber joins: publish until the patch lands, as the planner does.
        for seq in range(1, 200):
            pub.send(b"not a message")
            pub.send(encode(req(target=4, seq=seq)))
            await asyncio.sleep(0.02)
            if fake.patches:
                break
        assert fake.patches == [("splitserve-decode", "serving", {"spec": {"replicas": 4}})]
        assert not task.done()
    finally:
        task.cancel()
        pub.close()
        ctx.term()


def test_cli_scaler_without_a_cluster_exits_with_a_reason(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    result = subprocess.run([sys.executable, "-m", "cli.main", "planner", "--scaler", "kubernetes",
                             "--events", "tcp://127.0.0.1:0"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert "--scaler kubernetes" in result.stderr
    bad = subprocess.run([sys.executable, "-m", "cli.main", "planner", "--scaler", "yarn"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "none | kubernetes" in bad.stderr
