"""Switch first, scale second: when one pool is short and the other can spare a worker, move a worker in place.

Pure: ``pool_pressure`` reads one interval's observation (and ``policy.decide``'s verdict on it) into each
pool's pressure; ``choose_move`` picks at most one worker to change pool (``Move``) or says why not
(``NoMove``); ``switch_first`` turns the scale decision into what is left to start or stop once moves are
accounted for. Every rule is table-tested (tests/services/planner/test_switch.py).

A move costs about a second (the engine is loaded; the router stops giving it old-role work and it takes the
new role's), a started worker tens of seconds (vLLM) and a drained one its queue. So:
  * a short pool takes a worker from the other pool when that pool has one to spare;
  * workers are started only when no move can serve the shortage (both pools short, the other pool has none
    to spare, or none of its workers can switch), and stopped only when no pool is short of them.
Against oscillation (a workload that flips faster than the pools settle must not make them flip with it):
  * hysteresis in level: "short" is ``decide``'s scale-up signals (p90 past ``high_water`` of its SLO, queues
    past ``queue_high``); "spare" needs the donor's TTFT p90 under ``high_water`` and its queues near empty
    with one worker fewer, so a pool is never both, and a donor just below "short" is not spare. "Spare" reads
    live signals, not the profile's target: that sizes the whole window's workload, so after a phase change it
    keeps the donor at its old size for most of a window (and a move is cheap to undo by the same rules);
  * hysteresis in time: a pool must be short ``short_intervals`` and the donor spare ``spare_intervals``
    readings in a row (the counts restart after every move, which changes both pools): the donor's signals
    are the ones a blip fools (a queue that happens to be empty); the short pool's are past high water already.
    The planner takes a reading each interval, and a quarter interval after one that found a move waiting only
    on these counts (``services.planner.service.next_wait_s``);
  * a minimum dwell: a worker moves only ``min_dwell_s`` after it joined its pool (started or moved), and no
    move goes against the previous one within ``min_dwell_s`` (it would undo it with another worker);
  * at most one move per decision, and none within ``min_gap_s`` of the last;
  * in amplitude: a pool short only by the live prediction's growth projection (``PoolPressure.projected``)
    takes one worker on it, not a second within ``min_dwell_s``: the projection assumes no sequence finishes
    within its horizon, so while a shift ramps up it asks for more than the shift's steady state (it moved 3
    workers into decode where 2 serve, and the starved prefill pool then started one);
  * never the last worker of a pool (``min_prefill`` / ``min_decode``), nor one more than a pool may hold
    (``max_prefill`` / ``max_decode``: the scale policy would drain it straight back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from common.protocol import Role
from services.planner.policy import (
    ModelTarget,
    Observation,
    PlannerConfig,
    PoolDecision,
    ScaleDecision,
)
from services.planner.predict import LivePressure

# NoMove reasons after which the shortage waits for a move rather than a new worker (the move is coming).
WAIT_REASONS = frozenset({"hysteresis", "dwell", "gap", "reversal"})


@dataclass(frozen=True, slots=True)
class PoolPressure:
    short: tuple[str, ...] = ()  # the signals that want another worker here ("itl", "prefill_queue", ...)
    spare: bool = False  # one worker fewer would still meet the SLO
    projected: bool = False  # short only by the live prediction's growth projection (no signal at today's load)


@dataclass(frozen=True, slots=True)
class Pressure:
    prefill: PoolPressure
    decode: PoolPressure

    def of(self, pool: Role) -> PoolPressure:
        return self.prefill if pool == "prefill" else self.decode


@dataclass(frozen=True, slots=True)
class Member:
    """A serving worker as the switch policy sees it (from the router's worker list)."""

    worker_id: str
    role: Role  # "prefill" or "decode"
    switchable: bool
    num_busy: int = 0  # requests running or waiting on it (the cheapest to move holds the fewest)
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Tenure:
    worker_id: str
    role: Role
    since_s: float  # monotonic: when it was first seen in this role (started, or moved)


@dataclass(frozen=True, slots=True)
class SwitchConfig:
    min_dwell_s: float = 30.0
    min_gap_s: float = 0.0  # between two moves (0: one per decision)
    short_intervals: int = 1  # decisions in a row a pool is short before a worker moves to it
    spare_intervals: int = 2  # ... and the donor has one to spare
    min_prefill: int = 1
    min_decode: int = 1
    # A pool at its cap takes no worker (the scale policy would drain one straight back: PlannerConfig's max).
    max_prefill: int = 1_000_000
    max_decode: int = 1_000_000
    spare_queue: float = 0.5  # requests waiting per worker, counted as if the pool had one worker fewer


@dataclass(frozen=True, slots=True)
class SwitchState:
    short_prefill: int = 0  # decisions in a row the pool was short
    short_decode: int = 0
    spare_prefill: int = 0  # ... and had a worker to spare
    spare_decode: int = 0
    last_move_s: float = float("-inf")
    last_move_to: Role | None = None
    tenures: tuple[Tenure, ...] = ()


@dataclass(frozen=True, slots=True)
class Move:
    worker_id: str
    from_role: Role
    to_role: Role
    reasons: tuple[str, ...]  # the receiving pool's short signals


@dataclass(frozen=True, slots=True)
class NoMove:
    # no_shortage | both_short | full | projected | no_spare | last_worker | not_switchable | refused (scale
    # instead);
    # hysteresis | dwell | gap | reversal (a move is on its way: wait for it)
    reason: str
    pool: Role | None = None  # the short pool, where there is one

    @property
    def wait(self) -> bool:
        """A move is on its way: the shortage waits for it instead of starting a worker."""
        return self.reason in WAIT_REASONS


@dataclass(frozen=True, slots=True)
class SwitchDecision:
    choice: Move | NoMove
    state: SwitchState


def _other(pool: Role) -> Role:
    return "decode" if pool == "prefill" else "prefill"


def pool_pressure(obs: Observation, decision: ScaleDecision, config: PlannerConfig, switch: SwitchConfig,
                  model: ModelTarget | None = None, live: LivePressure | None = None) -> Pressure:
    """Short: ``decide`` grows the pool (its reasons, the model's target among them), or ``live`` (latency
    predicted from the pools' live state, ``services.planner.predict``) passes high water ("itl_pred",
    "ttft_pred"): that one moves within an interval of the load, the windows' p90 most of a window later.
    Spare: not short, and one worker fewer keeps its live queue near empty and KV use low, its latency p90 is
    under ``high_water``, and (with ``live``) its predicted latency under ``low_water``.
    ``model`` is accepted for symmetry with ``decide`` and not read (see the module's docstring)."""
    slo, hw = config.slo, config.high_water
    trusted = obs.num_finished >= config.min_requests
    ttft_near = trusted and obs.ttft_p90_ms is not None and obs.ttft_p90_ms > slo.ttft_ms * hw
    itl_near = trusted and obs.itl_p90_ms is not None and obs.itl_p90_ms > slo.itl_ms * hw

    def after_one_less(waiting: float, n: int) -> float:
        return waiting * n / (n - 1) if n > 1 else float("inf")

    p_short = decision.prefill.reasons if decision.prefill.target > decision.prefill.current else ()
    d_short = decision.decode.reasons if decision.decode.target > decision.decode.current else ()
    if live is not None:
        p_short += ("ttft_pred",) if live.prefill_short else ()
        d_short += ("itl_pred",) if live.decode_short else ()
    d_projected = tuple(d_short) == ("itl_pred",) and live is not None and not live.decode_short_now
    n_p, n_d = obs.num_prefill, obs.num_decode
    p_spare = (not p_short and n_p > switch.min_prefill and not ttft_near
               and after_one_less(obs.prefill_waiting, n_p) < switch.spare_queue
               and (live is None or live.prefill_spare))
    # A decode donor: TTFT is the prefill pool's unless requests wait on decode workers (local prefills).
    d_spare = (not d_short and n_d > switch.min_decode and not itl_near
               and after_one_less(obs.decode_waiting, n_d) < switch.spare_queue
               and obs.decode_kv_usage * n_d / max(1, n_d - 1) < config.kv_high * config.low_water / hw
               and (live is None or live.decode_spare))
    return Pressure(PoolPressure(tuple(p_short), p_spare), PoolPressure(tuple(d_short), d_spare, d_projected))


def track_tenures(members: Sequence[Member], tenures: Sequence[Tenure], now_s: float) -> tuple[Tenure, ...]:
    """Each live worker's time in its current role: kept while its role is unchanged, restarted when it is new
    here or its role changed (a move, ours or an operator's)."""
    known = {t.worker_id: t for t in tenures}
    out = []
    for m in members:
        t = known.get(m.worker_id)
        out.append(t if t is not None and t.role == m.role else Tenure(m.worker_id, m.role, now_s))
    return tuple(out)


def choose_move(pressure: Pressure, members: Sequence[Member], state: SwitchState, config: SwitchConfig,
                now_s: float) -> SwitchDecision:
    tenures = track_tenures(members, state.tenures, now_s)
    since = {t.worker_id: t.since_s for t in tenures}
    p, d = pressure.prefill, pressure.decode
    state = replace(state, tenures=tenures,
                    short_prefill=state.short_prefill + 1 if p.short else 0,
                    short_decode=state.short_decode + 1 if d.short else 0,
                    spare_prefill=state.spare_prefill + 1 if p.spare else 0,
                    spare_decode=state.spare_decode + 1 if d.spare else 0)

    def no(reason: str, pool: Role | None = None) -> SwitchDecision:
        return SwitchDecision(NoMove(reason, pool), state)

    if p.short and d.short:
        return no("both_short")
    if not p.short and not d.short:
        return no("no_shortage")
    to: Role = "prefill" if p.short else "decode"
    src = _other(to)
    num_to = sum(m.role == to and not m.draining for m in members)
    if num_to >= (config.max_prefill if to == "prefill" else config.max_decode):
        return no("full", to)
    if (pressure.of(to).projected and state.last_move_to == to
            and now_s - state.last_move_s < config.min_dwell_s):
        return no("projected", to)
    live = [m for m in members if m.role == src and not m.draining]
    if len(live) <= (config.min_prefill if src == "prefill" else config.min_decode):
        return no("last_worker", to)
    if not pressure.of(src).spare:
        return no("no_spare", to)
    candidates = [m for m in live if m.switchable]
    if not candidates:
        return no("not_switchable", to)
    short_n = state.short_prefill if to == "prefill" else state.short_decode
    spare_n = state.spare_decode if to == "prefill" else state.spare_prefill
    if short_n < config.short_intervals or spare_n < config.spare_intervals:
        return no("hysteresis", to)
    if now_s - state.last_move_s < config.min_gap_s:
        return no("gap", to)
    if state.last_move_to == src and now_s - state.last_move_s < config.min_dwell_s:
        return no("reversal", to)
    settled = [m for m in candidates if now_s - since[m.worker_id] >= config.min_dwell_s]
    if not settled:
        return no("dwell", to)
    pick = min(settled, key=lambda m: (m.num_busy, m.worker_id))
    moved = tuple(Tenure(t.worker_id, to, now_s) if t.worker_id == pick.worker_id else t for t in tenures)
    # Both pools changed size: each must qualify again on what it does next.
    state = replace(state, tenures=moved, last_move_s=now_s, last_move_to=to,
                    short_prefill=0, short_decode=0, spare_prefill=0, spare_decode=0)
    return SwitchDecision(Move(pick.worker_id, src, to, pressure.of(to).short), state)


def switch_first(decision: ScaleDecision, choice: Move | NoMove) -> ScaleDecision:
    """What is left to scale once the move (or the move on its way) is counted.

    A move: both pools take their new sizes and nothing starts or stops this interval. No move: ``decide``'s
    targets, except that a pool waiting for a move does not grow, and a pool does not shrink while the other
    is short of workers it could have moved (it moves them instead, once they may).
    """
    p, d = decision.prefill, decision.decode
    if isinstance(choice, Move):
        delta_p = 1 if choice.to_role == "prefill" else -1
        reason = f"switch:{choice.worker_id}"
        return replace(decision,
                       prefill=PoolDecision("prefill", p.current, p.current + delta_p, (reason,)),
                       decode=PoolDecision("decode", d.current, d.current - delta_p, (reason,)))

    def hold(pool: PoolDecision) -> PoolDecision:
        return replace(pool, target=pool.current, reasons=())

    if choice.wait and choice.pool is not None:
        short = p if choice.pool == "prefill" else d
        donor = d if choice.pool == "prefill" else p
        short, donor = (hold(short) if short.target > short.current else short), (
            hold(donor) if donor.target < donor.current else donor)
        p, d = (short, donor) if choice.pool == "prefill" else (donor, short)
    return replace(decision, prefill=p, decode=d)
