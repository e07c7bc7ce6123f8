"""compose.yaml run for real by podman-compose: one container per service, mock engine, 1 prefill + 2 decode nodes,
CURVE on every socket with the keys its one-shot `keys` service made.

One image build and one compose project serve every test here (in file order); the project is always taken down,
and anything left of it force-removed, when the module ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass

import openai
import pytest

from cli.launcher import free_port
from tests.containers.podman import (
    ROOT,
    containers,
    http_get,
    metric,
    podman,
    podman_compose,
    remove_labelled,
    wait_until,
)

pytestmark = [pytest.mark.containers, pytest.mark.slow]

MODEL = "tiny"
FILES = ["compose.yaml", "compose.podman.yaml", "tests/containers/compose.two-decode.yaml"]
UP_TIMEOUT_S = 300
READY_TIMEOUT_S = 120
# Longer than the router's --local-prefill-max-tokens (256, compose.yaml): prefill runs in the prefill container,
# decode in a decode container, the (mock) KV handed between them over the compose network.
PROMPT = [200 + i for i in range(300)]
# ~29 ms a token with the mock's default timing: a stream of ~6 s, long enough to kill a worker in the middle.
MAX_TOKENS = 200
# The mock engine's KV block (36,864 bytes a token * 32 tokens): each kvtier's slot (compose.yaml's default is
# the tiny model's vLLM block).
MOCK_BLOCK_BYTES = 36864 * 32
# compose.yaml's CURVE key volumes, one per service (the `keys` service fills them).
KEY_VOLUMES = ("curve-router", "curve-worker", "curve-kvtier", "curve-frontend")


@dataclass(frozen=True)
class Project:
    name: str
    url: str
    command: list[str]
    env: dict[str, str]

    @property
    def label(self) -> str:
        return f"io.podman.compose.project={self.name}"

    def compose(self, *args: str, timeout_s: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run([*self.command, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s)

    def container(self, service: str) -> str:
        """The container name of a compose service (one replica each)."""
        names = [c["Names"][0] for c in containers(self.label)
                 if c["Labels"].get("io.podman.compose.service") == service]
        assert len(names) == 1, f"{service}: {names}"
        return names[0]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _health(url: str) -> dict:
    status, body = http_get(url + "/health")
    return json.loads(body) if status == 200 else {}


@pytest.fixture(scope="module")
def project(mock_image: str) -> Project:
    command = podman_compose()
    if command is None:
        pytest.skip("no podman-compose (`make containers-setup` installs it into the venv)")
    name = f"sstest{os.getpid()}"
    port = free_port()
    env = {**os.environ, "SPLITSERVE_IMAGE": mock_image, "SPLITSERVE_ENGINE": "mock", "SPLITSERVE_PORT": str(port),
           "SPLITSERVE_KVTIER_BLOCK_BYTES": str(MOCK_BLOCK_BYTES)}
    proj = Project(name=name, url=f"http://127.0.0.1:{port}", env=env,
                   command=[*command, "-p", name, *[a for f in FILES for a in ("-f", f)]])
    try:
        up = proj.compose("up", "-d")
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        ready = wait_until(lambda: _health(proj.url).get("num_decode_workers") == 2
                           and _health(proj.url).get("num_prefill_workers") == 1, READY_TIMEOUT_S)
        if not ready:
            logs = {c["Names"][0]: podman("logs", "--tail", "20", c["Id"]).stderr[-1500:]
                    for c in containers(proj.label)}
            pytest.fail(f"graph not ready in {READY_TIMEOUT_S} s: {_health(proj.url)}\n{logs}")
        yield proj
    finally:
        proj.compose("down", "-v", "-t", "5", timeout_s=120)
        remove_labelled(proj.label)
        podman("network", "rm", "-f", f"{name}_splitserve")
        for volume in KEY_VOLUMES:
            podman("volume", "rm", "-f", f"{name}_{volume}")


def test_podman_compose_reads_compose_yaml_unchanged() -> None:
    command = podman_compose()
    if command is None:
        pytest.skip("no podman-compose (`make containers-setup` installs it into the venv)")
    for files in (FILES[:1], FILES):
        result = subprocess.run([*command, *[a for f in files for a in ("-f", f)], "config"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "splitserve:latest" in result.stdout and "--role=decode" in result.stdout


def _busy_decode(proj: Project) -> list[str]:
    """Decode services whose engine is running a request (their Prometheus endpoint, read inside the container)."""
    busy = []
    for service in ("decode", "decode-1"):
        read = podman("exec", proj.container(service), "python3", "-c",
                      "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read()"
                      ".decode())")
        if read.returncode == 0 and metric(read.stdout, "splitserve_worker_running") > 0:
            busy.append(service)
    return busy


def test_every_service_is_its_own_container(project: Project) -> None:
    services = {c["Labels"]["io.podman.compose.service"] for c in containers(project.label) if c["State"] == "running"}
    assert services == {"router", "prefill", "decode", "decode-1", "kvtier-prefill", "kvtier-decode",
                        "kvtier-decode-1", "frontend"}
    # Workers run on nodes of their own: distinct network namespaces, each with its own address.
    addresses = {s: podman("inspect", project.container(s), "--format",
                           "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", check=True).stdout.strip()
                 for s in ("prefill", "decode", "decode-1", "router", "frontend")}
    assert len(set(addresses.values())) == len(addresses) and all(addresses.values()), addresses


def test_image_runs_non_root_and_its_healthcheck_passes(project: Project) -> None:
    frontend = project.container("frontend")
    assert podman("exec", frontend, "id", "-u", check=True).stdout.strip() == "10001"
    # The image's HEALTHCHECK, run by hand (its timer needs systemd, absent here): the frontend's /health, and a
    # worker's Prometheus port through SPLITSERVE_HEALTH_URL.
    assert podman("healthcheck", "run", frontend).returncode == 0
    assert podman("healthcheck", "run", project.container("decode")).returncode == 0
    # Nothing of the build host's CA bundle (a build secret) stayed in the image.
    assert podman("exec", frontend, "test", "-e", "/run/secrets/ca_bundle").returncode != 0


def _list_workers(proj: Project, script: str, *volumes: str) -> subprocess.CompletedProcess:
    """A shell script in a container of its own on the compose network (a peer the graph did not start), from the
    graph's image, with `splitserve router workers` at hand."""
    mounts = [a for v in volumes for a in ("-v", f"{proj.name}_{v}:/etc/splitserve/curve/{v.split('-')[1]}:ro")]
    return podman("run", "--rm", "--network", f"{proj.name}_splitserve", *mounts, "--entrypoint", "sh",
                  proj.env["SPLITSERVE_IMAGE"], "-c", script)


LIST = "splitserve router workers --router tcp://router:5550 --timeout-s 3"


def test_keys_are_made_once_and_each_service_mounts_only_its_own(project: Project) -> None:
    assert podman("inspect", project.container("keys"), "--format", "{{.State.ExitCode}}",
                  check=True).stdout.strip() == "0"
    listing = podman("exec", project.container("frontend"), "sh", "-c",
                     "ls /etc/splitserve/curve/*/ && stat -c '%a %u' /etc/splitserve/curve/frontend/*.key_secret",
                     check=True).stdout
    assert "frontend.key_secret" in listing and "router.key_secret" not in listing and "worker.key" not in listing
    assert "600 10001" in listing
    # The router runs with CURVE on: its key directory is the volume's, and the allow-list names its clients.
    clients = podman("exec", project.container("router"), "ls", "/etc/splitserve/curve/router/clients",
                     check=True).stdout.split()
    assert sorted(clients) == ["frontend.key", "kvtier.key", "worker.key"]


def test_a_peer_without_an_allowed_key_is_refused_by_the_router(project: Project) -> None:
    # No key at all: the router's CURVE handshake never completes, so no reply comes.
    plain = _list_workers(project, LIST)
    # A key of its own that knows the router's public key (the real one): the ZAP allow-list refuses it.
    stranger = _list_workers(project, "splitserve keys make --out /tmp/k >/dev/null && cp "
                             "/etc/splitserve/curve/frontend/servers/router.key /tmp/k/planner/servers/router.key && "
                             f"{LIST} --curve-dir /tmp/k", "curve-frontend")
    # The control: the same peer holding the frontend's key gets the answer.
    keyed = _list_workers(project, f"{LIST} --curve-dir /etc/splitserve/curve/frontend", "curve-frontend")
    assert keyed.returncode == 0 and "prefill-0" in keyed.stdout, keyed.stderr[-1000:]
    for refused in (plain, stranger):
        assert refused.returncode == 2 and "no reply from tcp://router:5550" in refused.stderr, refused.stderr[-1000:]
        assert "prefill-0" not in refused.stdout


def test_openai_client_streams_through_the_published_port(project: Project) -> None:
    chunks = [ch.choices[0].text for ch in project.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, seed=1, stream=True, extra_body={"ignore_eos": True})
        if ch.choices]
    assert len(chunks) >= 2 and "".join(chunks)
    chat = project.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=8)
    assert chat.choices[0].message.content


def test_killed_decode_container_mid_stream_the_request_finishes(project: Project) -> None:
    reference = project.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, seed=5,
                                                    extra_body={"ignore_eos": True}).choices[0].text
    _, before = http_get(project.url + "/metrics")
    chunks: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def stream() -> None:
        try:
            for ch in project.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, seed=5,
                                                          stream=True, extra_body={"ignore_eos": True}):
                if ch.choices:
                    chunks.append(ch.choices[0].text)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert wait_until(lambda: len(chunks) > 20, timeout_s=30), "the stream never started"
    busy = _busy_decode(project)
    assert len(busy) == 1, f"decode workers running a request: {busy}"
    podman("kill", "--signal", "KILL", project.container(busy[0]), check=True)
    killed_at = len(chunks)
    assert done.wait(60), "the stream never finished"
    thread.join(5)
    assert not errors, errors
    assert killed_at < MAX_TOKENS, "the kill came after the stream had finished"
    assert "".join(chunks) == reference
    _, after = http_get(project.url + "/metrics")
    assert metric(after, "splitserve_frontend_migrations_total") > metric(before, "splitserve_frontend_migrations_total")


def test_down_leaves_no_container(project: Project) -> None:
    down = project.compose("down", "-v", "-t", "5", timeout_s=120)
    assert down.returncode == 0, down.stderr[-2000:]
    assert containers(project.label) == []
    assert podman("network", "exists", f"{project.name}_splitserve").returncode != 0
    # `down -v`: the keys go with the project (a plain `down` keeps them for the next `up`).
    assert all(podman("volume", "exists", f"{project.name}_{v}").returncode != 0 for v in KEY_VOLUMES)
