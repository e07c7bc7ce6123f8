"""Workload generators: deterministic by seed; shared prefixes and trace hash ids really share tokens."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from bench.lib.workloads import (
    Dist,
    TokenSource,
    WorkloadSpec,
    chat_messages,
    make_workload,
    poisson_arrivals,
    prefix_warmup,
    trace_prompt,
)


def test_dist_parse_and_sample():
    rng = random.Random(0)
    assert Dist.parse("512").sample_int(rng) == 512
    assert str(Dist.parse("normal:512:64")) == "normal:512:64"
    assert Dist.parse("normal:512:64").describe() == {"kind": "normal", "mean": 512.0, "std": 64.0,
                                                      "spec": "normal:512:64"}
    u = [Dist.parse("uniform:3:5").sample_int(rng) for _ in range(200)]
    assert set(u) == {3, 4, 5}
    assert all(Dist.parse("normal:2:50").sample_int(rng) >= 1 for _ in range(200))
    for bad in ("normal:1", "uniform:5:3", "zipf:1", "abc"):
        with pytest.raises(ValueError):
            Dist.parse(bad)


def _tokens(sessions):
    return [t.tokens for s in sessions for t in s.turns]


def test_synthetic_deterministic_exact_lengths_and_salted():
    spec = WorkloadSpec(kind="synthetic", isl="uniform:10:20", osl="8")
    a, b = make_workload(spec, 20, seed=7), make_workload(spec, 20, seed=7)
    assert _tokens(a) == _tokens(b)
    assert _tokens(make_workload(spec, 20, seed=8)) != _tokens(a)
    assert _tokens(make_workload(spec, 20, seed=7, salt=1)) != _tokens(a)  # sweep points differ
    assert all(10 <= len(t) <= 20 for t in _tokens(a))
    assert all(s.turns[0].osl == 8 for s in a)
    assert all(100 <= tok < 8000 for t in _tokens(a) for tok in t)
    assert len({tuple(t[:10]) for t in _tokens(a)}) == 20  # unique prompts


def test_shared_prefix_shares_prefixes_with_zipf_skew():
    spec = WorkloadSpec(kind="shared-prefix", num_prefixes=4, prefix_len=32, suffix_len="8", prefix_skew=1.5,
                        osl="4")
    sessions = make_workload(spec, 400, seed=1)
    assert _tokens(sessions) == _tokens(make_workload(spec, 400, seed=1))
    by_tag: dict[str, set] = {}
    for s in sessions:
        toks = s.turns[0].tokens
        assert len(toks) == 40
        by_tag.setdefault(s.tag, set()).add(tuple(toks[:32]))
    assert all(len(prefixes) == 1 for prefixes in by_tag.values())  # one prefix per tag
    assert len({next(iter(p)) for p in by_tag.values()}) == len(by_tag)  # tags have different prefixes
    assert len({tuple(s.turns[0].tokens[32:]) for s in sessions}) == 400  # unique suffixes
    counts = Counter(s.tag for s in sessions)
    assert counts["prefix-0"] > counts["prefix-1"] > counts["prefix-3"]  # skewed toward rank 0
    uniform = Counter(s.tag for s in make_workload(
        WorkloadSpec(kind="shared-prefix", num_prefixes=4, prefix_len=8, suffix_len="2"), 400, seed=1))
    assert max(uniform.values()) < 2 * min(uniform.values())


def test_prefix_warmup_sends_each_prefix_of_the_point_once():
    spec = WorkloadSpec(kind="shared-prefix", num_prefixes=3, prefix_len=32, suffix_len="8", osl="4")
    measured = [s.turns[0].tokens for s in make_workload(spec, 60, seed=1, salt=7)]
    warm = prefix_warmup(spec, seed=1, salt=7)
    assert [s.tag for s in warm] == ["prefix-0", "prefix-1", "prefix-2"]
    assert all(len(s.turns) == 1 and s.turns[0].osl == 1 and s.turns[0].isl == 32 + 16 for s in warm)
    # Every measured prompt starts with one warmed prefix; none equals a warm-up prompt.
    assert {tuple(t[:32]) for t in measured} == {tuple(s.turns[0].tokens[:32]) for s in warm}
    assert not {tuple(t) for t in measured} & {tuple(s.turns[0].tokens) for s in warm}
    # Another point's salt: other prefixes.
    other = prefix_warmup(spec, seed=1, salt=8)
    assert not {tuple(s.turns[0].tokens[:32]) for s in other} & {tuple(t[:32]) for t in measured}
    with pytest.raises(ValueError, match="shared-prefix"):
        prefix_warmup(WorkloadSpec(kind="synthetic"), seed=1, salt=7)


def test_multi_turn_history_grows():
    spec = WorkloadSpec(kind="multi-turn", isl="16", osl="8", turns="3", think_time_s="0.5")
    sessions = make_workload(spec, 7, seed=3)
    assert sum(len(s.turns) for s in sessions) == 7
    assert [len(s.turns) for s in sessions] == [3, 3, 1]
    t0, t1, t2 = sessions[0].turns
    assert (t0.isl, t1.isl, t2.isl) == (16, 16 + 8 + 16, 16 + 8 + 16 + 8 + 16)
    assert t1.tokens[:16] == t0.tokens and t2.tokens[:t1.isl] == t1.tokens  # earlier prompt is a prefix
    assert (t0.think_s, t1.think_s) == (0.0, 0.5)
    roles = [m["role"] for m in chat_messages(t2)]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert _tokens(sessions) == _tokens(make_workload(spec, 7, seed=3))


@pytest.mark.parametrize("fraction, lo, hi", [(0.0, 0, 0), (0.25, 60, 140), (1.0, 400, 400)])
def test_long_mix_fraction_of_long_prompts(fraction, lo, hi):
    spec = WorkloadSpec(kind="long-mix", isl="uniform:32:64", long_isl="512", long_fraction=fraction, osl="8")
    sessions = make_workload(spec, 400, seed=5)
    longs = [s for s in sessions if s.tag == "long"]
    assert lo <= len(longs) <= hi
    assert all(s.turns[0].isl == 512 for s in longs)
    assert all(32 <= s.turns[0].isl <= 64 for s in sessions if s.tag == "short")
    assert _tokens(sessions) == _tokens(make_workload(spec, 400, seed=5))
    assert len({tuple(t[:16]) for t in _tokens(sessions)}) == 400  # unique prompts: no prefix hits


def test_long_mix_rejects_a_fraction_outside_0_1():
    with pytest.raises(ValueError):
        make_workload(WorkloadSpec(kind="long-mix", long_fraction=1.5), 4, seed=0)


def test_trace_equal_hash_ids_map_to_equal_blocks(tmp_path):
    rows = [{"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [7, 10]},
            {"timestamp": 3000, "input_length": 1200, "output_length": 2, "hash_ids": [11]}]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = WorkloadSpec(kind="trace", trace=str(path), trace_time_scale=0.5)
    sessions = make_workload(spec, 10, seed=0)
    a, b, c = (s.turns[0].tokens for s in sessions)
    assert (len(a), len(b), len(c)) == (1100, 600, 1200)  # cut, cut, padded
    assert a[:512] == b[:512]  # hash id 7 shared
    assert a[512:600] != b[512:600]  # 8 vs 10
    assert c[:512] != a[:512]
    assert [s.turns[0].osl for s in sessions] == [5, 3, 2]
    assert [s.at_s for s in sessions] == [0.0, 0.25, 1.0]
    assert _tokens(make_workload(spec, 10, seed=0)) == _tokens(sessions)
    assert len(make_workload(spec, 2, seed=0)) == 2
    # the block of a hash id depends on (seed, salt, id) only
    src = TokenSource(0)
    assert list(trace_prompt({"input_length": 512, "hash_ids": [7]}, src, 512, 0)) == a[:512]
    path.write_text('{"timestamp": 1}\n')
    with pytest.raises(ValueError):
        make_workload(spec, 10, seed=0)


def test_poisson_arrivals_deterministic_with_rate():
    arr = poisson_arrivals(2000, rate=50.0, seed=1)
    assert arr == poisson_arrivals(2000, rate=50.0, seed=1)
    assert arr[0] == 0.0 and all(b >= a for a, b in zip(arr, arr[1:]))
    assert arr[-1] / 1999 == pytest.approx(1 / 50.0, rel=0.1)
