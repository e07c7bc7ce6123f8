"""The mock engine's LoRA adapters: names only, no weights. A request with an adapter hashes its blocks under the
adapter's seed (common/hashing.py: adapter_seed), so its prefixes, KV events and router credit are the adapter's,
as on vLLM; its tokens are the base model's (the mock has no weights to change). Its tier is looked up by the base model's
hashes, so an adapter's prompt loads nothing from it (its evicted blocks are offloaded under their own hashes)."""

from __future__ import annotations

from common.errors import EngineError


class AdapterNames:
    """Mixin: the adapters an engine holds by name (``--lora-modules`` names at start, loads and unloads since)."""

    _adapter_names: set[str]

    def lora_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._adapter_names))

    async def load_adapter(self, lora_name: str, lora_path: str) -> None:
        if not lora_name:
            raise EngineError("an adapter needs a name")
        if lora_name in self._adapter_names:
            raise EngineError(f"adapter {lora_name!r} is already loaded")
        self._adapter_names.add(lora_name)

    async def unload_adapter(self, lora_name: str) -> None:
        if lora_name not in self._adapter_names:
            raise EngineError(f"adapter {lora_name!r} is not loaded")
        self._adapter_names.discard(lora_name)
