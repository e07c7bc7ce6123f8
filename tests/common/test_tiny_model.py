"""The tiny model generator is deterministic and the validator names what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.errors import ModelError
from common.tiny_model import SPECIAL_TOKENS, make_tiny_model, validate_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _file_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_same_arguments_same_bytes(model_dir: Path, tmp_path: Path) -> None:
    again = make_tiny_model(tmp_path / "again")
    assert _file_bytes(again) == _file_bytes(model_dir)


def test_other_seed_changes_only_weights(model_dir: Path, tmp_path: Path) -> None:
    other = _file_bytes(make_tiny_model(tmp_path / "other", seed=1))
    first = _file_bytes(model_dir)
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]


def test_config_and_generation_config(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (256, 4, 2)
    assert config["tie_word_embeddings"] is False
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>" and tok_config["bos_token"] is None
    assert "add_generation_prompt" in tok_config["chat_template"]


def test_tokenizer_round_trips_and_special_ids(model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 8192
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    text = "def f(x):\n    return x  # héllo, 日本\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.encode("<|im_start|>user").ids[0] == 1


def test_validate_reports_shape(model_dir: Path) -> None:
    info = validate_model_dir(model_dir)
    assert info.num_layers == 4 and info.head_dim == 64 and info.eos_token_ids == (2, 0)
    assert info.kv_bytes_per_token(4) == 2 * 4 * 2 * 64 * 4


def test_validate_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        validate_model_dir(tmp_path / "nope")


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("config.json", "delete", "no config.json"),
        ("config.json", "garbage", "not valid JSON"),
        ("tokenizer.json", "delete", "no tokenizer.json"),
        ("tokenizer.json", "garbage", "not a loadable tokenizer"),
        ("model.safetensors", "delete", "no \\*.safetensors"),
        ("model.safetensors", "truncate", "not a valid safetensors"),
    ],
)
def test_validate_broken_files(model_dir: Path, tmp_path: Path, name: str, damage: str, message: str) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    target = broken / name
    if damage == "delete":
        target.unlink()
    elif damage == "garbage":
        target.write_text("{not json")
    else:
        target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(ModelError, match=message):
        validate_model_dir(broken)


def test_config_missing_field(model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    del config["hidden_size"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="hidden_size"):
        validate_model_dir(broken)
