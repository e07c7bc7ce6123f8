"""bench/peers.py's pure parts: the arms are well formed, the py-spy summary reads collapsed stacks, pairs pair the
k-th run of each arm at one rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lib.workloads import WorkloadSpec, make_workload
from bench.peers import build_parser, workload_spec
from bench.peers_arms import ARMS
from bench.peers_report import pyspy_summary, summarize, workload_label


def test_arms_are_well_formed() -> None:
    for name, arm in ARMS.items():
        assert arm.name == name and arm.system in ("splitserve", "vllm") and isinstance(arm.pd, bool)
        assert isinstance(arm.what, str) and arm.what
        if arm.system == "vllm":
            assert not arm.up_args and not arm.kv_transfer  # vLLM arms take no `up` arguments
        else:
            assert ("--aggregated" in arm.up_args) != arm.pd


def test_pyspy_summary_self_and_inclusive_shares(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text("thread (0x1);main (a.py:1);step (b.py:10);forward (c.py:5) 3\n"
                   "thread (0x1);main (a.py:1);step (b.py:12) 1\n"
                   "not a stack line\n")
    out = pyspy_summary(raw)
    assert out["samples"] == 4
    assert out["self"][0] == ["forward (c.py)", 0.75]
    assert dict(map(tuple, out["inclusive"]))["step (b.py)"] == 1.0  # two lines of one function: one row


def _run(arm: str, index: int, goodput: float) -> dict:
    results = {"goodput_requests_per_s": goodput, "requests_per_s": 1.0, "slo_attainment": 0.5,
               **{k: {"p50": 10.0, "p90": 20.0, "p99": 30.0} for k in ("ttft_ms", "itl_ms", "tpot_ms")}}
    return {"arm": arm, "index": index, "points": [{"rate": 0.25, "results": results,
                                                    "cpu_ms_per_request": {"a": 1.0}}]}


def test_pairs_are_kth_run_against_kth_run() -> None:
    runs = [_run("ss-pd", 0, 0.2), _run("vllm-pd", 1, 0.1), _run("ss-pd", 2, 0.1), _run("vllm-pd", 3, 0.4)]
    pairs = summarize(runs)["pairs"]["ss-pd/vllm-pd"]["0.25"]
    assert [(p["indices"], p["goodput_rps_ratio"]) for p in pairs] == [([0, 1], 2.0), ([2, 3], 0.25)]


def test_every_splitserve_arm_is_paired_with_each_baseline_of_its_run() -> None:
    runs = [_run("ss-pd-remote", 0, 0.3), _run("vllm-agg", 1, 0.1), _run("ss-agg", 2, 0.2), _run("vllm-pd", 3, 0.4),
            _run("vllm-pd-shipped", 4, 0.2)]
    assert sorted(summarize(runs)["pairs"]) == ["ss-agg/vllm-agg", "ss-agg/vllm-pd", "ss-pd-remote/vllm-agg",
                                                "ss-pd-remote/vllm-pd", "vllm-pd/vllm-pd-shipped"]
    assert summarize(runs)["pairs"]["ss-pd-remote/vllm-agg"]["0.25"][0]["goodput_rps_ratio"] == 3.0


@pytest.mark.parametrize("argv, kind, isl_of_first", [
    ([], "synthetic", None),
    (["--workload", "long-mix", "--isl", "64", "--long-isl", "2048", "--long-fraction", "1"], "long-mix", 2048),
    (["--workload", "shared-prefix", "--prefix-len", "1536", "--suffix-len", "64"], "shared-prefix", 1600),
    (["--workload", "multi-turn", "--isl", "128", "--turns", "2"], "multi-turn", 128),
])
def test_workload_flags_reach_the_spec(argv: list[str], kind: str, isl_of_first: int | None) -> None:
    spec = workload_spec(build_parser().parse_args(argv))
    assert spec.kind == kind and spec.describe()["kind"] == kind
    if isl_of_first is not None:
        assert make_workload(spec, 2, seed=0)[0].turns[0].isl == isl_of_first

def _serving_run(arm: str, rps: float) -> dict:
    return {"arm": arm, "requests_per_s": rps, "cpu_ms_per_request": {"server_total": 1.0}, "ttft_ms": {"p50": 40.0}}


def test_serving_layer_goal_needs_every_pair_at_the_ratio() -> None:
    from bench.peers_serving import summarize

    met = summarize([_serving_run("splitserve", 1500), _serving_run("dynamo", 900), _serving_run("splitserve", 1400),
                     _serving_run("dynamo", 900)])
    assert met["ratio_per_pair"] == {"splitserve": [1.667, 1.556]} and met["goal_met"] == {"splitserve": True}
    one_short = summarize([_serving_run("splitserve", 1500), _serving_run("dynamo", 900),
                           _serving_run("splitserve", 1300), _serving_run("dynamo", 900)])
    assert one_short["ratio_per_pair"]["splitserve"][1] == 1.444 and not one_short["goal_met"]["splitserve"]
    assert one_short["ratio_of_means"] == {"splitserve": 1.556} and one_short["goal_met_run"]["splitserve"]
    failed = summarize([_serving_run("splitserve", 1500), {"arm": "dynamo", "error": "exited"}])
    assert failed["ratio_per_pair"] == {"splitserve": []} and not failed["goal_met"]["splitserve"]
    assert failed["ratio_of_means"] == {} and not failed["goal_met_run"]["splitserve"]


def test_serving_layer_pairs_each_splitserve_arm_with_dynamos_runs_in_order() -> None:
    from bench.peers_serving import summarize

    both = summarize([_serving_run("splitserve-inproc", 1800), _serving_run("splitserve", 1500),
                      _serving_run("dynamo", 1000), _serving_run("splitserve-inproc", 1400),
                      _serving_run("splitserve", 1600), _serving_run("dynamo", 1000)])
    assert both["ratio_per_pair"] == {"splitserve-inproc": [1.8, 1.4], "splitserve": [1.5, 1.6]}
    assert both["goal_met"] == {"splitserve-inproc": False, "splitserve": True}


def test_serving_layer_goal_counts_dynamo_as_shipped_and_shows_dynamo_batched_apart(tmp_path: Path) -> None:
    from bench.peers_serving import plot, summarize

    runs = [_serving_run("splitserve", 2000), _serving_run("dynamo", 1000), _serving_run("dynamo-batch", 1250)]
    out = summarize(runs)
    assert out["ratio_per_pair"] == {"splitserve": [2.0]} and out["ratio_of_means_vs_dynamo_batch"] == {
        "splitserve": 1.6}
    doc = {"runs": [{**r, "index": i, "client_cpu_ms_per_request": 0.2} for i, r in enumerate(runs)],
           "conditions": {"workers": 2, "concurrency": 64, "max_tokens": 16, "num_requests": 100,
                          "timestamp": "2026-12-07T00:00:00Z"}}
    assert plot(doc, tmp_path / "serving.png") == "serving.png" and (tmp_path / "serving.png").stat().st_size > 0


def test_dynamo_instances_counted_from_the_file_store(tmp_path: Path) -> None:
    from bench.peers_dynamo import _registered

    assert _registered(tmp_path) == 0
    for i in range(2):
        (tmp_path / "v1" / "instances" / "dynamo" / "backend" / "generate").mkdir(parents=True, exist_ok=True)
        (tmp_path / "v1" / "instances" / "dynamo" / "backend" / "generate" / f"{i:x}").write_text("{}")
    (tmp_path / "v1" / "mdc").mkdir(parents=True)
    (tmp_path / "v1" / "mdc" / "generate-card").write_text("{}")  # a model card, not an instance
    assert _registered(tmp_path) == 2


@pytest.mark.parametrize(("kind", "extra", "expected"), [
    ("synthetic", {"isl": "uniform:128:2048"}, "synthetic, ISL uniform:128:2048, OSL 96"),
    ("long-mix", {"isl": "uniform:64:256", "long_isl": "2048", "long_fraction": 0.2},
     "long-mix, ISL uniform:64:256, long ISL 2048, long share 0.2, OSL 96"),
    ("shared-prefix", {"num_prefixes": 4, "prefix_len": 1536, "suffix_len": "64"},  # has no ISL: once a KeyError
     "shared-prefix, prefixes 4, prefix 1536, suffix 64, OSL 96"),
    ("multi-turn", {"isl": "128", "turns": "4"}, "multi-turn, ISL 128, turns 4, OSL 96"),
])
def test_plot_title_names_each_workloads_lengths(kind, extra, expected) -> None:
    workload = WorkloadSpec(kind=kind, osl="96", **extra).describe()
    assert workload_label(workload) == expected


@pytest.mark.parametrize(
    ("slo", "expected"),
    [
        ({"ttft_ms": 3000, "itl_ms": 60}, 0.2),  # rows 0 and 3 (row 3 has no ITL: one token)
        ({"ttft_ms": 1000, "itl_ms": 60}, 0.1),  # row 0 only
        ({"ttft_ms": 3000, "itl_ms": 100}, 0.3),  # the slow stream's 80 ms gap passes
        ({"tpot_ms": 30}, 0.3),  # the failed request never counts
    ],
)
def test_goodput_under_another_slo_counts_rows_as_the_bench_does(slo: dict, expected: float) -> None:
    from bench.peers import goodput

    rows = [{"ok": True, "ttft_ms": 300.0, "itl_max_ms": 50.0, "tpot_ms": 25.0, "e2e_ms": 2700.0},
            {"ok": True, "ttft_ms": 2500.0, "itl_max_ms": 80.0, "tpot_ms": 26.0, "e2e_ms": 5000.0},
            {"ok": False, "ttft_ms": None, "itl_max_ms": None, "tpot_ms": None, "e2e_ms": 100.0},
            {"ok": True, "ttft_ms": 1200.0, "itl_max_ms": None, "tpot_ms": None, "e2e_ms": 1200.0}]
    assert goodput(rows, slo, 10.0) == pytest.approx(expected)
