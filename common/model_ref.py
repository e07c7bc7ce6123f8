"""What `--model` names: a local directory, or a Hugging Face id found in the local cache (no network).

A Hugging Face id (``Qwen/Qwen3-8B``) resolves the way huggingface_hub lays out its cache, offline:
``<hub>/models--Qwen--Qwen3-8B/refs/<revision>`` holds a commit hash, ``snapshots/<hash>/`` the files (links into
``blobs/``). A revision may also be the commit hash itself. ``hub`` is the caller's: cli/ reads HF_HUB_CACHE,
HF_HOME (its ``hub/``) or ~/.cache/huggingface/hub, as huggingface_hub does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from common.errors import ModelError

# org/name as the Hub allows them: letters, digits, '-', '_', '.'; one slash (a bare "gpt2" id also exists).
_HF_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class ModelRef:
    path: Path  # the directory engines and tokenizers load
    name: str  # what clients call it by default: the Hub id, or the directory's name
    hub_id: str = ""  # "" for a local directory
    revision: str = ""  # the snapshot's commit hash (Hub ids)


def resolve_model(ref: str | Path, hub_dir: Path | None, revision: str = "main") -> ModelRef:
    """A local directory as is; else a Hub id from ``hub_dir``'s cache. Raises ``ModelError`` saying what was
    looked for."""
    text = str(ref)
    path = Path(text).expanduser()
    if path.is_dir():
        return ModelRef(path=path, name=path.resolve().name)
    if path.exists():
        raise ModelError(f"--model {text} is a file, not a model directory")
    if text.startswith((".", "/", "~")) or not _HF_ID.match(text):
        raise ModelError(f"model directory {text} does not exist (and it is not a Hugging Face id)")
    if hub_dir is None:
        raise ModelError(f"{text}: no model directory of that name, and no Hugging Face cache to look in")
    repo = hub_dir / ("models--" + text.replace("/", "--"))
    if not repo.is_dir():
        raise ModelError(f"{text}: not a directory, and not in the Hugging Face cache {hub_dir} (no {repo.name}; "
                         "this machine does not download: fetch it where there is network, e.g. "
                         f"`huggingface-cli download {text}`, and copy the cache here)")
    commit = revision if _COMMIT.match(revision) else _read_ref(repo, revision)
    snapshot = repo / "snapshots" / commit
    if not (snapshot / "config.json").is_file():
        raise ModelError(f"{text}: the cache's snapshot {snapshot} has no config.json (an incomplete download?)")
    return ModelRef(path=snapshot, name=text, hub_id=text, revision=commit)


def _read_ref(repo: Path, revision: str) -> str:
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text().strip()
    except OSError as exc:
        snapshots = sorted(p.name for p in (repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
        raise ModelError(f"{repo.name}: no revision {revision!r} in the cache ({ref} unreadable: {exc.strerror}); "
                         f"snapshots there: {', '.join(snapshots) or 'none'}") from exc
    if not _COMMIT.match(commit):
        raise ModelError(f"{ref} holds {commit!r}, not a commit hash")
    return commit


def default_hub_dir(environ: dict[str, str], home: Path) -> Path:
    """Where huggingface_hub keeps its cache, from an environment (only cli/ passes os.environ)."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    return home / ".cache" / "huggingface" / "hub"
