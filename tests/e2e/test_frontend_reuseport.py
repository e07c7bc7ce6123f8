"""Frontend processes sharing one port (SO_REUSEPORT), each with its own event loop: both serve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request

from tests.harness.graph import REPO, tiny_model_dir
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


def _raw_status(port: int, request: bytes) -> int:
    """The status line's code of one request on a fresh connection (0: no answer)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        head = sock.recv(64)
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0


def test_a_header_cap_set_on_up_reaches_every_frontend(tmp_path) -> None:
    from tests.harness.graph import start_graph

    graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "1", "--no-kvtier", "--frontends", "2",
                        "--max-header-kib", "1", "--mock-speedup", "10", "--log-level", "warning")
    try:
        big = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 2048 + b"\r\n\r\n"
        small = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        # A new connection each: the kernel spreads them over both frontends (all on one: 2**-19).
        assert [_raw_status(graph.port, big) for _ in range(20)] == [431] * 20
        assert [_raw_status(graph.port, small) for _ in range(20)] == [200] * 20  # the cap is 1 KiB, not 0
    finally:
        graph.stop()


def test_frontend_processes_option_runs_and_restarts_copies(tmp_path) -> None:
    """`frontend --processes 2`: two copies on one port, each its own /metrics (P, P+1), both serving; a killed
    copy is started again; SIGTERM on the supervisor stops them all."""
    import signal

    from bench.lib.procs import children

    port, router, metrics_port = free_port(), f"tcp://127.0.0.1:{free_port()}", free_port()
    while _get(f"http://127.0.0.1:{metrics_port + 1}/metrics") is not None:  # P+1 must be free too
        metrics_port = free_port()
    log = open(tmp_path / "frontend.log", "wb")
    sup = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "frontend", "--model", str(tiny_model_dir()), "--router", router,
         "--port", str(port), "--metrics-port", str(metrics_port), "--processes", "2", "--log-level", "warning"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT)
    urls = [f"http://127.0.0.1:{metrics_port + i}/metrics" for i in range(2)]

    def wait_serving() -> None:
        deadline = time.monotonic() + 60
        while not all(_get(u) for u in urls):
            assert sup.poll() is None, (tmp_path / "frontend.log").read_text()
            assert time.monotonic() < deadline, "copies did not start"
            time.sleep(0.2)

    try:
        wait_serving()
        copies = children(sup.pid)
        assert len(copies) == 2, copies
        for _ in range(60):
            assert _get(f"http://127.0.0.1:{port}/v1/models") is not None
        served = [_served(_get(u) or b"") for u in urls]
        assert all(n > 0 for n in served), served
        victim = max(copies)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while victim in (now := children(sup.pid)) or len(now) < 2:
            assert time.monotonic() < deadline, "the killed copy was not started again"
            time.sleep(0.2)
        wait_serving()
        assert sup.poll() is None
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        assert not any(os.path.exists(f"/proc/{pid}") for pid in now)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
