"""The CLI's defaults are the services' own (one constant each, in services/<name>/defaults.py), so a command,
`up` and the launcher cannot drift apart."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from cli.cmd_planner import planner_cmd, planner_events
from cli.cmd_router import router
from cli.cmd_up import up
from cli.launcher import GraphSpec, PlannerSpec
from cli.options import DEFAULT_ROUTER
from services.planner.policy import PlannerConfig
from services.planner.service import PlannerServiceConfig
from services.planner.workload import Slo
from services.router.policy import PolicyConfig
from services.router.service import RouterConfig


def _default(command: Callable[..., object], name: str) -> object:
    return inspect.signature(command).parameters[name].default.default  # a typer.Option's default


def test_local_prefill_threshold_default_is_the_routers() -> None:
    expected = PolicyConfig().local_prefill_max_tokens
    assert _default(router, "local_prefill_max_tokens") == expected
    assert _default(up, "local_prefill_max_tokens") == expected
    assert GraphSpec().local_prefill_max_tokens == expected
    expected_ms = PolicyConfig().local_prefill_max_stall_s * 1e3
    assert _default(router, "local_prefill_max_stall_ms") == expected_ms
    assert _default(up, "local_prefill_max_stall_ms") == expected_ms
    assert GraphSpec().local_prefill_max_stall_ms == expected_ms


def test_router_endpoint_default_is_the_routers() -> None:
    assert DEFAULT_ROUTER == RouterConfig().endpoint


def test_planner_defaults_are_the_planners() -> None:
    policy = PlannerConfig(slo=Slo(1, 1))
    service = PlannerServiceConfig(router_endpoint="", metrics_urls=(), policy=policy)
    spec = PlannerSpec(slo="")
    assert _default(planner_cmd, "slo") == _default(up, "planner_slo")
    Slo.parse(_default(planner_cmd, "slo"))  # type: ignore[arg-type]
    assert _default(planner_cmd, "events") == _default(planner_events, "events")
    assert (_default(planner_cmd, "interval_s"), _default(up, "planner_interval_s"), spec.interval_s) == (
        service.interval_s,) * 3
    assert (_default(planner_cmd, "window_s"), _default(up, "planner_window_s"), spec.window_s) == (service.window_s,) * 3
    assert (_default(planner_cmd, "max_prefill"), _default(up, "max_prefill"), spec.max_prefill) == (
        policy.max_prefill,) * 3
    assert (_default(planner_cmd, "max_decode"), _default(up, "max_decode"), spec.max_decode) == (policy.max_decode,) * 3
    assert (_default(planner_cmd, "max_workers"), spec.max_workers) == (policy.max_workers,) * 2


def test_http_limit_defaults_are_the_http_servers() -> None:
    from cli.cmd_frontend import frontend
    from cli.http_limits import HttpLimits
    from services.frontend.http_messages import HttpConfig

    server = HttpConfig()
    assert HttpLimits().http_config(server.host, server.port, server.reuse_port) == server
    for name in ("max_body_mib", "max_header_kib", "header_timeout_s", "body_timeout_s", "keepalive_timeout_s",
                 "max_connections"):
        assert _default(up, name) == _default(frontend, name) == getattr(HttpLimits(), name), name
