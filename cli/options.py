"""Options and helpers every command shares. Only cli/ reads the environment (envvar=...)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional, TypeVar

import typer

from services.router.defaults import ROUTER_ENDPOINT
from services.worker.engine import DEFAULT_KV_TRANSFER, KV_TRANSFER_MODES

DTYPE_HELP = "vLLM: auto (the model's; float32 for a 16-bit model on a CPU without native bf16) | float32 | bfloat16"
DEFAULT_ROUTER = ROUTER_ENDPOINT
LogLevel = typer.Option("info", "--log-level", envvar="SPLITSERVE_LOG_LEVEL")
LogJson = typer.Option(False, "--log-json", envvar="SPLITSERVE_LOG_JSON", help="JSON log lines")
CurveDir = typer.Option(None, "--curve-dir", envvar="SPLITSERVE_CURVE_DIR",
                        help="CURVE keys: OUT of `splitserve keys make OUT` (this service uses OUT/<service>), or that directory")

_KV_TRANSFER_HELP = ("How prefill->decode KV moves: pull (the decode engine READs the prefill engine's blocks) | push "
                     "(the prefill engine WRITEs into blocks the decode engine registered; vLLM NixlPushConnector; a "
                     "decode or switchable worker's --nixl-host must then be an address prefill hosts dial). Every "
                     "worker of a P/D graph must use the same; see docs/measuring.md, 'Pull or push'")


def kv_transfer_option(default: str | None, default_help: str = ""):
    return typer.Option(default, "--kv-transfer", envvar="SPLITSERVE_KV_TRANSFER", show_default=default_help or True,
                        help=_KV_TRANSFER_HELP)


KvTransfer = kv_transfer_option(DEFAULT_KV_TRANSFER)


# The mock engine's KV bytes per token unless told (services/worker/engines/mock/config.py: ~100M model, bf16).
MOCK_KV_BYTES_PER_TOKEN = 36864


def mock_kv_bytes_per_token(block_bytes: int | None, block_size: int) -> int:
    """``--mock-block-bytes`` as the engine's per-token figure (one number sizes blocks, transfers and pricing)."""
    if block_bytes is None:
        return MOCK_KV_BYTES_PER_TOKEN
    if block_bytes <= 0 or block_bytes % block_size:
        raise typer.BadParameter(f"must be a positive multiple of --block-size {block_size}, not {block_bytes}",
                                 param_hint="--mock-block-bytes")
    return block_bytes // block_size


def kv_transfer_checked(mode: str) -> str:
    if mode not in KV_TRANSFER_MODES:
        raise typer.BadParameter(f"must be one of {', '.join(KV_TRANSFER_MODES)}, not {mode!r}",
                                 param_hint="--kv-transfer")
    return mode


T = TypeVar("T")
MetricsHost = typer.Option("127.0.0.1", "--metrics-host", envvar="SPLITSERVE_METRICS_HOST",
                           help="Bind address of /metrics (0.0.0.0: every interface, for a scraper on another host)")
Zone = typer.Option("", "--zone", envvar="SPLITSERVE_ZONE",
                    help="Optional zone label (rack, availability zone) registered with the router")


def default_node() -> str:
    """Default of --node: this machine's name (the router groups workers and tiers by it)."""
    import socket

    return socket.gethostname()


Node = typer.Option(None, "--node", envvar="SPLITSERVE_NODE",
                    help="Machine name registered with the router (default: this host's hostname)")


def address_checked(check: Callable[..., T], *args: object) -> T:
    """``check(*args)`` (a common/addresses.py decision), or its AddressError as a one-line error, exit code 2."""
    from common.errors import AddressError

    try:
        return check(*args)
    except AddressError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def curve_key_dir(curve_dir: Optional[Path], service: str) -> Optional[Path]:
    """The service's own key directory: ``curve_dir/<service>`` when `keys make`'s root is given, else ``curve_dir``
    (absolute: it is handed on to processes that may run elsewhere, such as vLLM's engine core)."""
    if not curve_dir:
        return None
    return (curve_dir / service if (curve_dir / service).is_dir() else curve_dir).resolve()


def transport(curve_dir: Optional[Path], service: str):
    """The service's transport; ``curve_dir`` is its own key directory, or the root `keys make` wrote (its
    ``<service>/`` is used: one SPLITSERVE_CURVE_DIR for every service on a host)."""
    from common.errors import SplitserveError
    from common.security import load_curve_keys
    from common.transport import TransportConfig

    own = curve_key_dir(curve_dir, service)
    if own is None:
        return TransportConfig()
    try:
        return TransportConfig(curve=load_curve_keys(own))
    except SplitserveError as exc:
        typer.echo(f"error: --curve-dir: {exc}", err=True)
        raise typer.Exit(2) from exc


def validated(model: Path, need_weights: bool = True):
    """The model directory's facts, or a one-line error and exit code 2 (never a traceback).

    ``need_weights=False``: what the mock engine and the frontend read (config.json and a tokenizer) is enough."""
    from common.errors import ModelError
    from common.tiny_model import validate_model_dir

    try:
        return validate_model_dir(model, need_weights)
    except ModelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def resolved_model(ref: str, revision: str = "main"):
    """``--model``: a directory, or a Hugging Face id from the local cache (HF_HUB_CACHE, HF_HOME/hub or
    ~/.cache/huggingface/hub, as huggingface_hub reads them); a one-line error and exit 2 otherwise."""
    from common.errors import ModelError
    from common.model_ref import default_hub_dir, resolve_model

    try:
        return resolve_model(ref, default_hub_dir(dict(os.environ), Path.home()), revision)
    except ModelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def served_names(option: str | None, default: str) -> tuple[str, ...]:
    """``--served-model-name NAME[,ALIAS...]``: the name responses carry first, then the aliases requests may use."""
    names = tuple(n.strip() for n in (option or "").split(",") if n.strip())
    return names or (default,)


def lora_modules(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--lora-modules name=path`` (repeated, or comma-separated; vLLM's spelling): (name, path) pairs, checked."""
    pairs: list[tuple[str, str]] = []
    for item in (part.strip() for value in values or () for part in value.split(",")):
        name, sep, path = item.partition("=")
        if not item:
            continue
        if not sep or not name.strip() or not path.strip():
            raise typer.BadParameter(f"{item!r} is not name=path", param_hint="--lora-modules")
        pairs.append((name.strip(), path.strip()))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"an adapter name is given twice: {', '.join(names)}", param_hint="--lora-modules")
    return tuple(pairs)


LORA_MODULES_HELP = ("LoRA adapters to load at start, name=path (a PEFT directory; repeat or comma-separate, as "
                     "vLLM's --lora-modules): requests whose model is NAME run with it. The mock engine takes the "
                     "names only")

# `--served-model-name`'s help, shared by the commands that take it.
SERVED_NAME_HELP = ("Names clients use, comma-separated: responses carry the first, requests may use any (vLLM's "
                    "--served-model-name a b). Default: the Hugging Face id, or the model directory's name")


def reexec_with_engine_env(env: dict[str, str]) -> None:
    """LD_PRELOAD only takes effect at process start: re-exec once with the engine's environment."""
    missing = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if not missing:
        return
    if os.environ.get("SPLITSERVE_REEXECED"):
        os.environ.update(missing)  # already re-executed once; set what can still be set in-process
        return
    # orig_argv repeats this very invocation, whether `python -m cli.main worker` or a console script.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **env, "SPLITSERVE_REEXECED": "1"})


# vLLM's OpenAI-server options of the same names (the frontend's; `up` passes them to its frontends).
ChatTemplate = typer.Option(None, "--chat-template", help="Chat template file (Jinja) to use instead of the "
                            "model's own, as vLLM's --chat-template")
ToolCallParser = typer.Option(None, "--tool-call-parser", help="vLLM's tool-call parser for tool_choice 'auto' "
                              "(its names: hermes, llama3_json, mistral, ...; needs vLLM installed). Default: the "
                              "frontend's own Hermes / Llama 3 JSON reader, picked by the chat template")
ReasoningParser = typer.Option(None, "--reasoning-parser", help="vLLM's reasoning parser (deepseek_r1, qwen3, "
                               "...; needs vLLM installed): the answer's reasoning leaves as reasoning_content")
EnableAutoToolChoice = typer.Option(False, "--enable-auto-tool-choice", help="As vLLM's: with --tool-call-parser, "
                                    "tool_choice 'auto' reads calls with it (without the flag vLLM refuses 'auto')")


FirstToken = typer.Option("decode", "--first-token", help="When a remotely prefilled request's first token goes to "
                          "the client: decode (with the decode worker's first output, as vLLM's P/D: no hand-off "
                          "gap in the stream) | prefill (as soon as the prefill worker has it: lower TTFT, the "
                          "KV hand-off then shows as one long inter-token gap)")


def frontend_args(chat_template: Path | None, tool_call_parser: str | None, reasoning_parser: str | None,
                  enable_auto_tool_choice: bool, first_token: str = "decode") -> tuple[str, ...]:
    """The frontend command-line options for these values (what `up` hands each frontend)."""
    out: list[str] = [] if first_token == "decode" else ["--first-token", first_token]
    if chat_template is not None:
        out += ["--chat-template", str(Path(chat_template).resolve())]
    if tool_call_parser:
        out += ["--tool-call-parser", tool_call_parser]
    if reasoning_parser:
        out += ["--reasoning-parser", reasoning_parser]
    if enable_auto_tool_choice:
        out.append("--enable-auto-tool-choice")
    return tuple(out)
