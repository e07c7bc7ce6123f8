"""A user's vLLM engine arguments, parsed by vLLM's own parser, and the ones the P/D contract keeps for itself.

`splitserve worker ... -- --max-model-len 32768 -tp 2` (and `up`'s common and per-pool engine arguments) hand
everything after the worker's own options to ``parse_engine_args``: vLLM's ``FlexibleArgumentParser`` with
``AsyncEngineArgs``'s arguments, so names, short forms (``-tp``), values (``16k``), JSON configs
(``--compilation-config '{"mode": 3}'``, ``--compilation-config.mode 3``) and ``--config FILE.yaml`` are vLLM's
own, and a typo or a bad value is vLLM's message. Only the arguments the user gave come back (every default is
suppressed), so splitserve's defaults apply where the user said nothing and the user's word wins where they did.

The worker itself sets what P/D needs (``CONTRACT_ARGS``): those are refused with the reason.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# vLLM argument (its dest) -> why the worker owns it. Setting one would break a contract with the router (block
# hashes, KV events), the frontend (token ids in and out) or the other engine of a P/D pair (the KV connector).
CONTRACT_ARGS: Mapping[str, str] = {
    "model": "give the model as the worker's --model",
    "kv_transfer_config": "the worker builds the KV connector (NIXL pull/push, the kvtier connector): use "
                          "--kv-transfer and --kvtier",
    "kv_events_config": "the worker publishes vLLM's KV events to the router itself",
    "enable_prefix_caching": "KV-aware routing and P/D hand-offs need vLLM's prefix cache on",
    "skip_tokenizer_init": "structured outputs compile against the tokenizer; the frontend owns text",
    "logits_processors": "the worker installs its own logits processor (the P/D first token)",
    "worker_extension_cls": "the worker installs its NIXL worker extension",
    "disable_log_stats": "the worker reads vLLM's stats for its metrics and load reports",
    "data_parallel_size": "data parallelism is splitserve's pools: run more workers",
    "kv_offloading_size": "the KV tier is splitserve's kvtier (--kvtier)",
    "kv_offloading_backend": "the KV tier is splitserve's kvtier (--kvtier)",
}

# vLLM arguments that are also the worker's own options (the mock engine honours them too): given after `--`,
# they replace the worker's value, so both engines, the router (block size) and the frontend (context) agree.
SHARED_ARGS: tuple[str, ...] = ("block_size", "num_gpu_blocks_override", "max_model_len", "max_num_seqs",
                                "max_num_batched_tokens", "dtype", "served_model_name")


class EngineArgsError(ValueError):
    """A bad vLLM engine argument: vLLM's own one-line message (or why the worker owns it)."""


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """The vLLM engine arguments a user gave, by vLLM's dest name (``max_model_len``), values as vLLM parsed them
    (``16k`` -> 16000, JSON -> dicts)."""

    given: Mapping[str, Any]
    argv: tuple[str, ...] = ()  # as typed, for the messages and to hand on to child workers

    def get(self, name: str, default: Any = None) -> Any:
        return self.given.get(name, default)

    def without(self, names: Sequence[str]) -> dict[str, Any]:
        return {k: v for k, v in self.given.items() if k not in names}


NO_ENGINE_ARGS = EngineArgs(given={})


def parse_engine_args(argv: Sequence[str], prog: str = "splitserve worker") -> EngineArgs:
    """Parse ``argv`` with vLLM's parser; only what was given comes back. Raises ``EngineArgsError``."""
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        return NO_ENGINE_ARGS
    parser = _parser(prog)
    _refuse_contract_args(parser, argv)  # before vLLM validates their values: the reason is ours, not a value's
    try:
        namespace = parser.parse_args(argv)
    except EngineArgsError:
        raise
    except (ValueError, AssertionError, OSError) as exc:  # vLLM's --config handling raises these
        raise EngineArgsError(_one_line(f"vLLM engine arguments {' '.join(argv)}: {exc}")) from exc
    given = vars(namespace)
    for name, why in CONTRACT_ARGS.items():  # e.g. from a --config file
        if name in given:
            raise EngineArgsError(f"--{name.replace('_', '-')} is set by splitserve: {why}")
    return EngineArgs(given=given, argv=tuple(argv))


def _refuse_contract_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    dests = {opt: a.dest for a in parser._actions for opt in a.option_strings}
    for arg in argv:
        if not arg.startswith("-"):
            continue
        # vLLM takes --a_b as --a-b, and --x.field (a dotted JSON config field) as --x.
        name = arg.split("=", 1)[0].split(".", 1)[0]
        name = name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name
        dest = dests.get(name)
        if dest in CONTRACT_ARGS:
            raise EngineArgsError(f"{name} is set by splitserve: {CONTRACT_ARGS[dest]}")


def _one_line(message: str) -> str:
    """pydantic's validation errors span lines (and end with a link): one line, as the CLI prints it."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and "errors.pydantic.dev" not in ln]
    return "; ".join(lines)


def engine_arg_names() -> frozenset[str]:
    """Every vLLM engine argument's dest."""
    return frozenset(a.dest for a in _parser("splitserve")._actions if a.dest != "help")


def _parser(prog: str) -> argparse.ArgumentParser:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class _OneLineErrors(FlexibleArgumentParser):
        def error(self, message: str):  # argparse's prints the whole usage (hundreds of lines for vLLM) and exits
            raise EngineArgsError(_with_suggestion(self, message))

    parser = AsyncEngineArgs.add_cli_args(_OneLineErrors(prog=prog, add_help=False))
    for action in parser._actions:
        action.default = argparse.SUPPRESS  # only what the user gave lands in the namespace
    return parser


def _with_suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return _one_line(f"vLLM engine argument: {message}")
    known = [s for a in parser._actions for s in a.option_strings]
    hints = []
    for arg in message[len(prefix):].split():
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1)
            if close:
                hints.append(f"{arg}: did you mean {close[0]}?")
    return f"not a vLLM engine argument: {message[len(prefix):]}" + (f" ({'; '.join(hints)})" if hints else "")
