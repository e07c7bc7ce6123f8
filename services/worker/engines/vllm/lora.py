"""LoRA adapters on a vLLM engine: ``--lora-modules name=path`` loaded at start, ``LoadAdapter``/``UnloadAdapter``
at run time (vLLM's ``add_lora``/``remove_lora``), and the ``LoRARequest`` a request naming one runs with
(docs/fleet.md#lora-adapters). Prefill and decode engines hold the same adapters under the same names, so the KV
a decode engine pulls was computed with the adapter it decodes with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.errors import EngineError

# vLLM's allowed --max-lora-rank values (vllm/config/lora.py MaxLoRARanks).
_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_DEFAULT_RANK = 16  # vLLM's default


def adapter_rank(path: str | Path) -> int:
    """The rank ``r`` of the PEFT adapter at ``path``; EngineError for a directory that is not one."""
    config = Path(path) / "adapter_config.json"
    try:
        return int(json.loads(config.read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"{path} is not a LoRA adapter (PEFT adapter_config.json with r): {exc}") from exc


def lora_engine_kwargs(lora_modules: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """vLLM engine arguments for the start adapters, under the user's own (which win): LoRA on, a rank that
    fits the largest, a batch slot for each. {} without adapters (then ``-- --enable-lora`` alone turns it on,
    for adapters loaded later)."""
    if not lora_modules:
        return {}
    rank = max(adapter_rank(path) for _, path in lora_modules)
    fitting = [r for r in _RANKS if r >= max(rank, _DEFAULT_RANK)]
    if not fitting:
        raise EngineError(f"LoRA rank {rank} is over vLLM's largest, {_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": max(len(lora_modules), 1)}


class VllmAdapters:
    """Mixin for the vLLM engine: its adapters by name, each with the int id vLLM keys it by."""

    _llm: Any
    _loras: dict[str, Any]  # name -> vllm.lora.request.LoRARequest
    _next_lora_id: int  # from 1, never reused: vLLM caches adapters by id, and a reloaded name may be new weights

    def lora_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._loras))

    def lora_request(self, lora_name: str) -> Any:
        """The LoRARequest a request naming ``lora_name`` runs with; None for the base model."""
        if not lora_name:
            return None
        if lora_name not in self._loras:
            raise EngineError(f"adapter {lora_name!r} is not loaded here (loaded: {', '.join(self._loras) or 'none'})")
        return self._loras[lora_name]

    async def load_adapter(self, lora_name: str, lora_path: str) -> None:
        from vllm.lora.request import LoRARequest

        if not lora_name:
            raise EngineError("an adapter needs a name")
        if lora_name in self._loras:
            raise EngineError(f"adapter {lora_name!r} is already loaded")
        adapter_rank(lora_path)  # a clear message before vLLM's
        if self._llm is None or self._llm.vllm_config.lora_config is None:
            raise EngineError("LoRA is off on this engine: start it with --lora-modules or -- --enable-lora")
        request = LoRARequest(lora_name=lora_name, lora_int_id=self._next_lora_id, lora_path=str(lora_path))
        self._next_lora_id += 1
        try:
            await self._llm.add_lora(request)
        except Exception as exc:  # vLLM raises ValueError, RuntimeError, OSError for a bad adapter
            raise EngineError(f"vLLM could not load adapter {lora_name!r} from {lora_path}: {exc}") from exc
        self._loras[lora_name] = request

    async def unload_adapter(self, lora_name: str) -> None:
        request = self._loras.pop(lora_name, None)
        if request is None:
            raise EngineError(f"adapter {lora_name!r} is not loaded")
        if self._llm is not None:
            await self._llm.remove_lora(request.lora_int_id)
