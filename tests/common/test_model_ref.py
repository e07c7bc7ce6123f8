"""`--model` names a directory, or a Hugging Face id resolved offline from a cache laid out as huggingface_hub's."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ModelError
from common.model_ref import default_hub_dir, resolve_model

COMMIT = "a" * 40
OTHER = "b" * 40


def _cache(hub: Path, repo_id: str = "Qwen/Qwen3-8B", refs: dict[str, str] | None = None,
           snapshots: tuple[str, ...] = (COMMIT,)) -> Path:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    for commit in snapshots:
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir(parents=True)
    for name, commit in (refs or {"main": COMMIT}).items():
        (repo / "refs" / name).write_text(commit + "\n")
    return repo


def test_a_directory_is_itself(tmp_path: Path) -> None:
    (tmp_path / "my-model").mkdir()
    ref = resolve_model(tmp_path / "my-model", hub_dir=None)
    assert (ref.path, ref.name, ref.hub_id) == (tmp_path / "my-model", "my-model", "")


def test_a_hub_id_resolves_to_its_main_snapshot(tmp_path: Path) -> None:
    repo = _cache(tmp_path)
    ref = resolve_model("Qwen/Qwen3-8B", tmp_path)
    assert ref.path == repo / "snapshots" / COMMIT
    assert (ref.name, ref.hub_id, ref.revision) == ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", COMMIT)


@pytest.mark.parametrize(("revision", "expected"), [("v2", OTHER), (OTHER, OTHER), ("main", COMMIT)])
def test_revisions_by_ref_name_or_commit(tmp_path: Path, revision: str, expected: str) -> None:
    _cache(tmp_path, refs={"main": COMMIT, "v2": OTHER}, snapshots=(COMMIT, OTHER))
    assert resolve_model("Qwen/Qwen3-8B", tmp_path, revision).revision == expected


def test_a_directory_beats_a_hub_id_of_the_same_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    _cache(tmp_path / "hub", "org/name")
    assert resolve_model("org/name", tmp_path / "hub").hub_id == ""


@pytest.mark.parametrize(("ref", "setup", "message"), [
    ("Qwen/Qwen3-8B", lambda hub: None, "not in the Hugging Face cache"),
    ("Qwen/Qwen3-8B", lambda hub: _cache(hub, refs={"dev": COMMIT}), "no revision 'main'"),
    ("Qwen/Qwen3-8B", lambda hub: _cache(hub, refs={"main": "not-a-hash"}), "not a commit hash"),
    ("Qwen/Qwen3-8B", lambda hub: _cache(hub, refs={"main": OTHER}), "has no config.json"),
    ("./missing", lambda hub: None, "does not exist"),
    ("/abs/missing", lambda hub: None, "does not exist"),
    ("a/b/c", lambda hub: None, "not a Hugging Face id"),
])
def test_what_was_looked_for_is_said(tmp_path: Path, ref, setup, message) -> None:
    setup(tmp_path)
    with pytest.raises(ModelError, match=message):
        resolve_model(ref, tmp_path)


def test_a_file_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ModelError, match="is a file"):
        resolve_model(tmp_path / "f", tmp_path)


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, "/home/u/.cache/huggingface/hub"),
    ({"HF_HOME": "/data/hf"}, "/data/hf/hub"),
    ({"HF_HOME": "/data/hf", "HF_HUB_CACHE": "/fast/hub"}, "/fast/hub"),
])
def test_the_cache_is_where_huggingface_hub_keeps_it(environ, expected) -> None:
    assert default_hub_dir(environ, Path("/home/u")) == Path(expected)
