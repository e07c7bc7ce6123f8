"""`/v1/load_lora_adapter` and `/v1/unload_lora_adapter` in vLLM's shape (docs/fleet.md#lora-adapters): the frontend
sends LoadAdapter/UnloadAdapter to every live worker of the adapter's model, prefill and decode alike, and answers
once all have (the router and other frontends learn the adapter from the workers' heartbeats). The body is vLLM's,
``{"lora_name": ..., "lora_path": ...}``, plus ``model`` (ours) naming the base model when a frontend serves
several. Workers started later load only their ``--lora-modules``: the durable way to serve an adapter."""

from __future__ import annotations

import asyncio

import msgspec

from common.errors import RemoteError, TransportTimeout
from common.protocol import AdapterDone, LoadAdapter, UnloadAdapter, WorkerList
from common.transport import new_id
from services.frontend.openai_api import ApiError
from services.frontend.served_models import ServedModels

# vLLM loads an adapter's weights and warms its kernels: seconds on CPU for a small one.
ADAPTER_TIMEOUT_S = 120.0


class AdapterRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str = ""
    model: str | None = None
    # vLLM's field (it keeps a model's adapters in one cache); accepted, not used.
    load_inplace: bool = False


def parse_adapter_request(body: bytes, load: bool) -> AdapterRequest:
    try:
        req = msgspec.json.decode(body, type=AdapterRequest)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"body is not JSON: {exc}") from None
    if not req.lora_name or (load and not req.lora_path):
        raise ApiError(400, "both 'lora_name' and 'lora_path' must be provided" if load else
                       "'lora_name' must be provided", param="lora_name" if not req.lora_name else "lora_path")
    return req


def base_model(req: AdapterRequest, served: ServedModels) -> str:
    """The model an adapter is for: the request's ``model``, else the frontend's only one."""
    if req.model is not None:
        return served.canonical(req.model)
    if len(served.models) > 1:
        raise ApiError(400, f"this server serves {', '.join(served.names)}: say which model the adapter is for "
                       "('model')", param="model")
    return served.models[0].name


async def change_adapters(ask, workers: WorkerList, served: ServedModels, req: AdapterRequest, load: bool) -> str:
    """Load or unload on every live worker of the model; the success text vLLM answers. ``ask(endpoint, msg,
    timeout_s)`` sends one message to one worker and returns its reply."""
    model = base_model(req, served)
    if load and req.lora_name in {n for m in served.models for n in (m.name, *m.aliases)}:
        raise ApiError(400, f"{req.lora_name!r} is a model's name", param="lora_name")
    targets = [w for w in workers.workers if w.model == model and w.worker_id not in workers.draining]
    if not targets:
        raise ApiError(503, f"no live worker serves model {model!r}", code="no_worker", type_="server_error")
    held = [w for w in targets if req.lora_name in w.lora_names]
    if load and len(held) == len(targets):
        raise ApiError(400, f"The lora adapter '{req.lora_name}' has already been loaded.", param="lora_name")
    if not load and not held:
        raise ApiError(404, f"The lora adapter '{req.lora_name}' cannot be found.", param="lora_name",
                       code="model_not_found")
    # Load where it is missing, unload where it is held: a retried call finishes what a failed one began.
    todo = [w for w in targets if (req.lora_name in w.lora_names) != load]

    async def one(endpoint: str) -> str:
        msg = (LoadAdapter(request_id=new_id("lora"), lora_name=req.lora_name, lora_path=req.lora_path) if load
               else UnloadAdapter(request_id=new_id("lora"), lora_name=req.lora_name))
        try:
            reply = await ask(endpoint, msg, ADAPTER_TIMEOUT_S)
        except (RemoteError, TransportTimeout) as exc:
            return str(exc)
        if not isinstance(reply, AdapterDone):
            return f"unexpected {type(reply).__name__}"
        return "" if reply.ok else reply.message

    failures = await asyncio.gather(*(one(w.endpoint) for w in todo))
    failed = [f"{w.worker_id}: {why}" for w, why in zip(todo, failures) if why]
    if failed:
        raise ApiError(400 if len(failed) == len(todo) else 500,
                       f"adapter {req.lora_name!r} {'not loaded' if load else 'not unloaded'} on "
                       f"{len(failed)} of {len(todo)} workers: {'; '.join(failed)}", param="lora_path")
    if load:
        return f"Success: LoRA adapter '{req.lora_name}' added successfully."
    return f"Success: LoRA adapter '{req.lora_name}' removed successfully."
