"""`splitserve router`'s cost flags: a profile seeds the kv policy's prices, each flag overrides them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from cli.cmd_router import _cost_config
from services.router.cost import CostConfig


def test_defaults_without_profile_or_flags() -> None:
    assert _cost_config(None, {}, {}) == CostConfig()


def test_profile_then_flags(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"prefill_coeffs_s": [0.024, 0.001, 0.0], "transfer_bandwidth_bytes_per_s": 5e9,
                                   "transfer_latency_s": 0.002}))
    config = _cost_config(profile, {"cross_zone_bytes_per_s": 2e8}, {"local_prefill_factor": 2.0})
    assert config.prefill_tokens_per_s == pytest.approx(1024 / 1.048)
    assert (config.topology.same_node_bytes_per_s, config.topology.cross_zone_bytes_per_s) == (5e9, 2e8)
    assert config.local_prefill_factor == 2.0
    assert _cost_config(profile, {}, {"prefill_tokens_per_s": 500.0}).prefill_tokens_per_s == 500.0


def test_bad_value_is_a_usage_error() -> None:
    with pytest.raises(typer.BadParameter, match="same_zone_bytes_per_s"):
        _cost_config(None, {"same_zone_bytes_per_s": 0.0}, {})


def test_queue_aware_flag() -> None:
    assert _cost_config(None, {}, {"queue_aware_local": True}).queue_aware_local is True


def test_idle_decode_prefills_on_by_default_and_up_can_turn_them_off() -> None:
    from cli.cmd_router import router_config_of
    from cli.graph_spec import GraphSpec, router_command

    endpoint = ["--endpoint", "tcp://127.0.0.1:5551"]
    assert router_config_of(endpoint).policy.cost.idle_decode_prefills is True
    assert router_config_of([*endpoint, "--no-idle-decode-prefills"]).policy.cost.idle_decode_prefills is False
    assert "--no-idle-decode-prefills" not in router_command(GraphSpec(), endpoint[1])
    off = router_command(GraphSpec(router_idle_decode_prefills=False), endpoint[1])
    assert router_config_of(off[1:]).policy.cost.idle_decode_prefills is False


def test_link_min_samples_flag() -> None:
    assert _cost_config(None, {"min_samples": 5}, {}).topology.min_samples == 5
    with pytest.raises(typer.BadParameter, match="min_samples"):
        _cost_config(None, {"min_samples": 0}, {})


def test_up_passes_link_min_samples_to_the_router() -> None:
    from cli.graph_spec import GraphSpec, router_command

    cmd = router_command(GraphSpec(router_link_min_samples=32), "tcp://127.0.0.1:5550")
    assert cmd[cmd.index("--link-min-samples") + 1] == "32"
    assert "--link-min-samples" not in router_command(GraphSpec(), "tcp://127.0.0.1:5550")


def test_a_hosted_replica_takes_the_routers_own_options() -> None:
    """`frontend --router-inside "..."` parses its options as `splitserve router` does (one parser, one config)."""
    from cli.cmd_router import router_config_of

    config = router_config_of(["--endpoint", "tcp://127.0.0.1:5551", "--policy", "round-robin",
                               "--local-prefill-max-tokens", "7", "--link-min-samples", "4"])
    assert (config.endpoint, config.policy.policy, config.policy.local_prefill_max_tokens) == (
        "tcp://127.0.0.1:5551", "round-robin", 7)
    assert config.policy.cost.topology.min_samples == 4
    assert config.events_endpoint == "tcp://127.0.0.1:0"  # the router's default: --endpoint's host, a free port
    with pytest.raises(Exception, match="no-such-option"):
        router_config_of(["--no-such-option"])


def test_up_router_in_frontend_gives_each_frontend_its_replica() -> None:
    import shlex

    from cli.graph_spec import GraphSpec, router_command

    spec = GraphSpec(router_in_frontend=True, num_frontends=2)
    args = shlex.join(router_command(spec, "tcp://127.0.0.1:5552", 1)[1:])
    assert shlex.split(args)[:2] == ["--endpoint", "tcp://127.0.0.1:5552"]
