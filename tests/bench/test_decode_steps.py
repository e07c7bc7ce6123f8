"""bench/decode_steps.py's accounting: each gap filed under the streams decoding then and what the prefill engine
was doing, from the prefill worker's own log lines."""

from __future__ import annotations

import datetime

from bench.decode_steps import Prefill, Stream, gaps_in_context, prefills_from_log, summary

T0 = datetime.datetime(2026, 12, 8, 0, 32, 34, tzinfo=datetime.timezone.utc).timestamp()

LOG = [
    "2026-12-08T00:32:34.500000Z [info     ] request_done                   duration_ms=400.0 finish_reason=length "
    "kind=prefill kv_transfer= num_cached_tokens=0 num_output_tokens=1 num_prompt_tokens=2048 outcome=finished "
    "request_id=cmpl-1 service=worker-prefill",
    "2026-12-08T00:32:35.000000Z [info     ] request_done                   duration_ms=2000.0 finish_reason=length "
    "kind=generate kv_transfer=pull num_cached_tokens=0 num_output_tokens=96 num_prompt_tokens=2048 "
    "outcome=finished request_id=cmpl-1 service=worker-decode",
    "WARNING:vllm.triton_utils.importing:Triton is installed, but doesn't include CPU backend.",
]


def test_prefills_come_from_the_prefill_workers_lines_only() -> None:
    (p,) = prefills_from_log(LOG)
    assert p.num_prompt_tokens == 2048
    assert abs(p.end_s - (T0 + 0.5)) < 1e-6 and abs(p.start_s - (T0 + 0.1)) < 1e-6


def test_each_gap_is_filed_by_streams_and_the_prefill_engine() -> None:
    # Stream a decodes alone 0-0.1 s, with b from 0.1 s; a long prefill runs 0.15-0.25 s, a short one 0.35-0.45.
    a = Stream(T0, (0.0, 0.05, 0.1, 0.2, 0.3, 0.42))
    b = Stream(T0 + 0.1, (0.05, 0.15, 0.25))
    prefills = [Prefill(T0 + 0.15, T0 + 0.25, 2048), Prefill(T0 + 0.35, T0 + 0.45, 100)]
    gaps = {k: [round(g) for g in v] for k, v in gaps_in_context([a, b], prefills).items()}
    assert gaps == {
        (1, "idle"): [50, 50],  # a's 0-0.05, 0.05-0.1: b's first chunk is at 0.15
        (2, "long prefill"): [100, 100, 100],  # a's 0.1-0.2 and 0.2-0.3 and b's 0.15-0.25 overlap it
        (2, "idle"): [100],  # b's 0.25-0.35 (wall): a still decodes, nothing prefilling
        (1, "prefill"): [120],  # a's 0.3-0.42: b ended at 0.35, the short prefill from 0.35
    }
    rows = summary(gaps_in_context([a, b], prefills))
    assert [(r["streams"], r["prefill_engine"], r["num_gaps"]) for r in rows] == [
        (1, "idle", 2), (1, "prefill", 1), (2, "idle", 1), (2, "long prefill", 3)]
