"""Which transfers a heartbeat reports: a pull's source filled in only where a single one is possible, a push's
source always this worker."""

from __future__ import annotations

from common.protocol import TransferSample
from services.worker.transfer_sources import TransferSources


def sample(seq: int, src: str = "") -> TransferSample:
    return TransferSample(seq=seq, seconds=0.01, num_bytes=1000, src_worker_id=src)


def sources_of(samples: tuple[TransferSample, ...]) -> list[tuple[int, str]]:
    return [(s.seq, s.src_worker_id) for s in samples]


def test_each_sample_reported_once() -> None:
    sources = TransferSources()
    assert sources_of(sources.new_samples((sample(1, "p"), sample(2, "q")))) == [(1, "p"), (2, "q")]
    assert sources.new_samples((sample(1, "p"), sample(2, "q"))) == ()
    assert sources_of(sources.new_samples((sample(2, "q"), sample(3, "p")))) == [(3, "p")]


def test_unattributed_pull_gets_the_only_possible_source() -> None:
    sources = TransferSources()
    sources.started("r1", "p")
    sources.started("r2", "p")
    sources.finished("r1")
    assert sources_of(sources.new_samples((sample(1),))) == [(1, "p")]


def test_two_possible_sources_attribute_nothing() -> None:
    sources = TransferSources()
    sources.started("r1", "p")
    sources.finished("r1")
    sources.started("r2", "q")
    assert sources_of(sources.new_samples((sample(1), sample(2, "q")))) == [(1, ""), (2, "q")]


def test_a_pull_from_the_interval_before_still_counts() -> None:
    sources = TransferSources()
    sources.started("r1", "p")
    sources.finished("r1")
    assert sources.new_samples(()) == ()  # a beat before r1's sample was recorded
    sources.started("r2", "q")
    sources.finished("r2")
    # r1 (last interval) and r2 (this one): the sample could be either.
    assert sources_of(sources.new_samples((sample(1),))) == [(1, "")]
    # Two intervals later, only q's pull is still possible: nothing was pulling since.
    assert sources_of(sources.new_samples((sample(2),))) == [(2, "q")]
    assert sources_of(sources.new_samples((sample(3),))) == [(3, "")]


def test_filled_sources_are_remembered_for_stats() -> None:
    sources = TransferSources()
    sources.started("r1", "p")
    sources.new_samples((sample(1),))
    sources.finished("r1")
    sources.new_samples(())
    sources.started("r2", "q")
    sources.started("r3", "p")
    sources.new_samples((sample(1), sample(2)))  # 2 could be from q or p: left unnamed
    assert sources_of(sources.named((sample(1), sample(2), sample(3, "q")))) == [(1, "p"), (2, ""), (3, "q")]


def test_a_push_is_from_this_worker_whatever_was_pulling() -> None:
    # A kv_both worker: it pulled from p (a pull sample then has one possible source) and pushed into d. Its push
    # names its destination; its source is this worker, never the pull's source.
    sources = TransferSources("me")
    sources.started("r1", "p")
    push = TransferSample(seq=2, seconds=0.01, num_bytes=1000, dst_worker_id="d")
    got = sources.new_samples((sample(1), push))
    assert [(s.seq, s.src_worker_id, s.dst_worker_id) for s in got] == [(1, "p", ""), (2, "me", "d")]
    assert [(s.seq, s.src_worker_id) for s in sources.named((sample(1), push))] == [(1, "p"), (2, "me")]
    # A worker without an id (tests, tools) leaves a push's source empty rather than guessing.
    anonymous = TransferSources()
    anonymous.started("r1", "p")
    assert [(s.seq, s.src_worker_id) for s in anonymous.new_samples((push,))] == [(2, "")]
