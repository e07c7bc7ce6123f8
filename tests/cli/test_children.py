"""Every change to the launcher's set of children is announced, whichever path makes it."""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from pathlib import Path

from cli.children import Child, ChildSet
from cli.metrics_targets import metrics_target, write_sd_file
from cli.ports import free_port, port_in_use


def child(*cmd: str) -> Child:
    return Child(service=cmd[0], cmd=list(cmd), proc=None, started_s=0.0)  # type: ignore[arg-type]


def test_start_restart_and_drain_each_rewrite_the_targets(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    seen: list[list[str]] = []

    def publish(now: Sequence[Child]) -> None:
        write_sd_file(path, [t for t in (metrics_target(c.cmd) for c in now) if t is not None])
        seen.append([g["labels"].get("worker_id", g["labels"]["service"]) for g in json.loads(path.read_text())])

    children = ChildSet(on_change=publish)
    router = child("router", "--metrics-port", "9100")
    prefill = child("worker", "--role", "prefill", "--worker-id", "prefill-0", "--metrics-port", "9101")
    children.add(router, prefill, child("planner"))  # the graph starts
    added = child("worker", "--role", "prefill", "--worker-id", "prefill-3", "--metrics-port", "9103")
    children.add(added)  # the planner scales up
    children.replace(prefill, child(*prefill.cmd))  # a crash restart: same command
    children.remove(added)  # drained
    assert seen == [["router", "prefill-0"], ["router", "prefill-0", "prefill-3"],
                    ["router", "prefill-0", "prefill-3"], ["router", "prefill-0"]]
    assert [c.service for c in children] == ["router", "worker", "planner"]


def test_port_in_use_sees_a_listener() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)


def test_up_on_a_taken_port_leaves_that_graphs_targets_alone(tmp_path: Path) -> None:
    import structlog
    from typer.testing import CliRunner

    from cli.main import app

    sd_path = tmp_path / "targets.json"
    sd_path.write_text("[]\n")  # the running graph's
    port = free_port()
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            result = CliRunner().invoke(app, ["up", "--engine", "mock", "--port", str(port),
                                              "--metrics-sd-file", str(sd_path)])
    finally:
        structlog.reset_defaults()  # `up` configured logging onto CliRunner's stream, closed now
    assert result.exit_code == 1 and "port_in_use" in result.output
    assert sd_path.read_text() == "[]\n"
