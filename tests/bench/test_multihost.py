"""bench/multihost.py: UCX's lanes read from its log, and the per-link summary of raw READs, pulls and TTFT."""

from __future__ import annotations

from bench.multihost import GOAL_FRACTION, summarise, ucx_transports

UCX_LOG = """\
[1796139418.873382] [vm:1    :0]      ucp_worker.c:1997 UCX  INFO    initiator self cfg#0 rma(self/memory)  am(self/memory)
2026-12-01 15:36:58 NIXL INFO    _api.py:405 Backend UCX was instantiated
[1796139426.915941] [vm:1    :0]      ucp_worker.c:1997 UCX  INFO    initiator inter-node cfg#1 rma_am(tcp/eth0)  amo_am(tcp/eth0)  am(tcp/eth0)
[1796139427.915941] [vm:1    :0]      ucp_worker.c:1997 UCX  INFO    initiator inter-node cfg#2 rma_am(tcp/eth0)  amo_am(tcp/eth0)  am(tcp/eth0)
[1796139428.000000] [vm:7    :0]      ucp_worker.c:1997 UCX  INFO    target intra-node cfg#3 rma(sysv/memory posix/memory)  am(sysv/memory cma/memory)
"""


def test_ucx_lanes_to_other_processes_deduplicated_self_left_out() -> None:
    assert ucx_transports(UCX_LOG) == [
        "inter-node: rma_am(tcp/eth0) amo_am(tcp/eth0) am(tcp/eth0)",
        "intra-node: rma(sysv/memory posix/memory) am(sysv/memory cma/memory)",
    ]
    assert ucx_transports("no ucx here\n") == []


def _raw(gbps: float) -> dict:
    variant = {"gbps_median": gbps, "num_descriptors": 12}
    return {"kv": {"coalesced": variant, "scattered": {**variant, "num_descriptors": 756}},
            "64MiB": {"coalesced": {**variant, "num_descriptors": 1}}}


def _round(link: str, raw_gbps: float, fraction: float | None, ttfts: list[float]) -> dict:
    r = {"link": {"name": link}, "raw": _raw(raw_gbps), "ttft_ms_each": ttfts, "ttft_ms": {"p50": ttfts[0]}}
    if fraction is not None:
        r["pulls"] = {"ms_median": 40.0, "gbps_median": raw_gbps * fraction,
                      "vs_raw": {"fraction_of_raw_nixl_read": fraction}}
    return r


def test_per_link_median_fraction_and_goal() -> None:
    rounds = [_round("unshaped", 1.0, 0.9, [1800.0]), _round("dc", 0.8, 0.5, [1900.0]),
              _round("unshaped", 1.2, 0.7, [1700.0]), _round("dc", 0.9, 0.6, [2000.0])]
    s = summarise(rounds, {"ttft_ms_each": [1000.0, 1100.0, 1200.0]})
    assert s["unshaped"]["pull_fraction_of_raw_each"] == [0.9, 0.7]
    assert s["unshaped"]["pull_fraction_of_raw_median"] == 0.8
    assert s["unshaped"]["goal_met"] is (0.8 >= GOAL_FRACTION)
    assert s["dc"]["pull_fraction_of_raw_median"] == 0.55 and s["dc"]["goal_met"] is False
    assert s["dc"]["raw_64mib_gbps_each"] == [0.8, 0.9]
    # TTFT: across hosts only from unshaped rounds (median 1750) against one host (median 1100).
    assert s["ttft"]["cross_host_unshaped_ms_median"] == 1750.0
    assert s["ttft"]["same_host_ms_median"] == 1100.0
    assert s["ttft"]["cross_over_same"] == round(1750 / 1100, 3)


def test_raw_only_rounds_have_no_fraction_and_no_verdict() -> None:
    s = summarise([_round("unshaped", 1.0, None, [0.0])], None)
    assert s["unshaped"]["pull_fraction_of_raw_median"] is None
    assert s["unshaped"]["goal_met"] is None
    assert "ttft" not in s
