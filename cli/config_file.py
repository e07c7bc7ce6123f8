"""`--config FILE.yaml` for `up` and `worker`, as vLLM's `--config`: one file for every option.

Keys are option names without the dashes (`max-model-len` or `max_model_len`), values as on the command line:
``true`` is the flag, ``false`` its ``--no-`` form, a list repeats nothing (it is joined with commas, as `up`'s
list options and vLLM's ``--served-model-name`` take it), a mapping is JSON (vLLM's ``--compilation-config``).
`up`'s ``prefill-args:`` and ``decode-args:`` may be mappings too: each pool's own engine arguments, written
like the rest. splitserve's own options and vLLM's engine arguments live side by side: the command keeps
its own and hands the rest to vLLM's parser. The file's arguments go first, so the command line wins.

    model: /models/qwen3-8b
    served-model-name: [qwen3, Qwen/Qwen3-8B]
    max-model-len: 32768
    prefill: 2
    decode: 4
    prefill-args:
      max-num-batched-tokens: 16384
      enable-chunked-prefill: true

`up`'s ``models:`` is a list of models served side by side (docs/fleet.md), each a mapping of ``model``,
``served-model-name`` and (the first only) ``lora-modules``: it stands for ``--model`` and ``--served-model-name``
repeated in order.

    models:
      - {model: /models/tiny, served-model-name: tiny, lora-modules: [sql=/adapters/sql]}
      - {model: /models/tiny-copy, served-model-name: [tiny-copy, tc]}
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from typer.core import TyperCommand

POOL_ARGS = ("--prefill-args", "--decode-args")  # `up`'s: engine arguments of one pool, as one string


class ConfigError(click.UsageError):
    """A config file that cannot be read or holds what no option takes."""


def _option(key: str) -> str:
    return "--" + str(key).strip().lstrip("-").replace("_", "-")


def config_args(config: Mapping[str, Any], pool_sections: bool) -> list[str]:
    """The command-line arguments a config mapping stands for (pure)."""
    out: list[str] = []
    for key, value in config.items():
        name = _option(key)
        if pool_sections and name in POOL_ARGS and isinstance(value, Mapping):
            out += [name, shlex.join(config_args(value, pool_sections=False))]
        elif pool_sections and name == "--models":
            out += _models_args(value)
        elif value is None:
            continue
        elif value is True:
            out.append(name)
        elif value is False:
            out.append("--no-" + name[2:])
        elif isinstance(value, Mapping):
            out += [name, json.dumps(value)]
        elif isinstance(value, Sequence) and not isinstance(value, str):
            out += [name, ",".join(str(v) for v in value)]
        else:
            out += [name, str(value)]
    return out


def _models_args(models: Any) -> list[str]:
    """``models:`` as repeated ``--model``/``--served-model-name`` (and the first's ``--lora-modules``)."""
    if not isinstance(models, Sequence) or isinstance(models, str) or not all(isinstance(m, Mapping) for m in models):
        raise ConfigError("models: a list of mappings, each with model (and served-model-name, lora-modules)")
    out: list[str] = []
    for i, entry in enumerate(models):
        keys = {_option(k) for k in entry}
        allowed = {"--model", "--served-model-name"} | ({"--lora-modules"} if i == 0 else set())
        if "--model" not in keys or not keys <= allowed:
            raise ConfigError(f"models[{i}]: takes {', '.join(sorted(o[2:] for o in allowed))}, model required; "
                              f"got {', '.join(sorted(k[2:] for k in keys))}")
        if len(models) > 1 and "--served-model-name" not in keys:
            raise ConfigError(f"models[{i}]: several models need a served-model-name each")
        out += config_args(entry, pool_sections=False)
    return out


def expand_config(args: Sequence[str], pool_sections: bool) -> list[str]:
    """``args`` with ``--config FILE`` replaced by the file's arguments, put first so that the command line wins."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(args):
                    raise ConfigError("--config needs a YAML file")
                path, rest = Path(args[i + 1]), args[:i] + args[i + 2:]
            else:
                path, rest = Path(arg.split("=", 1)[1]), args[:i] + args[i + 1:]
            return config_args(_load(path), pool_sections) + expand_config(rest, pool_sections)
    return args


def _load(path: Path) -> Mapping[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"--config {path}: a mapping of option names to values, not {type(loaded).__name__}")
    return loaded


class ConfigFileCommand(TyperCommand):
    """A Typer command whose `--config FILE.yaml` expands before its options are parsed."""

    pool_sections = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_config(args, self.pool_sections))


class PooledConfigFileCommand(ConfigFileCommand):
    """`up`'s: ``prefill-args:`` and ``decode-args:`` may be mappings of the pools' own engine arguments."""

    pool_sections = True
