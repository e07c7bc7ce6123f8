"""The frontend's metric values as the dashboard reads them (public prometheus_client API, no private fields)."""

from __future__ import annotations

from services.frontend.metrics import FrontendMetrics


def test_values_follow_the_metrics() -> None:
    m = FrontendMetrics()
    assert m.value("splitserve_frontend_migrations_total") == 0.0
    m.migrations.inc()
    m.migrations.inc()
    m.prefill_decisions.labels(where="remote").inc()
    m.inflight.set(3)
    assert m.value("splitserve_frontend_migrations_total") == 2.0
    assert m.value("splitserve_frontend_prefill_decisions_total", where="remote") == 1.0
    assert m.value("splitserve_frontend_prefill_decisions_total", where="local") == 0.0
    assert m.value("splitserve_frontend_inflight_requests") == 3.0
