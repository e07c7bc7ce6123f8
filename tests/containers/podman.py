"""podman for the container tests: can it run here, the mock image built from the local base, cleanup by label."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.harness.graph import wait_until  # noqa: F401  (re-exported for the container tests)

ROOT = Path(__file__).resolve().parents[2]
# `make containers-setup` imports it (debootstrap bookworm): no image registry is needed.
BASE_IMAGE = "localhost/splitserve-base:bookworm"
MOCK_IMAGE = "localhost/splitserve-test:mock"
BUILD_TIMEOUT_S = 900
COMMAND_TIMEOUT_S = 180


def podman(*args: str, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: rc {result.returncode}\n{result.stderr[-2000:]}")
    return result


def skip_reason() -> str | None:
    """Why the container tests cannot run on this machine (one line), or None."""
    if shutil.which("podman") is None:
        return "no podman (`make containers-setup` installs it, root on Debian)"
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout_s=60)
    if info.returncode != 0:
        return f"podman cannot run here: {(info.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    if podman("image", "exists", BASE_IMAGE, timeout_s=60).returncode != 0:
        return f"no local base image {BASE_IMAGE} (`make containers-setup` makes it)"
    return None


def podman_compose() -> list[str] | None:
    """The podman-compose of this venv (containers-setup installs it there), else one on PATH."""
    beside = Path(sys.executable).parent / "podman-compose"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("podman-compose")
    return [found] if found else None


def build_mock_image() -> str:
    """`make image` for the mock target from the local base; layers are cached, so a rebuild takes seconds."""
    result = subprocess.run(["make", "-s", "image", "CONTAINER_ENGINE=podman", "IMAGE_TARGET=mock",
                             f"IMAGE={MOCK_IMAGE}", f"BASE_IMAGE={BASE_IMAGE}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert result.returncode == 0, f"make image failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return MOCK_IMAGE


def containers(label: str) -> list[dict]:
    """Every container (running or not) carrying label (`key=value`), as podman's JSON."""
    out = podman("ps", "-a", "--filter", f"label={label}", "--format", "json", check=True).stdout
    return json.loads(out or "[]")


def remove_labelled(label: str) -> None:
    """Force-remove containers and pods carrying label: cleanup that also runs after a failure."""
    for item in containers(label):
        podman("rm", "-f", "-t", "0", item["Id"])
    pods = json.loads(podman("pod", "ps", "--filter", f"label={label}", "--format", "json").stdout or "[]")
    for pod in pods:
        podman("pod", "rm", "-f", pod["Id"])


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples (all label sets) in an exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
