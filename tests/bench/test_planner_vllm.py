"""bench/planner.py --engine vllm: the workload sized from a profile, and started workers' time to serving."""

from __future__ import annotations

import pytest

from bench.lib.planner_vllm import scaled_timing, size_phase_change, start_to_serving, steady_tpot_s
from common.timing import TimingModel

# Round numbers: prefill 0.1 s + 1 ms/token; decode step 20 ms + 1 ms/sequence (no context term).
TIMING = TimingModel(prefill_coeffs_s=(0.1, 0.001), decode_base_s=0.020, decode_per_seq_s=0.001,
                     decode_per_kv_token_s=0.0)


@pytest.mark.parametrize(("tokens_per_s", "tpot_s"), [
    (0.0, 0.020),  # idle: the base step
    (500.0, 0.040),  # half the slope's capacity: the step doubles
    (750.0, 0.080),
    (1000.0, None),  # 1/slope tokens/s: the batch grows without bound
    (2000.0, None),
])
def test_steady_tpot(tokens_per_s: float, tpot_s: float | None) -> None:
    got = steady_tpot_s(TIMING, tokens_per_s, context=500)
    assert got == tpot_s if tpot_s is None else got == pytest.approx(tpot_s)


def test_phase_change_needs_the_other_pool_at_its_slo() -> None:
    sizing = size_phase_change(TIMING, prefill_isl=900, prefill_osl=16, prefill_load=1.2, decode_isl=300,
                               decode_osl=400, decode_load=0.75, ttft_slo_x=3.0)
    prefill, decode = sizing.phases
    assert (prefill.isl, prefill.osl, decode.isl, decode.osl) == (900, 16, 300, 400)
    assert prefill.rate_rps == pytest.approx(1.2)  # 1.2 x one engine's 1 req/s (1.0 s per prompt)
    assert decode.rate_rps == pytest.approx(1.88, abs=0.01)  # 0.75 x 1,000 tokens/s / 400 tokens
    # One decode engine: 20 ms / (1 - 0.75) = 80 ms; two: 20 / (1 - 0.375) = 32 ms; the SLO between them.
    assert sizing.predicted["decode_heavy_tpot_ms_one_engine"] == 80.0
    assert sizing.predicted["decode_heavy_tpot_ms_two_engines"] == 32.0
    assert 32.0 < sizing.tpot_ms < 80.0 and sizing.tpot_ms == pytest.approx(50.6, abs=0.1)
    assert sizing.ttft_ms == 3000.0


@pytest.mark.parametrize("loads", [(0.0, 0.5), (1.1, 1.0), (1.1, 0.0)])
def test_phase_change_rejects_loads_without_a_steady_state(loads: tuple[float, float]) -> None:
    with pytest.raises(ValueError):
        size_phase_change(TIMING, prefill_load=loads[0], decode_load=loads[1])


def test_start_to_serving() -> None:
    actions = [{"t_s": -5.0, "action": "start", "pool": "decode", "target": 2},  # before the load: not counted
               {"t_s": 10.0, "action": "drain", "pool": "prefill", "target": 1},
               {"t_s": 10.0, "action": "start", "pool": "decode", "target": 2},
               {"t_s": 50.0, "action": "start", "pool": "prefill", "target": 3}]
    pools = [{"t_s": 9.0, "decode": 1}, {"t_s": 20.0, "error": "x"}, {"t_s": 41.5, "decode": 2, "prefill": 1},
             {"t_s": 60.0, "decode": 2, "prefill": 2}]
    assert start_to_serving(actions, pools) == [
        {"t_s": 10.0, "pool": "decode", "target": 2, "serving_after_s": 31.5},
        {"t_s": 50.0, "pool": "prefill", "target": 3, "serving_after_s": None}]


def test_scaled_timing_divides_each_term() -> None:
    t = scaled_timing(TIMING, prefill=2.0, decode_base=0.5, decode_slope=4.0)
    assert t.prefill_s(900) == pytest.approx(0.5)
    assert t.decode_s(8, 0) == pytest.approx(0.040 + 0.002)  # base 20 ms / 0.5, 8 x 1 ms / 4
