"""deploy/kubernetes/: every manifest (base and overlays) against the Kubernetes schemas, and the graph run by
`podman kube play` with the mock engine, one request served through the frontend pod.

podman kube play (4.3) is not a cluster. What it runs, and what this test therefore changes (``for_kube_play``):
- Deployments, as pods named <deployment>-pod-<n>; it has no DaemonSet, so kvtier runs as a one-replica Deployment
  (one "node"); Services, the Namespace and RBAC are ignored (no Service DNS, no API server):
  the Services' names become the pods' names, which podman's network DNS resolves; the planner is left out.
- The downward API gives only metadata fields: status.podIP becomes metadata.name (the pod's resolvable name),
  status.hostIP the kvtier pod's name, spec.nodeName one node name for all.
- Secret volumes become a hostPath with the same files: kube play 4.3 writes a Secret's values still base64-encoded
  and ignores `items`. The ConfigMap is folded into each container's env and $(VAR) in args expanded by the
  test (kube play 4.3 does neither: it leaves "$(SPLITSERVE_MODEL)" as written).
- kube play publishes every containerPort on the host: only the frontend keeps one, on 127.0.0.1 (hostPort), one
  replica; the probes' named ports become numbers.
Everything else (images, args, CURVE keys, runAsUser/fsGroup, read-only root filesystems, emptyDirs, probes)
runs as written.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cli.launcher import free_port
from common.security import make_curve_keys
from tests.containers.kube import KUBE, build, load_docs
from tests.containers.podman import http_get, podman, wait_until

pytestmark = [pytest.mark.containers]

OVERLAYS = [KUBE, KUBE / "overlays" / "mock", KUBE / "overlays" / "gpu"]
# The newest schemas kubernetes-validate bundles, and the oldest Kubernetes still commonly run.
K8S_VERSIONS = ["1.37.0", "1.30.0"]
NODE = "podman-node"
READY_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    return make_curve_keys(tmp_path_factory.mktemp("keys") / "keys")


@pytest.fixture(scope="module")
def kubernetes_validate():
    return pytest.importorskip("kubernetes_validate", reason="no kubernetes-validate (`make containers-setup`)")


# ------------------------------------------------------------------------------------------------ schemas
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.relative_to(KUBE.parent).as_posix())
def test_every_manifest_is_valid_against_the_kubernetes_schemas(overlay: Path, keys: Path,
                                                                kubernetes_validate) -> None:
    docs = build(overlay, keys)
    assert {d["kind"] for d in docs} >= {"Deployment", "DaemonSet", "Service", "Secret", "ConfigMap", "Role"}
    for version in K8S_VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_misspelled_field(keys: Path, kubernetes_validate) -> None:
    decode = copy.deepcopy(_by_name(build(KUBE, keys), "splitserve-decode"))
    decode["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(decode, K8S_VERSIONS[0], strict=True)


def _by_name(docs: list[dict], name: str, kind: str = "Deployment") -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def test_pools_drain_on_the_way_out_and_are_probed(keys: Path) -> None:
    docs = build(KUBE, keys)
    for pool in ("splitserve-prefill", "splitserve-decode"):
        spec = _pod_spec(_by_name(docs, pool))
        worker = spec["containers"][0]
        drain = float(next(a for a in worker["args"] if a.startswith("--drain-timeout-s=")).split("=")[1])
        assert spec["terminationGracePeriodSeconds"] > drain, "the grace period must cover the drain"
        assert "kill -TERM 1" in " ".join(worker["lifecycle"]["preStop"]["exec"]["command"])
        assert {"readinessProbe", "livenessProbe", "startupProbe"} <= set(worker)
        annotations = _by_name(docs, pool)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert f"--metrics-port={annotations['prometheus.io/port']}" in worker["args"]
        assert spec["securityContext"]["runAsNonRoot"] is True
    assert _by_name(docs, "splitserve-kvtier", "DaemonSet")


def test_gpu_is_a_value_of_the_gpu_overlay_only(keys: Path) -> None:
    base, gpu = build(KUBE, keys), build(KUBE / "overlays" / "gpu", keys)
    for pool in ("splitserve-prefill", "splitserve-decode"):
        assert "nvidia.com/gpu" not in json.dumps(_by_name(base, pool))
        resources = _pod_spec(_by_name(gpu, pool))["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1 and resources["requests"]["cpu"] == "2"


def test_the_scaler_role_grants_only_the_pools_scale(keys: Path) -> None:
    role = _by_name(build(KUBE, keys), "splitserve-planner-scaler", "Role")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                              "resourceNames": ["splitserve-prefill", "splitserve-decode"],
                              "verbs": ["get", "patch", "update"]}]
    planner = _pod_spec(_by_name(build(KUBE, keys), "splitserve-planner"))
    assert planner["serviceAccountName"] == "splitserve-planner"
    assert "--scaler=kubernetes" in planner["containers"][0]["args"]


def test_no_key_material_is_committed() -> None:
    for path in KUBE.rglob("*"):
        if path.is_file() and "keys" not in path.relative_to(KUBE).parts:  # keys/: the user's, git-ignored
            assert "-----BEGIN" not in path.read_text() and "secret-key" not in path.read_text(), path
    assert (KUBE / ".gitignore").read_text().split() == ["keys/"]


# --------------------------------------------------------------------------------------------- kube play
def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args (kube play 4.3 leaves them as written)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def for_kube_play(docs: list[dict], image: str, port: int, keys: Path) -> list[dict]:
    """The documents podman kube play can run (module docstring: what changes and why)."""
    text = json.dumps(docs)
    for service in {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}:
        text = text.replace(f"//{service}:", f"//{service}-pod-0:").replace(f"//{service}/", f"//{service}-pod-0/")
    docs = json.loads(text)
    config = next(d["data"] for d in docs if d["kind"] == "ConfigMap")
    kvtier_pod = "splitserve-kvtier-pod-0"
    out = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind not in ("Deployment", "DaemonSet") or name == "splitserve-planner":
            continue
        doc["kind"] = "Deployment"
        doc["spec"]["replicas"] = 1
        pod = f"{doc['metadata']['name']}-pod-0"
        spec = _pod_spec(doc)
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                volume.pop("secret")
                volume["hostPath"] = {"path": str(keys), "type": "Directory"}
        for container in spec["containers"]:
            container["image"] = image
            fields = {"metadata.name": pod, "status.podIP": pod, "status.hostIP": kvtier_pod, "spec.nodeName": NODE}
            env = dict(config) if container.pop("envFrom", None) else {}
            for item in container.get("env", []):
                ref = item.get("valueFrom", {})
                if "fieldRef" in ref:
                    env[item["name"]] = fields[ref["fieldRef"]["fieldPath"]]
                elif "value" in item:
                    env[item["name"]] = _expand(item["value"], env)
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
            container["args"] = [_expand(a, env) for a in container["args"]]
            numbers = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                for action in ("httpGet", "tcpSocket"):
                    if action in container.get(probe, {}):
                        named = container[probe][action]["port"]
                        container[probe][action]["port"] = numbers.get(named, named)
            container["ports"] = []
            if name == "splitserve-frontend":
                container["ports"] = [{"name": "http", "containerPort": 8000, "hostPort": port,
                                       "hostIP": "127.0.0.1"}]
        out.append(doc)
    return out


@dataclass(frozen=True)
class Played:
    url: str  # the frontend pod's published port
    network: str  # the pods' podman network
    keys: Path  # the Secret's files as mounted (one directory per service)
    image: str


@pytest.fixture(scope="module")
def played(mock_image: str, keys: Path, tmp_path_factory) -> Played:
    tag = f"sskube{os.getpid()}"
    port = free_port()
    # The Secret's layout on disk, as the pods' user (10001) would get it: each service's own directory of `keys
    # make` (its keypair, servers/, clients/), owned by that user, secrets 0600. The whole tree is mounted; each
    # pod's --curve-dir picks its service's directory, as it does with the Secret's items.
    mounted = tmp_path_factory.mktemp("curve")
    shutil.copytree(keys, mounted, dirs_exist_ok=True)
    for path in [mounted, *mounted.rglob("*")]:
        os.chown(path, 10001, 10001)
        path.chmod(0o755 if path.is_dir() else (0o600 if path.name.endswith("_secret") else 0o644))
    docs = for_kube_play(build(KUBE / "overlays" / "mock", keys), mock_image, port, mounted)
    play = tmp_path_factory.mktemp("kube") / "play.yaml"
    play.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    network = f"{tag}-net"
    # kube play (4.3) creates its default network even when given another: removed after, unless it was there.
    default_network = "podman-default-kube-network"
    had_default = podman("network", "exists", default_network).returncode == 0
    try:
        podman("network", "create", network, check=True)
        result = podman("kube", "play", "--network", network, str(play), timeout_s=300)
        assert result.returncode == 0, f"kube play failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        url = f"http://127.0.0.1:{port}"
        ready = wait_until(lambda: http_get(url + "/health")[0] == 200, READY_TIMEOUT_S, interval_s=0.5)
        if not ready:
            logs = {n: podman("logs", "--tail", "15", n).stderr[-1200:] for n in
                    podman("ps", "-a", "--filter", "label=app.kubernetes.io/name=splitserve", "--format",
                           "{{.Names}}").stdout.split()}
            pytest.fail(f"frontend pod not healthy in {READY_TIMEOUT_S} s: {http_get(url + '/health')}\n{logs}")
        yield Played(url, network, mounted, mock_image)
    finally:
        podman("kube", "down", str(play), timeout_s=120)
        podman("network", "rm", "-f", network)
        if not had_default:
            podman("network", "rm", default_network)


@pytest.mark.slow
def test_kube_play_serves_a_request_through_the_frontend_pod(played: Played) -> None:
    import openai

    client = openai.OpenAI(base_url=played.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(model="tiny", prompt="hello kubernetes", max_tokens=12,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 12 and out.choices[0].text
    status, body = http_get(played.url + "/health")
    health = json.loads(body)
    assert status == 200 and health["num_prefill_workers"] == 1 and health["num_decode_workers"] == 1
    # The pods run as the manifests say: non-root, with the CURVE keys from the Secret mounted read-only.
    decode = "splitserve-decode-pod-0-worker"
    assert podman("exec", decode, "id", "-u", check=True).stdout.strip() == "10001"
    listing = podman("exec", decode, "ls", "/etc/splitserve/curve/worker", "/etc/splitserve/curve/worker/clients",
                     check=True).stdout
    assert "worker.key_secret" in listing and "frontend.key" in listing


@pytest.mark.slow
def test_kube_play_router_refuses_a_peer_without_an_allowed_key(played: Played) -> None:
    """A container the manifests did not start, on the pods' network, asks the router for its workers: without a
    key, and with a key of its own that knows the router's public key, no answer comes; with the frontend's key
    from the Secret (the control) the registry comes back."""
    listing = "splitserve router workers --router tcp://splitserve-router-pod-0:5550 --timeout-s 3"

    def peer(script: str) -> subprocess.CompletedProcess:
        return podman("run", "--rm", "--network", played.network, "-v", f"{played.keys / 'frontend'}:/frontend:ro",
                      "--entrypoint", "sh", played.image, "-c", script)

    keyed = peer(f"{listing} --curve-dir /frontend")
    assert keyed.returncode == 0 and "splitserve-decode-pod-0" in keyed.stdout, keyed.stderr[-1500:]
    plain = peer(listing)
    stranger = peer("splitserve keys make --out /tmp/k >/dev/null && cp /frontend/servers/router.key "
                    f"/tmp/k/planner/servers/router.key && {listing} --curve-dir /tmp/k")
    for refused in (plain, stranger):
        assert refused.returncode == 2 and "no reply" in refused.stderr, refused.stderr[-1500:]


def test_load_docs_reads_every_file(keys: Path) -> None:
    # Every YAML file under deploy/kubernetes/ parses and is used by a kustomization.
    used = set()
    for kust in KUBE.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kust.read_text())
        used |= {(kust.parent / r).resolve() for r in spec.get("resources", [])}
        used |= {(kust.parent / p["path"]).resolve() for p in spec.get("patches", [])}
        used.add(kust.resolve())
    for path in KUBE.rglob("*.yaml"):
        assert load_docs(path), path
        assert path.resolve() in used, f"{path} is in no kustomization"
