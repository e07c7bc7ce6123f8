"""LoRA adapters loaded and unloaded at run time: the frontend's `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (vLLM's shape), sent to every worker of the adapter's base model
(docs/fleet.md#lora-adapters). A worker answers each with ``AdapterDone`` and says the adapters it holds in its
heartbeats (``Heartbeat.lora_names``), from which the router and the frontends learn them."""

from __future__ import annotations

from common.protocol.base import Msg


class LoadAdapter(Msg, frozen=True):
    request_id: str
    lora_name: str
    # A directory in PEFT's layout (adapter_config.json + adapter_model.safetensors) the worker's host can read.
    lora_path: str


class UnloadAdapter(Msg, frozen=True):
    request_id: str
    lora_name: str


class AdapterDone(Msg, frozen=True):
    request_id: str
    worker_id: str
    ok: bool
    message: str = ""
