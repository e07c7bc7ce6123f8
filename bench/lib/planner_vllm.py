"""bench/planner.py on real vLLM workers (``--engine vllm``): the workload sized for the real engine, its `up`
arguments, its conditions, and the decision-to-serving time of started workers.

The phase-change workload is sized from a vLLM profile (``bench/profiles/vllm-100m-cpu.json``: one engine per
core; its times divided by ``--vllm-timing-scale``, measured on a fixed 1P + 1D run here: the profile was taken
on a busier machine) so that each phase needs a pool the fixed 1P + 1D graph does not have, at an SLO that lies between what
one and two engines of the short pool give:
  * prefill-heavy: long prompts, short answers, at ``prefill_load`` x one prefill engine's capacity (> 1: one
    engine's queue grows without bound, two engines share it);
  * decode-heavy: short prompts (above the local-prefill threshold, so still remote), long answers, at
    ``decode_load`` of one decode engine's saturation rate; steady TPOT there is ``base / (1 - load)`` on one
    engine and ``base / (1 - load / 2)`` on two (a decode step = base + slope x batch, Little's law).
The TPOT SLO is the geometric mean of those two predictions; the TTFT SLO ``ttft_slo_x`` prefill times of the
prefill-heavy prompt (6: the p99 TTFT of the fixed arm's one prefill engine at load ~0.7, its core shared with the
control plane, in a calibration run: CALIBRATION). Pure functions, table-tested in tests/bench/test_planner_vllm.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.planner_report import Phase
from common.timing import TimingModel


class Sizing(NamedTuple):
    phases: tuple[Phase, Phase]
    ttft_ms: float
    tpot_ms: float
    predicted: dict[str, float]  # what the profile predicts for each phase on one and two engines of its pool


def scaled_timing(timing: TimingModel, prefill: float, decode_base: float, decode_slope: float) -> TimingModel:
    """``timing`` with its prefill, decode-base and decode per-sequence/per-token terms divided by these."""
    return dataclasses.replace(timing, prefill_coeffs_s=tuple(c / prefill for c in timing.prefill_coeffs_s),
                               decode_base_s=timing.decode_base_s / decode_base,
                               decode_per_seq_s=timing.decode_per_seq_s / decode_slope,
                               decode_per_kv_token_s=timing.decode_per_kv_token_s / decode_slope)


def _decode_line(timing: TimingModel, context: float) -> tuple[float, float]:
    """A decode step's seconds as ``base + slope x batch`` at ``context`` tokens per sequence."""
    return timing.decode_base_s, timing.decode_per_seq_s + timing.decode_per_kv_token_s * context


def steady_tpot_s(timing: TimingModel, tokens_per_s: float, context: float) -> float | None:
    """Steady TPOT of one decode engine producing ``tokens_per_s`` (None: it cannot keep up).

    batch = tokens_per_s x step (Little), step = base + slope x batch -> step = base / (1 - slope x tokens_per_s).
    """
    base, slope = _decode_line(timing, context)
    load = slope * tokens_per_s
    return None if load >= 1.0 else base / (1.0 - load)


def size_phase_change(timing: TimingModel, *, prefill_isl: int = 1024, prefill_osl: int = 8,
                      prefill_load: float = 1.2, decode_isl: int = 320, decode_osl: int = 384,
                      decode_load: float = 0.8, ttft_slo_x: float = 6.0) -> Sizing:
    """The phase-change workload and SLO for engines with ``timing`` (see the module docstring)."""
    if not (prefill_load > 0 and 0 < decode_load < 1):
        raise ValueError(f"prefill_load must be > 0 and decode_load in (0, 1): {prefill_load}, {decode_load}")
    prefill_s = timing.prefill_s(prefill_isl)
    prefill_rate = prefill_load / prefill_s
    context = decode_isl + decode_osl / 2  # a sequence's mean context over its answer
    _, slope = _decode_line(timing, context)
    decode_rate = decode_load / (slope * decode_osl)
    tpot_one = steady_tpot_s(timing, decode_rate * decode_osl, context)
    tpot_two = steady_tpot_s(timing, decode_rate * decode_osl / 2, context)
    assert tpot_one is not None and tpot_two is not None  # decode_load < 1
    phases = (Phase("prefill_heavy", prefill_isl, prefill_osl, round(prefill_rate, 2)),
              Phase("decode_heavy", decode_isl, decode_osl, round(decode_rate, 2)))
    predicted = {"prefill_heavy_prefill_s": round(prefill_s, 3),
                 "prefill_heavy_load_one_engine": round(prefill_load, 2),
                 "prefill_heavy_load_two_engines": round(prefill_load / 2, 2),
                 "decode_heavy_tpot_ms_one_engine": round(tpot_one * 1e3, 1),
                 "decode_heavy_tpot_ms_two_engines": round(tpot_two * 1e3, 1),
                 "decode_heavy_prefill_load_one_engine": round(decode_rate * timing.prefill_s(decode_isl), 2)}
    return Sizing(phases, round(ttft_slo_x * prefill_s * 1e3, -1), round(math.sqrt(tpot_one * tpot_two) * 1e3, 1),
                  predicted)


def start_to_serving(actions: Sequence[dict[str, Any]], pools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each start the planner asked for: seconds from its decision to the first pool sample (the router's
    list, about every second) in which that pool has reached the target (None: never during the run)."""
    out = []
    for action in actions:
        if action["action"] != "start" or action["t_s"] < 0:
            continue
        serving = next((s["t_s"] for s in pools if s["t_s"] >= action["t_s"]
                        and s.get(action["pool"], -1) >= action["target"]), None)
        out.append({"t_s": action["t_s"], "pool": action["pool"], "target": action["target"],
                    "serving_after_s": None if serving is None else round(serving - action["t_s"], 1)})
    return out


# The fixed 1P + 1D arm's runs the defaults come from (2026-12-01, seed 0, 90 s phases): how the real engines
# compare with the profile's predictions.
CALIBRATION = [
    {"timing_scale": "1,1,1", "rates_rps": [0.93, 1.24], "prefill_heavy_ttft_ms": {"min": 527, "p50": 971},
     "prefill_1024_s_profile": 1.185, "light_tpot_ms_p50": 21.6, "light_tpot_ms_profile": 19.6,
     "decode_heavy_tpot_ms_p50": 37.6, "decode_heavy_tpot_ms_profile": 68.6,
     "fit": "prefill 2.2x faster than the profile; decode base ~0.9x; decode slope ~1.55x (from 37.6 ms at "
            "476 tokens/s: 19.5 ms / (1 - slope x 476))"},
    {"timing_scale": "1.5,0.9,1.55", "rates_rps": [1.27, 2.05],
     "prefill_heavy_ttft_ms": {"min": 533, "p50": 1436, "p90": 2446, "p99": 3114},
     "prefill_heavy_slo_attainment": 0.99, "decode_heavy_tpot_ms_p50": 105.0, "decode_heavy_tpot_ms_predicted": 95.3,
     "then": "prefill 2.2 (one engine was at load ~0.7, not 1.0), prefill_load 1.2, TTFT SLO 6 prefill times"},
]


def add_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("--engine vllm (real engines; the phase-change workload sized from --profile)")
    g.add_argument("--vllm-model", type=Path, default=None, help="default: models/tiny-100m (the profile's model)")
    g.add_argument("--vllm-timing-scale", default="2.2,0.9,1.55",
                   help="PREFILL,DECODE_BASE,DECODE_SLOPE: profile time / these = this machine's engine (measured: "
                   "fixed 1P + 1D, TTFT and TPOT vs the profile's predictions)")
    g.add_argument("--vllm-prefill-load", type=float, default=1.2,
                   help="prefill-heavy rate as a share of one prefill engine's capacity")
    g.add_argument("--vllm-decode-load", type=float, default=0.8,
                   help="decode-heavy rate as a share of one decode engine's saturation")
    g.add_argument("--vllm-ttft-slo-x", type=float, default=6.0, help="TTFT SLO in prefill-heavy prefill times")
    g.add_argument("--vllm-kv-transfer", default="pull", help="every arm's workers: switchable (kv_both), this")


def configure(args: argparse.Namespace, repo: Path) -> Sizing:
    """Sets ``args`` for real engines: model, phases, pools, SLO (unless given); returns the sizing."""
    from common.profile import load_timing

    scale = [float(x) for x in args.vllm_timing_scale.split(",")]
    sizing = size_phase_change(scaled_timing(load_timing(args.profile), *scale), prefill_load=args.vllm_prefill_load,
                               decode_load=args.vllm_decode_load, ttft_slo_x=args.vllm_ttft_slo_x)
    args.model = args.vllm_model or repo / "models" / "tiny-100m"
    args.phases = sizing.phases
    args.ttft_ms = args.ttft_ms if args.ttft_ms_given else sizing.ttft_ms
    args.itl_ms = args.itl_ms_given or sizing.tpot_ms
    # Three engines on two cores at most: 2P + 1D for the prefill-heavy phase, 1P + 2D is one move away.
    args.start = args.start or (2, 1)
    args.max_prefill, args.max_decode, args.max_workers = 2, 2, 3
    args.scaled_profile = args.profile  # real engines: the planner plans for the profile as measured
    args.mock_start_s = 0.0
    return sizing


def engine_args(args: argparse.Namespace) -> list[str]:
    """`up` arguments of the real engines, the same in every arm (only the planner differs)."""
    return ["--engine", "vllm", "--model", str(args.model), "--switchable", "--kv-transfer", args.vllm_kv_transfer,
            "--max-workers", str(args.max_workers)]


def conditions(args: argparse.Namespace, sizing: Sizing, repo: Path) -> dict[str, Any]:
    from common.tiny_model import validate_model_dir

    info = validate_model_dir(args.model)
    return {"engine": "vllm", "model": str(args.model.relative_to(repo) if args.model.is_relative_to(repo)
                                           else args.model),
            "model_shape": {"hidden": info.hidden_size, "layers": info.num_layers, "heads": info.num_heads,
                            "kv_heads": info.num_kv_heads},
            "dtype": "auto (bfloat16 on this CPU: avx512_bf16)", "workers": "switchable (vLLM kv_both), every arm",
            "kv_transfer": f"{args.vllm_kv_transfer} (NixlConnector)", "enforce_eager": True,
            "cores": "2; worker i pinned to core i % 2 (3 engines: two share a core); control plane on a prefill "
                     "engine's core; OMP_NUM_THREADS=1",
            "max_workers": args.max_workers, "sizing": {"timing_scale": args.vllm_timing_scale,
                                                         "prefill_load": args.vllm_prefill_load,
                                                         "decode_load": args.vllm_decode_load,
                                                         "ttft_slo_x": args.vllm_ttft_slo_x,
                                                         "predicted": sizing.predicted},
            "slo_from": "TPOT: geometric mean of the profile's steady TPOT on one and on two decode engines in "
                        "decode_heavy; TTFT: ttft_slo_x x the profile's prefill time of the prefill_heavy prompt (profile / "
                        "timing_scale); ttft_slo_x 6 ~ the fixed arm's p99 TTFT with one prefill engine at load ~0.7",
            "calibration": CALIBRATION}


def merge(paths: Sequence[Path], out: Path) -> dict[str, Any]:
    """One JSON from per-arm runs (same workload): the first's conditions, each run with its own."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    runs = []
    for path, doc in zip(paths, docs):
        for run in doc["runs"]:
            runs.append({**run, "run_conditions": {k: doc["conditions"].get(k) for k in (
                "timestamp", "finished", "command", "machine")}, "from_file": Path(path).name})
    merged = {"bench": "planner", "conditions": {**docs[0]["conditions"], "note": (
        f"{len(paths)} invocations (one arm each, back to back, same seed and workload); each run's "
        "run_conditions says when, with which command and commit")}, "runs": runs}
    out.write_text(json.dumps(merged, indent=1) + "\n")
    return merged


if __name__ == "__main__":  # python -m bench.lib.planner_vllm OUT IN...: merge per-arm runs
    import sys

    merge([Path(p) for p in sys.argv[2:]], Path(sys.argv[1]))
