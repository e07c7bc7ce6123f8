"""Secure defaults where people deploy: compose.yaml runs CURVE on every socket with keys its one-shot `keys`
service makes, and deploy/kubernetes/ admits only the connections each service needs (NetworkPolicies, read here
with Kubernetes' semantics for the subset they use: pod selectors by labels and `In` expressions, namespace
selectors by labels, TCP ports; no port list means every port).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.containers.kube import KUBE, build
from tests.test_deploy import COMPOSE, _kind, _opts, _resolve, _service_args  # noqa: F401

KEYS_SERVICE = "keys"
CURVE_ROOT = "/etc/splitserve/curve"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_binds_all_interfaces_only_with_curve_on_every_service(compose: dict, tmp_path: Path) -> None:
    """Every service below binds 0.0.0.0 on the compose network, so each runs CURVE: it waits for the `keys`
    one-shot service, mounts only its own kind's key volume read-only and names the root in SPLITSERVE_CURVE_DIR;
    the keys that service writes load for every kind (the layout each --curve-dir expects)."""
    from cli.cmd_tools import keys_make
    from cli.options import transport

    services = compose["services"]
    keys = services[KEYS_SERVICE]
    kinds = {_kind(compose, n) for n in services if n != KEYS_SERVICE}
    assert kinds == {"router", "worker", "kvtier", "frontend"}
    key_opts = _opts(compose, KEYS_SERVICE)
    assert _resolve(_service_args(keys))[0] == "keys make" and "--if-absent" in key_opts, \
        "compose reruns the service at every `up`: new keys would lock out the running services"
    assert set(key_opts["--services"].split(",")) == kinds
    assert sorted(keys["volumes"]) == sorted(f"curve-{k}:{key_opts['--out']}/{k}" for k in kinds)
    assert key_opts["--out"] == CURVE_ROOT and keys.get("network_mode") == "none" and not keys.get("ports")
    assert set(compose["volumes"]) == {f"curve-{k}" for k in kinds}
    for name, service in services.items():
        if name == KEYS_SERVICE:
            continue
        kind = _kind(compose, name)
        assert service["environment"]["SPLITSERVE_CURVE_DIR"] == CURVE_ROOT, name
        assert service["volumes"] == [f"curve-{kind}:{CURVE_ROOT}/{kind}:ro"], f"{name}: only its own keys"
        assert service["depends_on"][KEYS_SERVICE] == {"condition": "service_completed_successfully"}, name
    # What the key service writes, run here: every kind's --curve-dir loads its own keypair and allow-lists.
    out = tmp_path / "curve"
    keys_make(out=out, if_absent=True, services=key_opts["--services"])
    for kind in kinds:
        config = transport(out, kind)
        assert config.curve is not None and config.curve.service == kind


# ------------------------------------------------------------------------------------------- NetworkPolicies
LABEL = "app.kubernetes.io/component"
MONITORING = {"kubernetes.io/metadata.name": "monitoring", "splitserve.io/metrics": "allowed"}
ELSEWHERE = {"kubernetes.io/metadata.name": "default"}
OWN_NAMESPACE = {"kubernetes.io/metadata.name": "splitserve"}


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", f"this reader knows only In: {expr}"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _peer_matches(peer: dict, pod: dict[str, str], namespace: dict[str, str]) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, peer
    if "namespaceSelector" in peer:
        return _selects(peer["namespaceSelector"], namespace) and _selects(peer.get("podSelector", {}), pod)
    return namespace == OWN_NAMESPACE and _selects(peer["podSelector"], pod)


def admitted(policies: list[dict], src: dict[str, str], src_ns: dict[str, str], dst: dict[str, str],
             port: int) -> bool:
    """Whether a TCP connection from pod src (in namespace src_ns) to port of pod dst (in our namespace) is let
    in: refused when some policy selects dst and no rule of the ones that select it admits it."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], dst)]
    if not selecting:
        return True
    for policy in selecting:
        assert policy["spec"]["policyTypes"] == ["Ingress"], policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            port_ok = ports is None or any(p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in ports)
            peers = rule.get("from")
            peer_ok = peers is None or any(_peer_matches(peer, src, src_ns) for peer in peers)
            if port_ok and peer_ok:
                return True
    return False


def _pods(docs: list[dict]) -> dict[str, tuple[dict[str, str], dict[str, int]]]:
    """Each component's pod labels and its containers' named ports."""
    out = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            template = doc["spec"]["template"]
            ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            out[template["metadata"]["labels"][LABEL]] = (template["metadata"]["labels"], ports)
    return out


# (source component or None for a pod of another namespace, its namespace, destination, its named port) -> let in.
NEEDED = [
    (None, ELSEWHERE, "frontend", "http"),              # clients (through an Ingress/Gateway)
    ("planner", OWN_NAMESPACE, "frontend", "http"),     # the planner reads the frontends' /metrics
    ("frontend", OWN_NAMESPACE, "router", "rpc"),
    ("prefill", OWN_NAMESPACE, "router", "rpc"),
    ("decode", OWN_NAMESPACE, "router", "rpc"),
    ("kvtier", OWN_NAMESPACE, "router", "rpc"),
    ("planner", OWN_NAMESPACE, "router", "rpc"),
    ("prefill", OWN_NAMESPACE, "router", "events"),
    ("kvtier", OWN_NAMESPACE, "router", "events"),
    ("frontend", OWN_NAMESPACE, "prefill", "rpc"),
    ("frontend", OWN_NAMESPACE, "decode", "rpc"),
    ("decode", OWN_NAMESPACE, "prefill", "nixl"),       # vLLM's NIXL side channel
    ("prefill", OWN_NAMESPACE, "decode", "nixl"),
    ("prefill", OWN_NAMESPACE, "kvtier", "kv"),
    ("decode", OWN_NAMESPACE, "kvtier", "kv"),
    (None, MONITORING, "router", "metrics"),
    (None, MONITORING, "prefill", "metrics"),
    (None, MONITORING, "decode", "metrics"),
    (None, MONITORING, "kvtier", "metrics"),
]
REFUSED = [
    (None, ELSEWHERE, "router", "rpc"),                 # a stranger pod: not even a CURVE handshake
    (None, ELSEWHERE, "prefill", "rpc"),
    (None, ELSEWHERE, "decode", "nixl"),                # the side channel and UCX have no authentication
    (None, ELSEWHERE, "kvtier", "kv"),
    (None, ELSEWHERE, "router", "metrics"),
    (None, OWN_NAMESPACE, "router", "rpc"),             # an unlabelled pod of our namespace
    ("frontend", OWN_NAMESPACE, "prefill", "nixl"),     # the internet-facing pod never reaches KV paths
    ("frontend", OWN_NAMESPACE, "kvtier", "kv"),
    ("frontend", OWN_NAMESPACE, "router", "events"),
    ("planner", OWN_NAMESPACE, "prefill", "rpc"),
    (None, MONITORING, "router", "rpc"),                # the scraper gets metrics only
    (None, MONITORING, "prefill", "nixl"),
]


@pytest.fixture(scope="module")
def kube_docs(tmp_path_factory) -> list[dict]:
    from common.security import make_curve_keys

    return build(KUBE, make_curve_keys(tmp_path_factory.mktemp("keys") / "keys"))


@pytest.mark.parametrize(("src", "src_ns", "dst", "port_name", "expected"),
                         [(*row, True) for row in NEEDED] + [(*row, False) for row in REFUSED],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_network_policies_admit_only_what_each_service_needs(kube_docs: list[dict], src, src_ns, dst, port_name,
                                                              expected: bool) -> None:
    policies = [d for d in kube_docs if d["kind"] == "NetworkPolicy"]
    pods = _pods(kube_docs)
    src_labels = pods[src][0] if src else {"app": "something-else"}
    dst_labels, ports = pods[dst]
    assert admitted(policies, src_labels, src_ns, dst_labels, ports[port_name]) is expected


def test_network_policies_deny_by_default_and_cover_every_pod_and_port(kube_docs: list[dict]) -> None:
    policies = [d for d in kube_docs if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    pods = _pods(kube_docs)
    stranger = ({"app": "x"}, ELSEWHERE)
    for component, (labels, ports) in pods.items():
        for name, port in ports.items():
            # Every declared port is admitted from someone (or a pod would be unreachable) ...
            senders = [(pods[c][0], OWN_NAMESPACE) for c in pods] + [stranger, ({"app": "x"}, MONITORING)]
            assert any(admitted(policies, s, ns, labels, port) for s, ns in senders), f"{component}:{name}"
            # ... and only the frontend's HTTP from a pod we did not start.
            assert admitted(policies, *stranger, labels, port) is (component == "frontend" and name == "http"), \
                f"{component}:{name}"
    # Every worker port the manifests publish (rpc, nixl) is one the rules name or UCX's every-port rule covers.
    assert {"frontend", "router", "prefill", "decode", "kvtier", "planner"} <= set(pods)


def test_the_manifests_ship_the_policies(kube_docs: list[dict]) -> None:
    names = {d["metadata"]["name"] for d in kube_docs if d["kind"] == "NetworkPolicy"}
    assert names == {"splitserve-default-deny", "splitserve-frontend", "splitserve-router", "splitserve-workers",
                     "splitserve-kvtier"}
    assert all(d["metadata"]["namespace"] == "splitserve" for d in kube_docs if d["kind"] == "NetworkPolicy")
    assert "splitserve.io/metrics=allowed" in (KUBE / "README.md").read_text()
