"""Frontend processes sharing one port (SO_REUSEPORT), each with its own event loop: both serve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request

from bench.lib.graph import REPO, tiny_model_dir
from cli.ports import free_port


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read()
    except OSError:
        return None


def _served(metrics: bytes) -> float:
    found = re.search(rb'splitserve_frontend_requests_total\{endpoint="/v1/models",status="200"\} ([0-9.]+)', metrics)
    return float(found.group(1)) if found else 0.0


def test_two_frontend_processes_on_one_port_both_serve(tmp_path) -> None:
    port, router = free_port(), f"tcp://127.0.0.1:{free_port()}"  # no router: /v1/models needs none
    metrics_ports = [free_port(), free_port()]
    procs = []
    try:
        for i, metrics_port in enumerate(metrics_ports):
            log = open(tmp_path / f"frontend-{i}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "cli.main", "frontend", "--model", str(tiny_model_dir()), "--router", router,
                 "--port", str(port), "--metrics-port", str(metrics_port), "--log-level", "warning"],
                cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        # A frontend opens its metrics port once its HTTP socket is bound.
        while not all(_get(f"http://127.0.0.1:{p}/metrics") for p in metrics_ports):
            assert all(p.poll() is None for p in procs), [(tmp_path / f"frontend-{i}.log").read_text() for i in range(2)]
            assert time.monotonic() < deadline, "frontends did not start"
            time.sleep(0.2)
        for _ in range(60):  # a new connection each: the kernel spreads them over both sockets
            assert _get(f"http://127.0.0.1:{port}/v1/models") is not None
        served = [_served(_get(f"http://127.0.0.1:{p}/metrics") or b"") for p in metrics_ports]
        assert all(n > 0 for n in served), served
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
