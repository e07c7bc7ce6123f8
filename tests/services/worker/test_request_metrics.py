"""The worker counts the requests it ends by kind and outcome (a prefill host's /metrics shows its prefills), and
a role switch moves those series to the new role's label."""

from __future__ import annotations

from services.worker.metrics import WorkerMetrics


def test_requests_counted_by_kind_and_outcome_and_relabelled_on_a_role_switch() -> None:
    metrics = WorkerMetrics("p0", "prefill")
    sample = metrics.registry.get_sample_value
    metrics.request_done("prefill", "finished", 300)
    metrics.request_done("prefill", "finished", 200)
    metrics.request_done("generate", "lost", 10)
    labels = {"worker_id": "p0", "role": "prefill"}
    assert sample("splitserve_worker_requests_total", {**labels, "kind": "prefill", "outcome": "finished"}) == 2
    assert sample("splitserve_worker_requests_total", {**labels, "kind": "generate", "outcome": "lost"}) == 1
    assert sample("splitserve_worker_prompt_tokens_total", {**labels, "kind": "prefill"}) == 500
    metrics.set_role("decode")
    assert sample("splitserve_worker_requests_total", {**labels, "kind": "prefill", "outcome": "finished"}) is None
    assert sample("splitserve_worker_prompt_tokens_total", {**labels, "kind": "prefill"}) is None
    metrics.request_done("generate", "finished", 7)
    decode = {"worker_id": "p0", "role": "decode"}
    assert sample("splitserve_worker_requests_total", {**decode, "kind": "generate", "outcome": "finished"}) == 1
