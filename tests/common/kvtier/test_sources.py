"""Own host's tier first, another host's when moving is cheaper than computing: table tests."""

from __future__ import annotations

import pytest

from common.kvtier.sources import (
    Link,
    LoadSources,
    TierRun,
    load_sources,
    pick_remote_tier,
)

BLOCK_TOKENS = 32
BLOCK_BYTES = 1 << 20  # 1 MiB per block
RATE = 3200.0  # prefill tokens/s: one block computes in 10 ms
FAST = Link(1.0e9, 0.001)  # 1 MiB moves in ~1 ms (+1 ms): cheaper than 10 ms of compute
SLOW = Link(50e6, 0.001)  # 1 MiB in ~21 ms: dearer than computing it


def run(tier: str, node: str, n: int) -> TierRun:
    return TierRun(tier, f"tcp://{node}:5570", node, n)


LINKS = {"b": FAST, "c": FAST, "s": SLOW}


@pytest.mark.parametrize(("runs", "loadable", "want_tier", "reason", "extra"), [
    # Nothing anywhere, or only the own host's tier holds blocks.
    ((), 10, None, "no_longer_run", 0),
    ((run("t-d", "d", 8),), 10, None, "no_longer_run", 0),
    # Another host holds no more than the own tier: the own tier is enough.
    ((run("t-d", "d", 8), run("t-b", "b", 8)), 10, None, "no_longer_run", 0),
    # Another host holds more, over a fast link: named, for the blocks past the own run.
    ((run("t-d", "d", 3), run("t-b", "b", 8)), 10, "t-b", "remote_cheaper", 5),
    # No own tier at all: the whole run comes from the other host.
    ((run("t-b", "b", 8),), 10, "t-b", "remote_cheaper", 8),
    # Capped by what may be loaded (the prompt's last token is computed).
    ((run("t-b", "b", 8),), 6, "t-b", "remote_cheaper", 6),
    # Over a slow link moving costs more than computing: recompute.
    ((run("t-s", "s", 8),), 10, None, "recompute_cheaper", 0),
    # Two candidates: the one saving more (the longer run over equal links) wins.
    ((run("t-b", "b", 4), run("t-c", "c", 9)), 10, "t-c", "remote_cheaper", 9),
    # Equal savings: the lower tier id.
    ((run("t-c", "c", 5), run("t-b", "b", 5)), 10, "t-b", "remote_cheaper", 5),
    # A longer run over a slow link loses to a shorter one over a fast link.
    ((run("t-s", "s", 9), run("t-b", "b", 6)), 10, "t-b", "remote_cheaper", 6),
])
def test_pick_remote_tier(runs, loadable, want_tier, reason, extra) -> None:
    pick = pick_remote_tier("d", runs, loadable, BLOCK_TOKENS, BLOCK_BYTES, RATE, LINKS.__getitem__)
    assert (pick.tier.tier_id if pick.tier else None, pick.reason, pick.num_extra_blocks) == (want_tier, reason,
                                                                                              extra)
    assert (pick.seconds_saved > 0) == (want_tier is not None)


def test_one_block_over_a_fast_link_saves_compute_minus_move() -> None:
    pick = pick_remote_tier("d", (run("t-b", "b", 1),), 4, BLOCK_TOKENS, BLOCK_BYTES, RATE, LINKS.__getitem__)
    assert pick.seconds_saved == pytest.approx(0.010 - (0.001 + BLOCK_BYTES / 1e9))


def test_pick_refuses_a_zero_rate() -> None:
    with pytest.raises(ValueError):
        pick_remote_tier("d", (), 4, BLOCK_TOKENS, BLOCK_BYTES, 0.0, LINKS.__getitem__)


@pytest.mark.parametrize(("num_local", "remote", "probed", "loadable", "want"), [
    (5, "", 0, 8, LoadSources(5, 0, "")),  # no tier named
    (5, "tcp://b", 3, 8, LoadSources(5, 3, "tcp://b")),  # own run, then the named tier's
    (0, "tcp://b", 8, 8, LoadSources(0, 8, "tcp://b")),  # own tier holds nothing
    (5, "tcp://b", 0, 8, LoadSources(5, 0, "")),  # the named tier holds nothing past the own run
    (5, "tcp://b", 9, 8, LoadSources(5, 3, "tcp://b")),  # capped by the loadable blocks
    (9, "tcp://b", 2, 8, LoadSources(8, 0, "")),
    (3, "", 4, 8, LoadSources(3, 0, "")),  # a probe without a name counts for nothing
])
def test_load_sources(num_local, remote, probed, loadable, want) -> None:
    assert load_sources(num_local, remote, probed, loadable) == want
