"""The logits processor that forces a hand-off's first token: one row forced for one step, nothing otherwise."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


def test_forces_one_row_for_its_first_step_then_leaves_the_batch_alone() -> None:
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from services.worker.engines.vllm.first_token import FORCED_TOKEN_KEY, ForceFirstToken

    proc = ForceFirstToken(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    logits = torch.zeros(2, 8)
    proc.update_state(None)
    assert proc.apply(logits) is logits and not logits.isinf().any()  # nothing forced: untouched

    forced_out: list[int] = []
    plain = SamplingParams(max_tokens=4)
    handed = SamplingParams(max_tokens=4, extra_args={FORCED_TOKEN_KEY: 5})
    proc.update_state(BatchUpdate(batch_size=2, removed=[], added=[(0, plain, [1, 2], []),
                                                                  (1, handed, [1, 2], forced_out)], moved=[]))
    out = proc.apply(torch.zeros(2, 8))
    assert not out[0].isinf().any()  # the other request samples freely
    assert out[1].argmax().item() == 5 and out[1].isinf().sum().item() == 7

    forced_out.append(5)  # the forced token came out: the request samples normally from now on
    proc.update_state(None)
    assert not proc.apply(torch.zeros(2, 8)).isinf().any()
