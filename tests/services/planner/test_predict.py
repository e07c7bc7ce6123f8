"""Pools' latency predicted from live state (exact results), and the switch planner driven by it on simulated
pools: it reacts to a phase change within two intervals and does not oscillate on a workload flipping every 30 s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.timing import TimingModel
from services.planner.policy import (
    Observation,
    PlannerConfig,
    PlannerState,
    PoolDecision,
    ScaleDecision,
    decide,
)
from services.planner.predict import (
    LiveConfig,
    LivePressure,
    arrival_seqs,
    drop_lagging_model,
    live_pressure,
    predicted_itl_ms,
    predicted_ttft_ms,
    prefill_rate_tokens_per_s,
    projected_seqs,
)
from services.planner.switch import (
    Member,
    Move,
    SwitchConfig,
    SwitchState,
    Tenure,
    choose_move,
    pool_pressure,
)
from services.planner.workload import Slo
from tests.services.planner.test_switch import _check_guards

# Round numbers: decode step = 10 ms + 1 ms per sequence + 1 us per KV token; prefill 1,000 tokens/s.
TIMING = TimingModel(prefill_coeffs_s=(0.0, 0.001, 0.0), decode_base_s=0.010, decode_per_seq_s=0.001,
                     decode_per_kv_token_s=1e-6)
SLO = Slo(ttft_ms=4000, itl_ms=35)
LIVE = LiveConfig(horizon_s=10.0, high_water=0.9, low_water=0.5)  # short > 31.5 ms / 3600 ms; spare < 17.5 / 2000
OBS = Observation(duration_s=20, num_finished=20, arrival_rate_rps=1, isl_mean=1000, osl_mean=100,
                  ttft_p90_ms=1000, itl_p90_ms=15, num_prefill=2, num_decode=2, end_s=100.0)


@pytest.mark.parametrize("now, before, dt_s, expected", [
    (10, None, 2.0, 10.0),  # first interval: no growth known
    (10, 6, 2.0, 30.0),  # +2/s for 10 s
    (6, 10, 2.0, 6.0),  # shrinking: read as it is
    (10, 6, 0.0, 10.0),
])
def test_projected_seqs(now, before, dt_s, expected) -> None:
    assert projected_seqs(now, before, dt_s, 10.0) == expected


@pytest.mark.parametrize("rate, osl, workers, expected", [
    (0.0, 100, 1, 0.0),  # nothing arriving
    (1.0, 0, 1, 0.0),
    # 1 req/s of 100 steps, 1,000 KV tokens each: n = 100 x (10 + 1 x 2 + n) ms on (1, 2] -> 4/3.
    (1.0, 100, 1, 4 / 3),
    # 2 req/s a worker: n = 200 x (10 + 4 + n) ms on (3, 4] -> 3.5 each, 7 in the pool.
    (4.0, 100, 2, 7.0),
    (10.0, 100, 1, float("inf")),  # the steps slow faster than sequences finish: no steady state
    (1.0, 100, 0, float("inf")),
])
def test_arrival_seqs(rate, osl, workers, expected) -> None:
    assert arrival_seqs(TIMING, rate, osl, 1000, workers) == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("rate, max_tokens, decode_seqs, verdict", [
    # 2 req/s of 500 tokens on 2 workers cannot be kept up with: short before the sequences are there.
    (2.0, 500, 2, (True, False)),
    # 0.5 req/s: 1.8 sequences (14 ms) on 2 workers; on one they would be 5.8 (23 ms, past low water): not spare,
    # where the 2 running now alone would make decode a donor.
    (0.5, 500, 2, (False, False)),
    (0.5, None, 2, (False, True)),  # no max_tokens known: the running sequences as before
    # A burst of short answers (3 req/s of 32 tokens) is no decode shortage: one worker still does.
    (3.0, 32, 2, (False, True)),
])
def test_live_pressure_reads_the_arrivals(rate, max_tokens, decode_seqs, verdict) -> None:
    obs = replace(OBS, decode_seqs=decode_seqs, decode_running=decode_seqs, decode_kv_tokens=decode_seqs * 1000,
                  recent_arrival_rps=rate, recent_max_tokens=max_tokens)
    live = live_pressure(obs, obs, TIMING, SLO, LIVE)
    assert (live.decode_short, live.decode_spare) == verdict


@pytest.mark.parametrize("seqs, kv, workers, expected_ms", [
    (0, 0, 2, 0.0),
    (4, 4000, 1, 10 + 4 + 4),
    (4, 4000, 2, 10 + 2 + 2),
    (5, 5000, 2, 10 + 3 + 2.5),  # the busier worker's share (ceil), KV split evenly
    (4, 4000, 0, None),
])
def test_predicted_itl(seqs, kv, workers, expected_ms) -> None:
    got = predicted_itl_ms(TIMING, seqs, kv, workers)
    assert got == expected_ms if expected_ms is None else got == pytest.approx(expected_ms)


@pytest.mark.parametrize("backlog, isl, workers, rate, expected_ms", [
    (0, 500, 1, 1000, 500),
    (3000, 1000, 3, 1000, 2000),  # 1,000 queued per worker, then its own
    (3000, 1000, 2, 1000, 2500),
    (3000, 1000, 0, 1000, None),
])
def test_predicted_ttft(backlog, isl, workers, rate, expected_ms) -> None:
    got = predicted_ttft_ms(backlog, isl, workers, rate)
    assert got == expected_ms if expected_ms is None else got == pytest.approx(expected_ms)


def test_prefill_rate_prefers_the_engines_measure() -> None:
    assert prefill_rate_tokens_per_s(TIMING, 1000) == pytest.approx(1000)
    assert prefill_rate_tokens_per_s(TIMING, 1000, measured_tokens_per_s=2500) == 2500


@pytest.mark.parametrize("change, before, verdict", [
    # Quiet: 4 sequences of 1,000 tokens on 2 workers (14 ms; 18 ms on one: not under 17.5): nothing.
    ({"decode_seqs": 4, "decode_running": 4, "decode_kv_tokens": 4000}, None, (False, False, False, True)),
    # The same pool filling at +2/s: 24 expected in 10 s (12 ms + 12 ms + 12 ms = 34 ms a step): decode short.
    ({"decode_seqs": 4, "decode_running": 4, "decode_kv_tokens": 4000}, {"decode_seqs": 0, "end_s": 98.0},
     (True, False, False, True)),
    # Only 2 sequences: one worker would do (10 + 2 + 2 = 14 ms): decode spare.
    ({"decode_seqs": 2, "decode_running": 2, "decode_kv_tokens": 2000}, None, (False, True, False, True)),
    # 6,000 prompt tokens queued on 2 prefill workers: 3 s + 1 s own > 3.6 s: prefill short.
    ({"prefill_backlog_tokens": 6000}, None, (False, True, True, False)),  # (decode idle: spare)
    # 1,000 queued: 1.5 s with both, 2 s with one (not under 2 s): neither.
    ({"prefill_backlog_tokens": 1000}, None, (False, True, False, False)),
    # The last worker of a pool is never spare.
    ({"num_prefill": 1, "num_decode": 1}, None, (False, False, False, False)),
])
def test_live_pressure(change, before, verdict) -> None:
    obs = replace(OBS, **change)
    prev = replace(OBS, **(change | before)) if before is not None else None
    live = live_pressure(obs, prev, TIMING, SLO, LIVE)
    assert (live.decode_short, live.decode_spare, live.prefill_short, live.prefill_spare) == verdict


def test_decode_short_now_reads_todays_sequences() -> None:
    """Filling at +2/s, 4 sequences now: short at the projection (24 in 10 s), not at today's 4; marked so."""
    obs = replace(OBS, decode_seqs=4, decode_running=4, decode_kv_tokens=4000)
    live = live_pressure(obs, replace(obs, decode_seqs=0, end_s=98.0), TIMING, SLO, LIVE)
    assert (live.decode_short, live.decode_short_now) == (True, False)
    policy = PlannerConfig(slo=SLO)
    pressure = pool_pressure(obs, decide(obs, PlannerState(), policy), policy, SwitchConfig(), live=live)
    assert pressure.decode.projected
    # 24 sequences running now: short either way, and not only by the projection.
    full = replace(OBS, decode_seqs=24, decode_running=24, decode_kv_tokens=24000)
    live = live_pressure(full, full, TIMING, SLO, LIVE)
    assert (live.decode_short, live.decode_short_now) == (True, True)
    assert not pool_pressure(full, decide(full, PlannerState(), policy), policy, SwitchConfig(), live=live).decode.projected


def test_pool_pressure_adds_live_signals() -> None:
    policy = PlannerConfig(slo=SLO)
    obs = replace(OBS, decode_seqs=4, decode_running=4, decode_kv_tokens=4000)
    live = live_pressure(obs, replace(obs, decode_seqs=0, end_s=98.0), TIMING, SLO, LIVE)
    pressure = pool_pressure(obs, decide(obs, PlannerState(), policy), policy, SwitchConfig(), live=live)
    # decide sees nothing yet (windows' p90 fine); the prediction makes decode short, prefill a donor.
    assert pressure.decode.short == ("itl_pred",) and not pressure.decode.spare
    assert pressure.prefill.spare and not pressure.prefill.short
    # A donor the prediction does not clear is not spare, whatever its windows say.
    busy = replace(obs, prefill_backlog_tokens=1000)
    live = live_pressure(busy, replace(obs, decode_seqs=0, end_s=98.0), TIMING, SLO, LIVE)
    assert not pool_pressure(busy, decide(busy, PlannerState(), policy), policy, SwitchConfig(), live=live).prefill.spare


@pytest.mark.parametrize("reasons, ttft_ms, kept", [
    (("model",), 600.0, False),  # the model alone, prefill predicted at 15% of its SLO: a lagging window
    (("model",), 2500.0, True),  # predicted past low water: the model may be right
    (("model", "prefill_queue"), 600.0, True),  # a live signal agrees
    (("model",), None, True),  # no prediction
])
def test_drop_lagging_model(reasons, ttft_ms, kept) -> None:
    decision = ScaleDecision(PoolDecision("prefill", 2, 3, reasons), PoolDecision("decode", 2, 2))
    live = LivePressure(itl_ms=10.0, itl_one_less_ms=20.0, ttft_ms=ttft_ms, ttft_one_less_ms=None,
                        projected_seqs=4.0)
    out = drop_lagging_model(decision, live, SLO, LIVE)
    assert out.prefill == (decision.prefill if kept else PoolDecision("prefill", 2, 2))
    assert out.decode == decision.decode


def _simulate(phases, duration_s: float, roles: dict[str, str], interval_s: float = 2.0,
              config: SwitchConfig | None = None, arrivals: bool = False) -> tuple[list[tuple[float, Move]], list[tuple[int, int]]]:
    """A fluid model of the pools, decided on every ``interval_s`` from live state only. ``phases(t)`` gives
    (rate req/s, ISL, OSL). Decode: arrivals join, each sequence lives OSL steps of the pool's step time.
    Prefill: arrivals' prompt tokens queue, each worker prefills 1,000 tokens/s. Workers settled at t=0."""
    policy, config = PlannerConfig(slo=SLO), config or SwitchConfig()
    state = SwitchState(tenures=tuple(Tenure(w, r, -100.0) for w, r in sorted(roles.items())))
    seqs, backlog, prev, moves, sizes = 0.0, 0.0, None, [], []
    for k in range(int(duration_s / interval_s)):
        now_s = k * interval_s
        rate, isl, osl = phases(now_s)
        n_p = sum(r == "prefill" for r in roles.values())
        n_d = len(roles) - n_p
        step_ms = predicted_itl_ms(TIMING, seqs, seqs * isl, n_d)
        seqs = max(0.0, seqs + rate * interval_s - seqs * interval_s / (osl * step_ms / 1e3 if seqs else 1.0))
        backlog = max(0.0, backlog + rate * isl * interval_s - n_p * 1000 * interval_s)
        obs = replace(OBS, num_prefill=n_p, num_decode=n_d, isl_mean=isl, end_s=now_s, arrival_rate_rps=rate,
                      decode_seqs=round(seqs), decode_running=round(seqs), decode_kv_tokens=round(seqs * isl),
                      prefill_backlog_tokens=backlog, prefill_waiting=backlog / isl / n_p,
                      recent_arrival_rps=rate if arrivals else 0.0, recent_max_tokens=osl if arrivals else None)
        live = live_pressure(obs, prev, TIMING, SLO, LIVE)
        prev = obs
        pressure = pool_pressure(obs, decide(obs, PlannerState(), policy), policy, config, live=live)
        members = [Member(w, r, True) for w, r in sorted(roles.items())]
        out = choose_move(pressure, members, state, config, now_s)
        state = out.state
        if isinstance(out.choice, Move):
            roles[out.choice.worker_id] = out.choice.to_role
            moves.append((now_s, out.choice))
        sizes.append((sum(r == "prefill" for r in roles.values()), sum(r == "decode" for r in roles.values())))
    return moves, sizes


PREFILL_HEAVY, DECODE_HEAVY = (0.75, 2000, 32), (2.0, 500, 500)


def test_arrivals_see_a_phase_change_at_the_first_decision() -> None:
    """The same, with the arrivals' rate and max_tokens read: decode is short at the first decision after the
    change (the arrivals say so before the sequences pile up), and the move comes with it."""
    roles = {"w0": "prefill", "w1": "prefill", "w2": "prefill", "w3": "decode"}
    moves, _ = _simulate(lambda t: PREFILL_HEAVY if t < 60 else DECODE_HEAVY, 120.0, roles,
                         config=SwitchConfig(min_dwell_s=0.0, spare_intervals=1), arrivals=True)
    assert all(t >= 60 for t, _ in moves)
    assert moves[0][1].to_role == "decode" and moves[0][0] == 60.0


def test_reacts_to_a_phase_change_within_two_intervals() -> None:
    """3P + 1D through a prefill-heavy phase (no move: prefill is not spare, decode not short), then decode-heavy
    from t=60 s: the first move, toward decode, at most two 2 s intervals later."""
    roles = {"w0": "prefill", "w1": "prefill", "w2": "prefill", "w3": "decode"}
    moves, sizes = _simulate(lambda t: PREFILL_HEAVY if t < 60 else DECODE_HEAVY, 120.0, roles,
                             config=SwitchConfig(min_dwell_s=0.0, spare_intervals=1))
    assert all(t >= 60 for t, _ in moves)
    assert moves[0][1].to_role == "decode" and moves[0][0] - 60 <= 2 * 2.0
    assert sizes[-1][1] >= 2


@pytest.mark.parametrize("arrivals", [False, True])
@pytest.mark.parametrize("start", [("prefill", "prefill", "prefill", "decode"), ("prefill", "decode", "decode", "decode"),
                                   ("prefill", "prefill", "decode", "decode")])
def test_live_signals_flipping_every_30s_do_not_oscillate(start, arrivals) -> None:
    """The phase-change workload flipping every 30 s, decided every 2 s from live state: 2P + 2D serves both
    phases here, so from either extreme the planner makes the one move to it and then none (the low-water test
    with one worker fewer keeps a pool that is fine from being a donor); the guards hold throughout."""
    config = SwitchConfig(min_dwell_s=30.0, spare_intervals=LiveConfig().spare_intervals)
    roles = {f"w{i}": role for i, role in enumerate(start)}
    moves, sizes = _simulate(lambda t: PREFILL_HEAVY if int(t // 30) % 2 == 0 else DECODE_HEAVY, 300.0, roles,
                             config=config, arrivals=arrivals)
    _check_guards(moves, sizes, config)
    assert len(moves) == (0 if start.count("prefill") == 2 else 1)
    assert sizes[-1] == (2, 2) and set(sizes[len(sizes) // 4:]) == {(2, 2)}
