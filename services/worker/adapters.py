"""LoRA adapters loaded or unloaded at run time (LoadAdapter, UnloadAdapter): the engine does it, the worker
answers AdapterDone and says the adapters it holds in its next heartbeats (docs/fleet.md#lora-adapters)."""

from __future__ import annotations

import structlog

from common.errors import EngineError
from common.protocol import AdapterDone, LoadAdapter, UnloadAdapter
from services.worker.engine import Engine

log = structlog.get_logger(__name__)


async def change_adapter(engine: Engine, msg: LoadAdapter | UnloadAdapter, worker_id: str) -> AdapterDone:
    """Load or unload one adapter; a refusal (unknown adapter, bad directory, LoRA off) is an ``ok=False``
    answer with the engine's reason, never an exception: the worker keeps serving what it held."""
    try:
        if isinstance(msg, LoadAdapter):
            await engine.load_adapter(msg.lora_name, msg.lora_path)
        else:
            await engine.unload_adapter(msg.lora_name)
    except EngineError as exc:
        log.warning("adapter_refused", lora_name=msg.lora_name, action=type(msg).__name__, reason=str(exc))
        return AdapterDone(request_id=msg.request_id, worker_id=worker_id, ok=False, message=str(exc))
    log.info("adapter_changed", lora_name=msg.lora_name, action=type(msg).__name__,
             lora_names=list(engine.lora_names()))
    return AdapterDone(request_id=msg.request_id, worker_id=worker_id, ok=True)
