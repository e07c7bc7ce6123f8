"""The planner's ScaleRequests acted on in Kubernetes: each pool is a Deployment whose `scale` subresource is patched.

``splitserve planner --scaler kubernetes`` runs this beside the planner, subscribed to its PUB socket. What to do
with a request is decided by ``decide_scale`` (pure, table-tested); ``KubernetesScaler`` only reads and patches
``apps/v1`` ``deployments/scale`` with the official client (optional dependency: the extra ``kubernetes``).
Scale-down is a plain replica decrease: Kubernetes picks the pod and sends SIGTERM, and the worker's preStop hook
drains it (deploy/kubernetes/).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import structlog
import zmq
import zmq.asyncio

from common.errors import ProtocolError
from common.protocol import ScaleRequest, decode
from common.security import CurveKeys
from services.planner.subscribe import subscribe_scale_requests

log = structlog.get_logger(__name__)

# The pools' Deployments in deploy/kubernetes/.
DEFAULT_DEPLOYMENTS = {"prefill": "splitserve-prefill", "decode": "splitserve-decode"}


@dataclass(frozen=True)
class ScaleAction:
    """What to do with one ScaleRequest: ``patch`` the Deployment to ``replicas``, or ``skip`` it (why)."""

    kind: Literal["patch", "skip"]
    deployment: str = ""
    replicas: int = 0
    reason: str = ""


def decide_scale(request: ScaleRequest, last_seq: int | None, spec_replicas: int | None,
                 deployments: dict[str, str], max_replicas: int) -> ScaleAction:
    """The action for ``request``, given the last seq acted on for its pool and the Deployment's spec.replicas.

    The planner republishes its targets every interval and the latest request per pool wins: an older or repeated
    seq, or a target the Deployment already has, changes nothing. ``spec_replicas`` None: the Deployment was not
    found. Targets are clamped to [0, max_replicas] (a guard against a misconfigured planner, not a policy).
    """
    deployment = deployments.get(request.pool)
    if deployment is None:
        return ScaleAction("skip", reason=f"no deployment for pool {request.pool!r}")
    if last_seq is not None and request.seq <= last_seq:
        return ScaleAction("skip", deployment, reason="stale")
    if spec_replicas is None:
        return ScaleAction("skip", deployment, reason="deployment not found")
    replicas = min(max(request.target, 0), max_replicas)
    if replicas == spec_replicas:
        return ScaleAction("skip", deployment, replicas, reason="at target")
    return ScaleAction("patch", deployment, replicas, reason=f"{spec_replicas} -> {replicas}")


def scale_patch(replicas: int) -> dict[str, Any]:
    """The body of a merge patch to a ``deployments/scale`` subresource."""
    return {"spec": {"replicas": replicas}}


class ScaleApi(Protocol):
    """The two calls of ``kubernetes.client.AppsV1Api`` the scaler uses."""

    def read_namespaced_deployment_scale(self, name: str, namespace: str) -> Any: ...

    def patch_namespaced_deployment_scale(self, name: str, namespace: str, body: dict[str, Any]) -> Any: ...


def load_apps_api() -> ScaleApi:
    """AppsV1Api from the pod's service account, else from ~/.kube/config."""
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise RuntimeError("--scaler kubernetes needs the kubernetes client: pip install 'splitserve[kubernetes]'") \
            from exc
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.AppsV1Api()


@dataclass
class KubernetesScaler:
    api: ScaleApi
    namespace: str
    deployments: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_DEPLOYMENTS))
    max_replicas: int = 64
    last_seq: dict[str, int] = field(default_factory=dict)

    def _spec_replicas(self, deployment: str) -> int | None:
        from kubernetes.client.exceptions import ApiException

        try:
            scale = self.api.read_namespaced_deployment_scale(deployment, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return int(scale.spec.replicas or 0)

    def apply(self, request: ScaleRequest) -> ScaleAction:
        """Read the pool's scale, decide, patch when the decision says so. Blocking (the client is synchronous)."""
        deployment = self.deployments.get(request.pool)
        spec = self._spec_replicas(deployment) if deployment else None
        action = decide_scale(request, self.last_seq.get(request.pool), spec, self.deployments, self.max_replicas)
        if action.kind == "patch":
            self.api.patch_namespaced_deployment_scale(action.deployment, self.namespace,
                                                       scale_patch(action.replicas))
            log.info("scaled", pool=request.pool, deployment=action.deployment, replicas=action.replicas,
                     seq=request.seq, why=request.reason)
        if action.reason != "stale":
            self.last_seq[request.pool] = request.seq
        return action

    async def follow(self, events_endpoint: str, curve: CurveKeys | None = None) -> None:
        """Act on every ScaleRequest the planner publishes at ``events_endpoint``, until cancelled. ``curve``:
        the planner's own keys (the planner lists itself as a client of its PUB)."""
        ctx = zmq.asyncio.Context()
        sub = subscribe_scale_requests(ctx, events_endpoint, curve)
        try:
            while True:
                try:
                    msg = decode(await sub.recv())
                except ProtocolError as exc:
                    log.warning("scale_event_dropped", error=str(exc))
                    continue
                if not isinstance(msg, ScaleRequest):
                    continue
                try:
                    await asyncio.to_thread(self.apply, msg)
                except Exception as exc:  # the API server may be away for a while: the next request retries
                    log.warning("scale_failed", pool=msg.pool, target=msg.target, error=repr(exc))
        finally:
            sub.close()
            ctx.term()


def pod_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (its service account's), else ``default``."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or default
    except OSError:
        return default


async def run_beside(service: Any, scaler: KubernetesScaler) -> None:
    """The planner service and the scaler following its events, until either ends (or both are cancelled)."""
    ready = asyncio.Event()
    planner = asyncio.create_task(service.run(ready))
    follow: asyncio.Task | None = None
    try:
        ready_wait = asyncio.create_task(ready.wait())
        await asyncio.wait({planner, ready_wait}, return_when=asyncio.FIRST_COMPLETED)
        ready_wait.cancel()
        if planner.done():
            return await planner
        follow = asyncio.create_task(scaler.follow(service.events_endpoint, service.config.transport.curve))
        await asyncio.wait({planner, follow}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (planner, follow):
            if task is not None:
                task.cancel()
