"""model_identity: the same model's files give one identity anywhere; a different config, tokenizer or weight
file gives another, whatever the directory is called."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from common.errors import ModelError
from common.hashing import block_hashes, hash_seed
from common.model_identity import model_identity


def _model(root: Path, *, hidden: int = 64, vocab: str = "abc", weight_bytes: int = 100,
           weight_name: str = "model.safetensors") -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"hidden_size": hidden, "vocab_size": 3}))
    (root / "tokenizer.json").write_text(json.dumps({"vocab": list(vocab)}))
    (root / weight_name).write_bytes(b"\0" * weight_bytes)
    (root / "README.md").write_text("not part of the identity")
    return root


def test_the_same_model_in_two_paths_has_one_identity(tmp_path: Path) -> None:
    a = _model(tmp_path / "one" / "llama")
    b = _model(tmp_path / "elsewhere" / "renamed")
    (b / "README.md").write_text("another readme")  # not a model file
    (b / ".cache").mkdir()
    (b / ".cache" / "x.safetensors").write_bytes(b"bookkeeping")  # a download's cache dir: ignored
    assert model_identity(a) == model_identity(b)
    assert len(model_identity(a)) == 32


def test_a_symlinked_snapshot_is_the_model_it_links_to(tmp_path: Path) -> None:
    blobs = _model(tmp_path / "blobs")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        os.symlink(blobs / name, snapshot / name)
    assert model_identity(snapshot) == model_identity(blobs)


@pytest.mark.parametrize("change", [
    {"hidden": 128},  # another config
    {"vocab": "abd"},  # another tokenizer
    {"weight_bytes": 101},  # weights of another size
    {"weight_name": "model-00001-of-00002.safetensors"},  # another weight file
])
def test_different_models_in_same_named_directories_differ(tmp_path: Path, change: dict) -> None:
    a = _model(tmp_path / "a" / "model")
    b = _model(tmp_path / "b" / "model", **change)
    assert model_identity(a) != model_identity(b)
    # And so their block hashes differ: one model's KV is never another's prefix.
    tokens = list(range(32))
    assert (block_hashes(tokens, 16, hash_seed(model_identity(a)))
            != block_hashes(tokens, 16, hash_seed(model_identity(b))))


def test_weights_are_sized_not_read(tmp_path: Path) -> None:
    a = _model(tmp_path / "a")
    before = model_identity(a)
    (a / "model.safetensors").write_bytes(b"\1" * 100)  # same size, other bytes: the same (cheap) identity
    assert model_identity(a) == before


def test_not_a_model_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no config.json"):
        model_identity(tmp_path)
