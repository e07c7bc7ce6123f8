"""The frontend's admission options (`frontend`, `up`): queue, priorities' TTFT budgets, tenant weights
(services/frontend/admission.py; docs/fleet.md#priority-and-fair-shares)."""

from __future__ import annotations

import typer

from services.frontend.admission import AdmissionConfig

MaxQueued = typer.Option(0, min=0, help="Generate requests that may wait for a slot past --max-inflight, ordered by "
                         "priority, deadline and tenant share; past it the least important is shed (0: no queue, "
                         "503 at once)")
MaxQueueWaitS = typer.Option(30.0, help="Seconds a request may wait in the admission queue before a 503")
TtftBudgets = typer.Option("", help="TTFT budgets by priority, PRIORITY=SECONDS,...: a request's deadline in the "
                           "queue is its arrival plus the budget of the largest listed priority at or below its own "
                           "(e.g. '0=0.5,10=30')")
DefaultTtftBudgetS = typer.Option(10.0, help="TTFT budget of priorities below every --ttft-budgets entry")
ReservedInflight = typer.Option(0, min=0, help="The last this-many --max-inflight slots only for requests of "
                                "priority <= --reserved-max-priority (less important work never holds them all)")
ReservedMaxPriority = typer.Option(0, help="Least important priority (largest value) the reserved slots take")
TenantWeights = typer.Option("", help="Tenant shares, TENANT=WEIGHT,...: tenants (the x-tenant header, else one "
                             "per API key) share slots in proportion (unlisted: 1)")


def _pairs(text: str, flag: str) -> list[tuple[str, float]]:
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or not name.strip() or number <= 0:
            raise typer.BadParameter(f"{item!r}: want NAME=POSITIVE_NUMBER", param_hint=flag)
        out.append((name.strip(), number))
    return out


def admission_config(max_inflight: int, max_queued: int, max_queue_wait_s: float, ttft_budgets: str,
                     default_ttft_budget_s: float, tenant_weights: str, reserved_inflight: int = 0,
                     reserved_max_priority: int = 0) -> AdmissionConfig:
    budgets = []
    for name, seconds in _pairs(ttft_budgets, "--ttft-budgets"):
        try:
            budgets.append((int(name), seconds))
        except ValueError:
            raise typer.BadParameter(f"{name!r} is not an integer priority", param_hint="--ttft-budgets") from None
    if reserved_inflight >= max_inflight:
        raise typer.BadParameter("must leave at least one of --max-inflight's slots to every priority",
                                 param_hint="--reserved-inflight")
    return AdmissionConfig(max_inflight=max_inflight, max_queued=max_queued, max_queue_wait_s=max_queue_wait_s,
                           reserved_inflight=reserved_inflight, reserved_max_priority=reserved_max_priority,
                           ttft_budgets_s=tuple(sorted(budgets)), default_ttft_budget_s=default_ttft_budget_s,
                           tenant_weights=dict(_pairs(tenant_weights, "--tenant-weights")))


def admission_args(max_inflight: int, max_queued: int, max_queue_wait_s: float, ttft_budgets: str,
                   default_ttft_budget_s: float, tenant_weights: str, reserved_inflight: int,
                   reserved_max_priority: int) -> tuple[str, ...]:
    """The options given as `up` hands them to each frontend, checked first (a typo fails `up`, not a child); those
    at their defaults are left out, so the frontend's own defaults and environment (SPLITSERVE_MAX_INFLIGHT) apply."""
    admission_config(max_inflight, max_queued, max_queue_wait_s, ttft_budgets, default_ttft_budget_s, tenant_weights,
                     reserved_inflight, reserved_max_priority)
    given = {"--max-inflight": (max_inflight, 4096), "--max-queued": (max_queued, 0),
             "--max-queue-wait-s": (max_queue_wait_s, 30.0), "--ttft-budgets": (ttft_budgets, ""),
             "--default-ttft-budget-s": (default_ttft_budget_s, 10.0), "--tenant-weights": (tenant_weights, ""),
             "--reserved-inflight": (reserved_inflight, 0), "--reserved-max-priority": (reserved_max_priority, 0)}
    return tuple(item for flag, (value, default) in given.items() if value != default for item in (flag, str(value)))
