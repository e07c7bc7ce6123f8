"""The admission options as `frontend` parses them and `up` hands them on."""

from __future__ import annotations

import pytest

from cli.admission_options import admission_args, admission_config


def test_up_hands_frontends_only_the_admission_options_given() -> None:
    assert admission_args(4096, 0, 30.0, "", 10.0, "", 0, 0) == ()  # SPLITSERVE_MAX_INFLIGHT still applies
    assert admission_args(8, 32, 30.0, "0=1,10=30", 10.0, "a=3,b=1", 2, 0) == (
        "--max-inflight", "8", "--max-queued", "32", "--ttft-budgets", "0=1,10=30", "--tenant-weights", "a=3,b=1",
        "--reserved-inflight", "2")
    config = admission_config(8, 32, 30.0, "10=30, 0=1", 10.0, "a=3,b=1", 2, 0)
    assert config.ttft_budgets_s == ((0, 1.0), (10, 30.0)) and config.tenant_weights == {"a": 3.0, "b": 1.0}
    for bad in ({"ttft_budgets": "x=1"}, {"tenant_weights": "a=-1"}, {"tenant_weights": "a"}, {"reserved": 8}):
        with pytest.raises(Exception, match="want|integer|leave"):
            admission_config(8, 0, 30.0, bad.get("ttft_budgets", ""), 10.0, bad.get("tenant_weights", ""),
                             bad.get("reserved", 0), 0)
