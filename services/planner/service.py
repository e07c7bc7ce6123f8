"""The live planner process: every ``interval_s`` observe, decide, publish ``ScaleRequest``s.

It acts on nothing itself. Orchestrators subscribe to its PUB socket and make the pools match: the local
launcher (``splitserve up --planner``) starts and drains worker processes; a Kubernetes operator or a systemd
script can do the same from ``splitserve planner-events`` (JSON lines). Requests are published every interval,
changed or not, so a subscriber that joins late or misses one catches up with the next.

Workers take time to start (vLLM: tens of seconds) and to drain. While a pool has not reached the last
target (``pending``), the planner neither adds more on top for the same shortage nor scales it down: it holds
that target until the pool gets there or ``pending_timeout_s`` passes.

With ``role_switch`` the planner switches first and scales second (``services.planner.switch``): when one pool
is short and the other has a switchable worker to spare, it sends the router ``SetRole`` (one worker, in
place, about a second), relays the router's ``RoleSet`` on the PUB socket (orchestrators then count the worker
in its new pool) and publishes the pools' new sizes; a refused move falls back to scaling. A move that waits only
for its hysteresis (the pools' live state must say so twice) is confirmed ``confirm_s`` later, not a whole
interval later (``next_wait_s``): that re-reads the live state and keeps the last decision's window verdicts
(``decide`` counts intervals), and moves stay at most one per interval (``min_gap_s``).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import structlog
import zmq

from common.errors import RemoteError, TransportTimeout
from common.protocol import (
    ListWorkers,
    Role,
    RoleSet,
    ScaleRequest,
    SetRole,
    WorkerList,
    encode,
)
from common.router_set import RouterSet
from common.security import secure_server
from common.timing import TimingModel
from common.transport import TransportConfig, new_id, open_context
from services.planner.defaults import INTERVAL_S, WINDOW_S
from services.planner.observe import FrontendSnapshot, merge, observe, parse_metrics
from services.planner.plan import plan_disaggregated, prefill_workers_for_quantile
from services.planner.policy import (
    ModelTarget,
    Observation,
    PlannerConfig,
    PlannerState,
    PoolDecision,
    ScaleDecision,
    decide,
    pools_changed_s,
)
from services.planner.predict import LiveConfig, drop_lagging_model, live_pressure
from services.planner.switch import (
    Member,
    Move,
    NoMove,
    SwitchConfig,
    SwitchState,
    choose_move,
    pool_pressure,
    switch_first,
)
from services.planner.workload import PlanOptions, Workload

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PlannerServiceConfig:
    router_endpoint: str
    metrics_urls: tuple[str, ...]  # frontends' /metrics
    policy: PlannerConfig
    events_endpoint: str = "tcp://127.0.0.1:0"  # PUB, bound here
    interval_s: float = INTERVAL_S  # between decisions
    window_s: float = WINDOW_S  # each decision reads the last this-many seconds of metrics
    pending_timeout_s: float = 120.0
    # Profile-based targets (None: reactive only).
    timing: TimingModel | None = None
    plan_options: PlanOptions = field(default_factory=PlanOptions)
    decisions_path: Path | None = None  # JSON lines: one observation + decision per interval
    role_switch: bool = False  # move switchable workers between pools before starting or stopping any
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    # role_switch with a profile: pools' latency predicted from their live state (services.planner.predict).
    live: LiveConfig | None = field(default_factory=LiveConfig)
    set_role_timeout_s: float = 5.0  # the router answers once the worker serves its new role
    # role_switch: seconds until a move waiting only on hysteresis is confirmed (None: a quarter interval). The
    # donor must read spare twice; two decisions apart, the first move after a phase change came in the third
    # interval (bench/results/planner-roles.json, 2.05 intervals).
    confirm_s: float | None = None
    transport: TransportConfig = field(default_factory=TransportConfig)


@dataclass(frozen=True, slots=True)
class Pending:
    target: int
    since_s: float  # monotonic
    grow: bool = True  # workers on their way in (False: on their way out)


def model_target(timing: TimingModel, obs: Observation, config: PlannerConfig, options: PlanOptions) -> ModelTarget | None:
    """The profile's answer for the observed workload, or None when the interval says too little.

    Decode from the plan (a decode step is nearly deterministic, so its mean ITL is its p90); prefill sized
    for the TTFT's p90 (``prefill_workers_for_quantile``): sized for the mean, a pool misses a p90 SLO.
    """
    if obs.isl_mean is None or obs.osl_mean is None or obs.arrival_rate_rps <= 0:
        return None
    isl = obs.isl_samples or (max(1, round(obs.isl_mean)),)
    rate = obs.arrival_rate_rps
    disagg = plan_disaggregated(timing, Workload.of(isl, max(1, round(obs.osl_mean)), rate=rate), config.slo, rate,
                                options)
    if not disagg.feasible or disagg.prefill is None or disagg.decode is None:
        return None
    remote = [n for n in isl if n > disagg.local_prefill_max_tokens]
    num_prefill = prefill_workers_for_quantile(timing, remote, rate * len(remote) / len(isl), config.slo.ttft_ms / 1e3,
                                               0.9, config.max_prefill)
    return ModelTarget(num_prefill=config.max_prefill if num_prefill is None else num_prefill,
                       num_decode=disagg.decode.workers)


def hold_pending(decision: PoolDecision, pending: Pending | None, now_s: float, timeout_s: float) -> PoolDecision:
    """While a pool is on its way to an earlier target, keep that target (growth above it still counts).

    Reached once the pool is at least the target it grew toward (or at most the one it shrank toward): workers
    that were starting when the planner first looked (slow engines) count toward it, and are never drained for
    a target set while they were not yet registered.
    """
    if pending is None or now_s - pending.since_s > timeout_s:
        return decision
    if (decision.current >= pending.target) if pending.grow else (decision.current <= pending.target):
        return decision
    if decision.target > pending.target and decision.target > decision.current:
        return decision
    return replace(decision, target=pending.target, reasons=("pending",))


def recent_scrape(history: deque[tuple[float, FrontendSnapshot]], now_s: float,
                  interval_s: float) -> tuple[float, FrontendSnapshot]:
    """The newest scrape before the last one at least three quarters of an interval old (arrivals since it are
    the "recent" ones: a confirmation a quarter interval after a decision counts them over an interval, not
    over its fraction of one); the oldest when none is."""
    for at_s, snap in reversed(list(history)[:-1]):
        if now_s - at_s >= 0.75 * interval_s:
            return at_s, snap
    return history[0]


class PlannerService:
    def __init__(self, config: PlannerServiceConfig) -> None:
        self.config = config
        self.events_endpoint = ""
        self._state = PlannerState()
        self._pending: dict[Role, Pending | None] = {"prefill": None, "decode": None}
        self._seq = 0
        self._switch = self._switch_before = SwitchState()
        self._unswitched: ScaleDecision | None = None
        self._state_unswitched = self._state
        self._pending_unswitched = dict(self._pending)
        self._last_obs: Observation | None = None  # the previous interval's (the decode pool's growth)
        # ... and the one before it: a confirmation measures growth from there (over 0.5 s, one arrival would
        # project as a phase change).
        self._growth_base: Observation | None = None
        self._decided: ScaleDecision | None = None  # the last interval's verdict on the windows (confirmations reuse it)
        self._decided_model: ModelTarget | None = None

    async def run(self, ready: asyncio.Event | None = None) -> None:
        secure = open_context(self.config.transport)
        pub = secure.ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        # CURVE: only subscribers whose key is in the planner's clients/ (scaler, its own) complete a handshake.
        secure_server(pub, self.config.transport.curve)
        router = RouterSet(secure.ctx, self.config.router_endpoint, self.config.transport)  # any live replica
        decisions = self.config.decisions_path.open("a") if self.config.decisions_path else None
        try:
            pub.bind(self.config.events_endpoint)
            self.events_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            log.info("planner_ready", events=self.events_endpoint, interval_s=self.config.interval_s,
                     slo=asdict(self.config.policy.slo), model=self.config.timing is not None)
            if ready is not None:
                ready.set()
            history: deque[tuple[float, FrontendSnapshot]] = deque()  # (monotonic s, scrape), oldest first
            confirm = False  # this observation confirms a move the previous one found waiting on hysteresis
            while True:
                try:
                    now = await self._scrape()
                    workers = await router.request(ListWorkers(request_id=new_id("plan")), timeout_s=2.0)
                except (OSError, ValueError, TransportTimeout, RemoteError) as exc:
                    # A frontend or router starting or restarting: no interval this time, the next one spans it.
                    log.warning("planner_observe_failed", error=str(exc))
                    await asyncio.sleep(self.config.interval_s)
                    continue
                assert isinstance(workers, WorkerList)
                now_s = time.monotonic()
                if history and now.num_finished < history[-1][1].num_finished:
                    history.clear()  # a frontend restarted: its counters began again
                history.append((now_s, now))
                # The window: the oldest scrape not older than window_s (the first scrape is only a baseline).
                while len(history) > 2 and now_s - history[1][0] >= self.config.window_s:
                    history.popleft()
                if len(history) < 2:
                    await asyncio.sleep(self.config.interval_s)
                    continue
                start_s, start = history[0]
                recent_s, recent = recent_scrape(history, now_s, self.config.interval_s)
                obs = replace(observe(start, now, now_s - start_s, workers, (recent, now_s - recent_s)),
                              end_s=now_s)
                record = self.step(obs, now_s, members_of(workers), confirm=confirm)
                if record["move"] is not None:
                    await self._set_role(router, pub, record, obs)
                for msg in record["requests"]:
                    await pub.send(encode(msg))
                if decisions is not None:
                    decisions.write(json.dumps(
                        {**record, "move": asdict(record["move"]) if record["move"] is not None else None,
                         "requests": [asdict_request(m) for m in record["requests"]]}) + "\n")
                    decisions.flush()
                wait_s = next_wait_s(record.get("no_move"), self.config.interval_s, self.config.confirm_s)
                confirm = wait_s < self.config.interval_s
                await asyncio.sleep(wait_s)
        finally:
            if decisions is not None:
                decisions.close()
            await router.close()
            pub.close()
            secure.close()

    def step(self, obs: Observation, now_s: float, members: tuple[Member, ...] = (), confirm: bool = False) -> dict:
        """One decision from one observation (the loop's body, without I/O). ``record["move"]``: the worker to
        move (the loop sends SetRole, then ``moved`` or ``move_refused``), else None. ``confirm``: an observation
        between intervals that re-reads only the live state: the windows' verdict is the last decision's (its
        interval counts are not advanced), and the decode pool's growth is measured from the observation that
        decision measured it from (over an interval or more, not the confirmation's fraction of one)."""
        cfg = self.config
        before = self._state
        confirm = confirm and self._decided is not None
        if confirm:
            model, decision = self._decided_model, replace(self._decided, state=before)
        else:
            model = model_target(cfg.timing, obs, cfg.policy, cfg.plan_options) if cfg.timing is not None else None
            decision = decide(obs, before, cfg.policy, model)
            self._decided, self._decided_model = decision, model
        self._state = decision.state
        record: dict = {"time_s": time.time(), "observation": asdict(obs),
                        "model": asdict(model) if model is not None else None, "move": None, "confirm": confirm}
        final = decision
        if cfg.role_switch:
            live = None
            # At most one move an interval, confirmations or not.
            switch = replace(cfg.switch, max_prefill=cfg.policy.max_prefill, max_decode=cfg.policy.max_decode,
                             min_gap_s=max(cfg.switch.min_gap_s, cfg.interval_s))
            if cfg.timing is not None and cfg.live is not None:
                base = self._growth_base if confirm else self._last_obs
                live = live_pressure(obs, base, cfg.timing, cfg.policy.slo, cfg.live)
                record["live"] = asdict(live)
                decision = drop_lagging_model(decision, live, cfg.policy.slo, cfg.live)
                switch = replace(switch, spare_intervals=cfg.live.spare_intervals)
            pressure = pool_pressure(obs, decision, cfg.policy, switch, model, live)
            switched = choose_move(pressure, members, self._switch, switch, now_s)
            self._switch_before, self._switch = self._switch, switched.state
            final = switch_first(decision, switched.choice)
            self._unswitched, self._state_unswitched = decision, decision.state
            # A pool whose target change waits for a move did not change (its latency windows stay valid), unless
            # its observed size did.
            observed_p_s, observed_d_s = pools_changed_s(obs, before)
            self._state = replace(decision.state,
                                  changed_prefill_s=decision.state.changed_prefill_s if final.prefill.changed
                                  else observed_p_s,
                                  changed_decode_s=decision.state.changed_decode_s if final.decode.changed
                                  else observed_d_s)
            record["pressure"] = asdict(pressure)
            if isinstance(switched.choice, Move):
                record["move"] = switched.choice
            else:
                record["no_move"] = switched.choice.reason
        self._pending_unswitched = dict(self._pending)
        if not confirm:
            self._growth_base, self._last_obs = self._last_obs, obs
        record["requests"] = self._requests(final, obs, now_s)
        return record

    def moved(self, record: dict, reply: RoleSet, now_s: float) -> None:
        """The router moved the worker: windows that began before now hold both pools' old latencies."""
        self._state = replace(self._state, changed_prefill_s=now_s, changed_decode_s=now_s)
        record["role_set"] = {"worker_id": reply.worker_id, "role": reply.role, "ok": reply.ok,
                              "seconds": reply.seconds}
        log.info("role_switched", worker_id=reply.worker_id, role=reply.role, seconds=round(reply.seconds, 3),
                 reasons=",".join(record["move"].reasons))

    def move_refused(self, record: dict, obs: Observation, now_s: float, why: str) -> None:
        """No move after all: the switch state as before it, and this interval's scaling as if none was possible."""
        self._switch = replace(self._switch_before, short_prefill=self._switch.short_prefill,
                               short_decode=self._switch.short_decode)
        self._state, self._pending = self._state_unswitched, self._pending_unswitched
        record["move_refused"] = why
        log.warning("role_switch_refused", worker_id=record["move"].worker_id, reason=why)
        record["requests"] = self._requests(switch_first(self._unswitched, NoMove("refused")), obs, now_s)

    def _requests(self, decision: ScaleDecision, obs: Observation, now_s: float) -> list[ScaleRequest]:
        cfg = self.config
        requests = []
        for pool_decision in (decision.prefill, decision.decode):
            pool = pool_decision.pool
            final = hold_pending(pool_decision, self._pending[pool], now_s, cfg.pending_timeout_s)
            if final.target != final.current:
                pending = self._pending[pool]
                if pending is None or pending.target != final.target:
                    self._pending[pool] = Pending(final.target, now_s, grow=final.target > final.current)
                    log.info("scale", pool=pool, current=final.current, target=final.target,
                             reasons=",".join(final.reasons), ttft_p90_ms=obs.ttft_p90_ms, itl_p90_ms=obs.itl_p90_ms,
                             rate_rps=round(obs.arrival_rate_rps, 2), isl=obs.isl_mean, osl=obs.osl_mean)
            else:
                self._pending[pool] = None
            self._seq += 1
            requests.append(ScaleRequest(seq=self._seq, pool=pool, current=final.current, target=final.target,
                                         reason=",".join(final.reasons), time_s=time.time()))
        return requests

    async def _set_role(self, router: RouterSet, pub: zmq.asyncio.Socket, record: dict, obs: Observation) -> None:
        move: Move = record["move"]
        msg = SetRole(request_id=new_id("role"), worker_id=move.worker_id, role=move.to_role,
                      reason=",".join(move.reasons))
        try:
            reply = await router.request(msg, timeout_s=self.config.set_role_timeout_s)
        except (TransportTimeout, RemoteError) as exc:
            self.move_refused(record, obs, time.monotonic(), f"router: {exc}")
            return
        if not isinstance(reply, RoleSet) or not reply.ok:
            self.move_refused(record, obs, time.monotonic(), getattr(reply, "reason", type(reply).__name__))
            return
        self.moved(record, reply, time.monotonic())
        await pub.send(encode(reply))  # before the new sizes: orchestrators count the worker in its new pool

    async def _scrape(self) -> FrontendSnapshot:
        texts = await asyncio.gather(*(asyncio.to_thread(_get, url) for url in self.config.metrics_urls))
        return merge(parse_metrics(t) for t in texts)


def next_wait_s(no_move: str | None, interval_s: float, confirm_s: float | None) -> float:
    """Seconds until the next observation: ``confirm_s`` (default a quarter interval) when a move waits only on
    its hysteresis, else the interval."""
    if no_move != "hysteresis":
        return interval_s
    wait_s = interval_s / 4 if confirm_s is None else confirm_s
    return min(max(wait_s, 0.0), interval_s)


def members_of(workers: WorkerList) -> tuple[Member, ...]:
    """The router's prefill and decode workers as the switch policy sees them (aggregated ones stay put)."""
    draining = set(workers.draining)
    return tuple(Member(info.worker_id, info.role, info.switchable, load.num_running + load.num_waiting,
                        info.worker_id in draining)
                 for info, load in zip(workers.workers, workers.loads) if info.role in ("prefill", "decode"))


def asdict_request(msg: ScaleRequest) -> dict:
    return {"pool": msg.pool, "current": msg.current, "target": msg.target, "reason": msg.reason}


def _get(url: str, timeout_s: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (operator-given URL)
        return resp.read().decode()
