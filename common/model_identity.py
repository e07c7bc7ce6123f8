"""The model's identity for block hashes: what makes two model directories the same model, read cheaply.

Block hashes are seeded per model (common/hashing.py: ``hash_seed``). A directory's name is no identity: two
different models in directories of the same name would share hashes (and one node's kvtier hand one model's KV
to the other), and one model at two paths would not. ``model_identity`` digests what the model IS:

* the content of ``config.json`` and of every small file that shapes tokens or generation (tokenizer files,
  ``generation_config.json``, the weight index);
* the name and size in bytes of every weight file (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``, ``*.gguf``,
  ``*.msgpack``, ``*.h5``) -- never their content: a checkpoint is GBs, and a retrained one of the same shape
  that kept every file's size would also keep its config; a name plus a byte count is what a fresh download or a
  copy to another host reproduces.

Layout, exactly: xxh3_128 over, for each file in sorted relative-path order, ``path`` UTF-8, a NUL, then ``c``
and the file's bytes for a content file or ``s`` and its size as decimal ASCII for a weight file, then a NUL.
Symlinks (the Hugging Face cache's snapshot links into ``blobs/``) are followed. The result is 32 hex digits.
"""

from __future__ import annotations

from pathlib import Path

from xxhash import xxh3_128

from common.errors import ModelError

# Small files whose bytes define the model for tokens: hashed in full.
CONTENT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
# Weight files: named and sized, not read.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
# Content files past this size are sized, not read (a hand-placed oddity must not make startup read GBs).
MAX_CONTENT_BYTES = 64 * 1024 * 1024


def model_identity(model_dir: Path) -> str:
    """32 hex digits naming the model in ``model_dir`` (see the module docstring); equal for the same files
    anywhere, different when config, tokenizer or the weight files' names or sizes differ."""
    if not (model_dir / "config.json").is_file():
        raise ModelError(f"{model_dir} has no config.json: not a model directory")
    digest = xxh3_128()
    for rel, path in _files(model_dir):
        digest.update(rel.encode("utf-8") + b"\0")
        size = path.stat().st_size  # follows symlinks
        if path.name in CONTENT_FILES and size <= MAX_CONTENT_BYTES:
            digest.update(b"c")
            digest.update(path.read_bytes())
        else:
            digest.update(b"s" + str(size).encode("ascii"))
        digest.update(b"\0")
    return digest.hexdigest()


def _files(model_dir: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of the files that make the identity, sorted by relative path. Weights may sit
    in subdirectories (some checkpoints shard into folders); tokenizer and config files count at the top."""
    out: list[tuple[str, Path]] = []
    for path in model_dir.rglob("*"):
        if not path.is_file():
            continue
        rel = path.relative_to(model_dir).as_posix()
        if rel.startswith(".") or "/." in rel:  # .cache/, .git/: a download's bookkeeping, not the model
            continue
        if (path.parent == model_dir and path.name in CONTENT_FILES) or path.name.endswith(WEIGHT_SUFFIXES):
            out.append((rel, path))
    return sorted(out)
