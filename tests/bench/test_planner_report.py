"""bench/planner's numbers: worker-seconds, the planner's actions and its reaction to each phase change."""

from __future__ import annotations

import json

from bench.planner_report import (
    PHASE_CHANGE,
    Phase,
    planner_actions,
    reactions,
    worker_seconds,
)


def test_worker_seconds_integrates_processes_alive() -> None:
    samples = [{"t_s": 0.0, "num_processes": 2}, {"t_s": 10.0, "num_processes": 3},
               {"t_s": 15.0, "error": "x", "num_processes": 3}, {"t_s": 20.0, "num_processes": 2},
               {"t_s": 40.0, "num_processes": 5}]  # after the load: not counted
    assert worker_seconds(samples, end_s=30.0) == 2 * 10 + 3 * 10 + 2 * 10
    assert worker_seconds([], end_s=30.0) == 0.0


def test_planner_actions_and_reactions(tmp_path) -> None:
    lines = [
        # A move the router confirmed: one action, its sizes not counted as a start and a drain.
        {"time_s": 1065.0, "move": {"worker_id": "prefill-1", "to_role": "decode", "reasons": ["itl"]},
         "role_set": {"seconds": 0.41},
         "requests": [{"pool": "prefill", "current": 2, "target": 1, "reason": "switch:prefill-1"},
                      {"pool": "decode", "current": 1, "target": 2, "reason": "switch:prefill-1"}]},
        # A refused move, then the fallback start.
        {"time_s": 1070.0, "move": {"worker_id": "prefill-0", "to_role": "decode", "reasons": ["itl"]},
         "move_refused": "last worker of its pool",
         "requests": [{"pool": "prefill", "current": 1, "target": 1, "reason": ""},
                      {"pool": "decode", "current": 2, "target": 3, "reason": "itl"}]},
        # Held while the worker starts: not a new action.
        {"time_s": 1072.0, "move": None,
         "requests": [{"pool": "decode", "current": 2, "target": 3, "reason": "pending"}]},
        {"time_s": 1080.0, "move": None,
         "requests": [{"pool": "prefill", "current": 2, "target": 1, "reason": "quiet"}]},
    ]
    path = tmp_path / "decisions.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    actions = planner_actions(path, t0_wall=1000.0)
    assert [(a["t_s"], a["action"]) for a in actions] == [(65.0, "move"), (70.0, "move_refused"), (70.0, "start"),
                                                          (80.0, "drain")]
    assert actions[0]["switch_s"] == 0.41
    assert planner_actions(tmp_path / "missing.jsonl", 0.0) == []
    # The phase change at 60 s: first fed pool 5 s later (2.5 intervals of 2 s). No action in a later phase: None.
    out = reactions(actions, PHASE_CHANGE + (Phase("again", 2048, 32, 0.75),), phase_s=60.0, interval_s=2.0)
    assert out[0] == {"phase": "decode_heavy", "at_s": 60.0, "first_action": "move", "toward": "decode",
                      "after_s": 5.0, "after_intervals": 2.5}
    assert out[1]["first_action"] is None and out[1]["after_s"] is None


def test_slo_misses_splits_ttft_tpot_and_stalls() -> None:
    from types import SimpleNamespace

    from bench.lib.metrics import RequestTiming
    from bench.planner_report import slo_misses

    def sent(start_s: float, times_s: list[float], ok: bool = True):
        timing = RequestTiming(ok=ok, e2e_s=times_s[-1] if times_s else 1.0, chunk_times_s=times_s,
                               chunk_tokens=[1] * len(times_s))
        return SimpleNamespace(start_s=start_s, timing=lambda: timing)

    fine = sent(0.0, [1.0, 1.01, 1.02, 1.03])
    late = sent(1.0, [5.0, 5.01, 5.02, 5.03])  # TTFT 5 s
    stall = sent(2.0, [1.0, 2.0, 2.01, 2.02])  # one 1 s gap after the first token: TPOT ~340 ms
    both = sent(3.0, [5.0, 6.0, 6.01, 6.02])
    failed = sent(4.0, [], ok=False)
    out = slo_misses([fine, late, stall, both, failed], {"ttft_ms": 4000, "tpot_ms": 35})
    assert (out["ttft"], out["tpot"], out["both"], out["failed"]) == (1, 1, 1, 1)
    assert out["tpot_miss_max_gap_ms"] == [1000.0, 1000.0] and out["tpot_miss_sent_s"] == [2.0, 3.0]
