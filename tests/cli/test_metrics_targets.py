"""`up`'s Prometheus file-SD targets: one per service process, from its command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.graph_spec import GraphSpec, kvtier_command, router_command, worker_commands
from cli.metrics_targets import MetricsTarget, metrics_target, sd_groups, write_sd_file


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        (["router", "--endpoint", "tcp://127.0.0.1:1", "--metrics-port", "9100"],
         MetricsTarget("router", "127.0.0.1:9100")),
        (["worker", "--role", "decode", "--worker-id", "decode-1", "--metrics-port", "9101"],
         MetricsTarget("worker", "127.0.0.1:9101", "decode", "decode-1")),
        (["kvtier", "--metrics-port", "9102"], MetricsTarget("kvtier", "127.0.0.1:9102")),
        (["frontend", "--host", "127.0.0.1", "--port", "8000"], MetricsTarget("frontend", "127.0.0.1:8000")),
        (["frontend", "--host", "0.0.0.0", "--port", "8000"], MetricsTarget("frontend", "127.0.0.1:8000")),
        (["frontend", "--host", "::1", "--port", "8000"], MetricsTarget("frontend", "[::1]:8000")),
        (["frontend", "--host", "198.18.0.2", "--port", "8000"], MetricsTarget("frontend", "198.18.0.2:8000")),
        (["planner", "--router", "tcp://127.0.0.1:1"], None),  # the planner has no metrics
        (["router", "--endpoint", "tcp://127.0.0.1:1"], None),  # no --metrics-port: nothing to scrape
    ],
)
def test_target_of_each_child_command(cmd: list[str], expected: MetricsTarget | None) -> None:
    assert metrics_target(cmd) == expected


def test_every_child_up_starts_has_a_distinct_metrics_port() -> None:
    spec = GraphSpec(engine="mock", num_prefill=1, num_decode=2)
    cmds = [router_command(spec, "tcp://127.0.0.1:1"), kvtier_command(spec, "tcp://127.0.0.1:1", "tcp://x:2"),
            *worker_commands(spec, Path("m"), "tcp://127.0.0.1:1")]
    targets = [metrics_target(c) for c in cmds]
    assert all(t is not None for t in targets)
    assert len({t.address for t in targets if t is not None}) == len(cmds)


def test_operator_chosen_metrics_ports_are_kept() -> None:
    spec = GraphSpec(router_metrics_port=9200, kvtier_metrics_port=9201)
    assert metrics_target(router_command(spec, "tcp://127.0.0.1:1")) == MetricsTarget("router", "127.0.0.1:9200")
    kvtier = kvtier_command(GraphSpec(engine="mock", kvtier_metrics_port=9201), "tcp://127.0.0.1:1", "tcp://x:2")
    assert metrics_target(kvtier) == MetricsTarget("kvtier", "127.0.0.1:9201")


def test_sd_groups_label_workers_by_role_and_id() -> None:
    groups = sd_groups([MetricsTarget("worker", "127.0.0.1:9101", "prefill", "prefill-0"),
                        MetricsTarget("router", "127.0.0.1:9100")])
    assert groups == [
        {"targets": ["127.0.0.1:9101"],
         "labels": {"job": "splitserve-worker", "service": "worker", "role": "prefill", "worker_id": "prefill-0"}},
        {"targets": ["127.0.0.1:9100"], "labels": {"job": "splitserve-router", "service": "router"}},
    ]


def test_sd_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "run" / "targets.json"
    write_sd_file(path, [MetricsTarget("router", "127.0.0.1:9100")])
    first_inode = path.stat().st_ino
    write_sd_file(path, [MetricsTarget("router", "127.0.0.1:9100"), MetricsTarget("kvtier", "127.0.0.1:9102")])
    assert [g["targets"] for g in json.loads(path.read_text())] == [["127.0.0.1:9100"], ["127.0.0.1:9102"]]
    assert path.stat().st_ino != first_inode  # renamed over, never rewritten in place
    assert [p.name for p in path.parent.iterdir()] == ["targets.json"]  # no temp file left


def test_several_frontends_each_scraped_on_their_own_metrics_port() -> None:
    from cli.graph_spec import (
        GraphSpec,
        PlannerSpec,
        frontend_commands,
        planner_command,
    )

    one = frontend_commands(GraphSpec(port=8123), Path("m"), "tcp://127.0.0.1:1")
    assert [metrics_target(c).address for c in one] == ["127.0.0.1:8123"]
    three = frontend_commands(GraphSpec(port=8123, num_frontends=3), Path("m"), "tcp://127.0.0.1:1")
    assert {c[c.index("--port") + 1] for c in three} == {"8123"}  # one shared HTTP port
    addresses = [metrics_target(c).address for c in three]
    assert len(set(addresses)) == 3 and "127.0.0.1:8123" not in addresses
    spec = GraphSpec(planner=PlannerSpec(slo="ttft_ms=1,itl_ms=1"))
    cmd = planner_command(spec, "tcp://r", "tcp://e", [f"http://{a}/metrics" for a in addresses])
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--metrics-url"] == [f"http://{a}/metrics" for a in addresses]
    assert "--role-switch" not in cmd
    switching = GraphSpec(planner=PlannerSpec(slo="ttft_ms=1,itl_ms=1", role_switch=True))
    assert "--role-switch" in planner_command(switching, "tcp://r", "tcp://e")
