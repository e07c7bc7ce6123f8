"""The disk tier's slab file: never opened through a planted link, never someone else's file truncated."""

from __future__ import annotations

import os
import stat

import pytest

from services.kvtier.disk import open_slab


def test_a_planted_symlink_is_neither_followed_nor_truncated(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    slab = tmp_path / "kvtier-t.slab"
    slab.symlink_to(victim)
    with pytest.raises(OSError, match="refusing"):
        open_slab(slab)
    assert victim.read_bytes() == b"precious"
    assert slab.is_symlink()


def test_a_stale_slab_of_ours_is_replaced_with_a_private_file(tmp_path) -> None:
    slab = tmp_path / "kvtier-t.slab"
    slab.write_bytes(b"old run")
    fd = open_slab(slab)
    try:
        assert os.fstat(fd).st_size == 0
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
    finally:
        os.close(fd)


def test_a_fresh_path_makes_a_private_file(tmp_path) -> None:
    fd = open_slab(tmp_path / "new.slab")
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "new.slab").stat().st_mode) == 0o600
