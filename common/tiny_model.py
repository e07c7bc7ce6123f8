"""Deterministic HF-format Llama model directories for tests and benchmarks (no model hub here).

``make_tiny_model`` writes config.json, random weights (fixed seed, safetensors), a byte-level BPE tokenizer
trained on Python's own stdlib sources, a ChatML chat template and generation_config.json. Same arguments on
the same Python installation give the same bytes (the tokenizer trains on that installation's stdlib).
``validate_model_dir`` checks any model directory (ours or a user's) cheaply, before an engine is started.
"""

from __future__ import annotations

import json
import struct
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import structlog
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from common.errors import ModelError

log = structlog.get_logger(__name__)

ModelSize = Literal["tiny", "100m"]
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
VOCAB_SIZE = 8192
MAX_MODEL_LEN = 4096
# Bounded tokenizer training text: fast (a few seconds) and independent of how many stdlib files exist.
_TRAIN_MAX_BYTES = 3 * 1024 * 1024
_TRAIN_MAX_FILE_BYTES = 64 * 1024
_WEIGHT_STD = 0.02

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# hidden, layers, attention heads, KV heads, MLP intermediate size.
_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (256, 4, 4, 2, 768),  # ~6.6M params
    "100m": (768, 12, 12, 4, 2048),  # ~88M params
}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: Path
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    torch_dtype: str
    eos_token_ids: tuple[int, ...]
    weight_files: tuple[str, ...]

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V for one token across all layers (for transfer-size accounting)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def make_tiny_model(out_dir: Path, size: ModelSize = "tiny", seed: int = 0) -> Path:
    """Write a deterministic Llama model directory to ``out_dir`` (created if missing) and return it."""
    if size not in _SHAPES:
        raise ModelError(f"unknown tiny model size {size!r}; choose one of {sorted(_SHAPES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _llama_config(size)
    _write_json(out_dir / "config.json", config)
    weights_path = out_dir / "model.safetensors"
    save_file(_random_weights(config, seed), str(weights_path), metadata={"format": "pt"})
    weights_path.chmod(0o644)  # safetensors creates it 0600; other users' engines must read it too
    _train_tokenizer().save(str(out_dir / "tokenizer.json"), pretty=False)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config())
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map())
    _write_json(
        out_dir / "generation_config.json",
        {"_from_model_config": False, "bos_token_id": None, "eos_token_id": [2, 0], "pad_token_id": 0},
    )
    log.info("tiny_model_written", path=str(out_dir), size=size, seed=seed)
    return out_dir


def validate_model_dir(path: Path, need_weights: bool = True) -> ModelInfo:
    """Check a model directory has a usable config, tokenizer and (``need_weights``) weights; raise ``ModelError``
    if not. Without ``need_weights`` (the mock engine, the frontend: they never load weights) a directory with
    only config.json and a tokenizer is enough, e.g. a real model's, to simulate serving it."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"model directory {path} does not exist or is not a directory")
    config = _read_config(path / "config.json")
    _check_tokenizer(path / "tokenizer.json")
    weight_files = sorted(p.name for p in path.glob("*.safetensors"))
    if need_weights:
        if not weight_files:
            raise ModelError(f"model directory {path} has no *.safetensors weight files (an engine that runs the "
                             "model needs them; --engine mock needs only config.json and a tokenizer)")
        for name in weight_files:
            _check_safetensors(path / name)
    if isinstance(config.get("text_config"), dict):
        # Multimodal and newer checkpoints (Gemma 3, Llama 4, Qwen-VL...) nest the language model's shape there;
        # the top level keeps architectures, and may keep eos/dtype.
        config = {**config, **config["text_config"], "architectures": config.get("architectures")
                  or config["text_config"].get("architectures")}
    try:
        num_heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return ModelInfo(
            path=path,
            architecture=str(config["architectures"][0]),
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads", num_heads)),
            head_dim=int(config.get("head_dim") or hidden // num_heads),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 0)),
            torch_dtype=str(config.get("torch_dtype", "float32")),
            eos_token_ids=eos_ids,
            weight_files=tuple(weight_files),
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ModelError(f"{path / 'config.json'} has a missing or bad field: {exc!r}") from exc


# ------------------------------------------------------------------------------------------------ writing


def _llama_config(size: str) -> dict[str, Any]:
    hidden, num_layers, num_heads, num_kv_heads, intermediate = _SHAPES[size]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden // num_heads,
        "intermediate_size": intermediate,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_MODEL_LEN,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": _WEIGHT_STD,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": [2, 0],
        "pad_token_id": 0,
        "use_cache": True,
    }


def _random_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    head_dim, inter = config["head_dim"], config["intermediate_size"]
    q_out, kv_out = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(_WEIGHT_STD)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        # HF Linear weights are [out_features, in_features].
        tensors[p + "self_attn.q_proj.weight"] = normal(q_out, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_out, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_out, hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, q_out)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        tensors[p + "input_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
    tensors["model.norm.weight"] = np.ones(hidden, dtype=np.float32)
    tensors["lm_head.weight"] = normal(vocab, hidden)
    return tensors


def _training_text() -> list[str]:
    """A fixed, sorted, bounded sample of the stdlib's .py sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    texts: list[str] = []
    total = 0
    for f in files:
        text = f.read_bytes()[:_TRAIN_MAX_FILE_BYTES].decode("utf-8", errors="ignore")
        texts.append(text)
        total += len(text)
        if total >= _TRAIN_MAX_BYTES:
            break
    if not texts:
        raise ModelError(f"no .py sources under {stdlib} to train the tokenizer on")
    return texts


def _train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    return tok


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": MAX_MODEL_LEN,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _special_tokens_map() -> dict[str, Any]:
    return {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------- validating


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelError(f"model directory {path.parent} has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelError(f"{path} must hold a JSON object, not {type(config).__name__}")
    return config


def _check_tokenizer(path: Path) -> None:
    if not path.is_file():
        raise ModelError(f"model directory {path.parent} has no tokenizer.json")
    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception subclasses for any parse failure
        raise ModelError(f"{path} is not a loadable tokenizer: {exc}") from exc


def _check_safetensors(path: Path) -> None:
    """Header parses and the data region it describes matches the file size (catches truncation)."""
    try:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            size = path.stat().st_size
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError(f"header length {header_len} does not fit a {size}-byte file")
            header = json.loads(f.read(header_len))
        data_end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + header_len + data_end != size:
            raise ValueError(f"tensors end at byte {8 + header_len + data_end}, file has {size}")
    except (OSError, struct.error, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path} is not a valid safetensors file: {exc}") from exc
