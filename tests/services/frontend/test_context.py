"""The served context: the model's, capped by the smallest max_model_len a worker of that model registered."""

from __future__ import annotations

import pytest

from common.protocol import WorkerInfo, WorkerList, WorkerLoad
from services.frontend.context import served_context_len


def _workers(*specs: tuple[str, int]) -> WorkerList:
    infos = tuple(WorkerInfo(worker_id=f"w{i}", role="both", model=model, block_size=32, num_blocks=8,
                             endpoint="tcp://127.0.0.1:1", max_model_len=n) for i, (model, n) in enumerate(specs))
    return WorkerList(request_id="r", workers=infos, loads=tuple(WorkerLoad() for _ in infos))


@pytest.mark.parametrize(("workers", "expected"), [
    (None, 4096),                                              # no list yet: the model's own context
    (_workers(), 4096),
    (_workers(("tiny", 8192)), 4096),                          # workers may not raise it
    (_workers(("tiny", 2000), ("tiny", 3000)), 2000),          # the smallest: any of them may get the request
    (_workers(("tiny", 0)), 4096),                             # 0 = not reported
    (_workers(("other", 100), ("tiny", 3000)), 3000),          # other models' workers do not count
])
def test_served_context_len(workers, expected) -> None:
    assert served_context_len(4096, workers, "tiny") == expected
