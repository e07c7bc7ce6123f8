"""The launcher's worker commands (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.graph_spec import up_kv_transfer
from cli.launcher import GraphSpec, control_plane_cores, worker_command, worker_commands


def test_decode_step_budget_goes_to_decode_workers_only() -> None:
    spec = GraphSpec(engine="vllm", num_prefill=1, num_decode=1, decode_max_batched_tokens=64)
    prefill, decode = worker_commands(spec, Path("m"), "tcp://127.0.0.1:1")
    assert "--max-num-batched-tokens" not in prefill
    assert decode[decode.index("--max-num-batched-tokens") + 1] == "64"
    assert "--max-num-batched-tokens" not in worker_command(GraphSpec(), Path("m"), "tcp://127.0.0.1:1", "decode", 1)


def test_workers_get_distinct_ids() -> None:
    cmds = worker_commands(GraphSpec(num_prefill=1, num_decode=2), Path("m"), "tcp://127.0.0.1:1")
    assert [c[c.index("--worker-id") + 1] for c in cmds] == ["prefill-0", "decode-1", "decode-2"]


@pytest.mark.parametrize(
    ("roles", "num_cores", "expected"),
    [
        (["prefill", "decode"], 2, {0}),  # this machine: the control plane shares the prefill core
        (["prefill", "decode"], 16, set(range(2, 16))),  # free cores first
        (["prefill", "prefill", "decode"], 2, {1}),  # decode-2 wraps onto core 0, beside prefill-0
        (["both", "both"], 2, set()),  # aggregated, no free core: unpinned
        (["both"], 2, {1}),
        (["prefill", "decode", "decode"], 2, set()),  # decode-2 wraps onto core 0: no core is decode-free
        ([], 2, {0, 1}),
    ],
)
def test_control_plane_cores(roles: list[str], num_cores: int, expected: set[int]) -> None:
    assert control_plane_cores(roles, num_cores) == frozenset(expected)


def test_free_ports_avoid_the_ephemeral_range_and_repeats() -> None:
    from cli.launcher import _ephemeral_range, free_port

    lo, _ = _ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10_000 <= p < lo for p in ports)


def test_launcher_passes_the_mock_profile(tmp_path: Path) -> None:
    cmds = worker_commands(GraphSpec(engine="mock", mock_profile=tmp_path / "p.json"), tmp_path, "tcp://x:1")
    assert all(cmd[cmd.index("--mock-profile") + 1] == str(tmp_path / "p.json") for cmd in cmds)
    assert "--mock-profile" not in worker_commands(GraphSpec(engine="mock"), tmp_path, "tcp://x:1")[0]


@pytest.mark.parametrize(
    ("num_cores", "num_engines", "num_other", "expected"),
    [
        (2, 2, 2, 1),  # this machine, 2 engines, router + kvtier: nothing free, still one frontend
        (16, 2, 2, 12),
        (16, 2, 1, 13),  # --no-kvtier
        (8, 8, 1, 1),  # an engine on every core
        (64, 8, 3, 53),  # 2 router replicas + kvtier
        (1, 0, 0, 1),
    ],
)
def test_frontends_fit_the_free_cores(num_cores: int, num_engines: int, num_other: int, expected: int) -> None:
    from cli.launcher import frontends_that_fit

    assert frontends_that_fit(num_cores, num_engines, num_other) == expected


def test_http_limits_reach_every_frontend_command() -> None:
    from cli.http_limits import HttpLimits
    from cli.launcher import frontend_commands

    spec = GraphSpec(num_frontends=2, http_limits=HttpLimits(max_header_kib=0.5, keepalive_timeout_s=2.0,
                                                            max_connections=7))
    cmds = frontend_commands(spec, Path("m"), "tcp://127.0.0.1:1")
    assert len(cmds) == 2
    for cmd in cmds:
        assert cmd[cmd.index("--max-header-kib") + 1] == "0.5"
        assert cmd[cmd.index("--keepalive-timeout-s") + 1] == "2.0"
        assert cmd[cmd.index("--max-connections") + 1] == "7"


def test_http_limit_flags_parse_back_into_the_same_config() -> None:
    """The flags `up` writes are the frontend command's own: parsed by it, they give the limits `up` was given."""
    import inspect

    from cli.cmd_frontend import frontend
    from cli.http_limits import HttpLimits

    limits = HttpLimits(max_body_mib=1.5, max_header_kib=2.0, header_timeout_s=3.0, body_timeout_s=4.0,
                        keepalive_timeout_s=5.0, max_connections=6)
    params = inspect.signature(frontend).parameters
    args = limits.args()
    parsed = {args[i][2:].replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}
    assert set(parsed) <= set(params)
    assert HttpLimits(**{k: type(getattr(limits, k))(v) for k, v in parsed.items()}) == limits
    config = limits.http_config("127.0.0.1", 1, True)
    assert (config.max_body_bytes, config.max_header_bytes, config.max_connections) == (1572864, 2048, 6)
@pytest.mark.parametrize("mode", ["pull", "push"])
def test_every_worker_moves_kv_the_same_way(mode: str) -> None:
    cmds = worker_commands(GraphSpec(num_prefill=1, num_decode=2, kv_transfer=mode), Path("m"), "tcp://x:1")
    assert [c[c.index("--kv-transfer") + 1] for c in cmds] == [mode] * 3


def test_up_pulls_by_default() -> None:
    # Pull: the decode engine runs no NIXL progress thread beside its steps (docs/measuring.md, "Pull or push").
    cmd = worker_commands(GraphSpec(), Path("m"), "tcp://x:1")[0]
    assert cmd[cmd.index("--kv-transfer") + 1] == "pull"


@pytest.mark.parametrize(("requested", "expected"), [
    (None, "pull"),
    ("pull", "pull"),
    ("push", "push"),
])
def test_up_kv_transfer(requested, expected) -> None:
    assert up_kv_transfer(requested) == expected


def test_extra_models_get_pools_of_their_own_and_one_frontend_serves_them_all(tmp_path: Path) -> None:
    from cli.graph_spec import ExtraModel, frontend_commands

    spec = GraphSpec(engine="mock", num_prefill=1, num_decode=1, served_model_names=("tiny",),
                     lora_modules=("sql=/a",), extra_models=(ExtraModel(tmp_path / "copy", ("tiny-copy", "tc")),))
    cmds = worker_commands(spec, tmp_path / "tiny", "tcp://x:1")

    def opt(cmd: list[str], name: str) -> list[str]:
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == name]

    assert [(opt(c, "--model"), opt(c, "--worker-id"), opt(c, "--served-model-name"), opt(c, "--lora-modules"))
            for c in cmds] == [
        ([str(tmp_path / "tiny")], ["prefill-0"], ["tiny"], ["sql=/a"]),
        ([str(tmp_path / "tiny")], ["decode-1"], ["tiny"], ["sql=/a"]),
        ([str(tmp_path / "copy")], ["prefill-2"], ["tiny-copy"], []),
        ([str(tmp_path / "copy")], ["decode-3"], ["tiny-copy"], [])]
    (frontend,) = frontend_commands(spec, tmp_path / "tiny", "tcp://x:1")
    assert (opt(frontend, "--model"), opt(frontend, "--served-model-name")) == (
        [str(tmp_path / "tiny"), str(tmp_path / "copy")], ["tiny", "tiny-copy,tc"])
