from __future__ import annotations

from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.tokens import next_token_id


def test_never_emits_any_end_token_unless_asked() -> None:
    config = MockEngineConfig(vocab_size=10, eos_token_id=2, other_eos_token_ids=(0, 9))
    seen = {next_token_id((i, i * 7), seed=i, config=config) for i in range(2000)}
    assert seen == {1, 3, 4, 5, 6, 7, 8}
    loud = MockEngineConfig(vocab_size=10, eos_token_id=2, other_eos_token_ids=(0, 9), emit_eos=True)
    assert {next_token_id((i, i * 7), seed=i, config=loud) for i in range(2000)} == set(range(10))
