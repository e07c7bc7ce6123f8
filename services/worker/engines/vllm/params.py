"""Translation between our request types and vLLM 0.32's SamplingParams / NixlConnector transfer params."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams as VllmSamplingParams
from vllm.sampling_params import RequestOutputKind

from common.errors import EngineError
from common.protocol import KvTransferParams
from common.tiny_model import ModelInfo
from services.worker.engine import EngineRequest
from services.worker.engines.vllm.first_token import FORCED_TOKEN_KEY


def to_vllm_sampling(
    request: EngineRequest, model: ModelInfo | None
) -> tuple[VllmSamplingParams, int | None]:
    """vLLM sampling params for a request, and the first token to force (decode requests) or None."""
    sampling = request.sampling
    stop_ids = set(sampling.stop_token_ids)
    if not sampling.ignore_eos and model is not None:
        stop_ids.update(model.eos_token_ids)
    extra_args: dict[str, Any] = {}
    forced_token: int | None = None
    max_tokens = sampling.max_tokens
    if request.prefill_only:
        max_tokens = 1
        extra_args["kv_transfer_params"] = {"do_remote_decode": True}
    elif request.kv_transfer is not None:
        if len(request.token_ids) < 2:
            raise EngineError(f"{request.request_id}: a decode request needs the prompt plus the first token")
        # The engine contract: max_tokens counts the tokens emitted after the first. vLLM re-runs the last
        # prompt position and samples the (forced, dropped) first token again, so that step is one more.
        forced_token = request.token_ids[-1]
        max_tokens = sampling.max_tokens + 1
        extra_args[FORCED_TOKEN_KEY] = forced_token
    params = VllmSamplingParams(
        max_tokens=max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        stop_token_ids=sorted(stop_ids),
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
        extra_args=extra_args,
    )
    return params, forced_token


def decode_kv_params(kv: KvTransferParams) -> dict[str, Any]:
    """The kv_transfer_params a decode request gives vLLM's NixlConnector (key names as 0.32 reads them)."""
    if not kv.remote_request_id:
        raise EngineError("KvTransferParams.remote_request_id is empty; vLLM's NixlConnector needs it")
    if not kv.remote_host:
        raise EngineError("KvTransferParams.remote_host is empty: the prefill worker named no NIXL side channel")
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": kv.remote_engine_id,
        # One list per KV cache group; plain Llama has one group.
        "remote_block_ids": [list(kv.remote_block_ids)],
        "remote_request_id": kv.remote_request_id,
        "remote_host": kv.remote_host,
        "remote_port": kv.remote_port,
        "tp_size": kv.tp_size,
    }


def kv_params_from_vllm(params: dict[str, Any] | None, kv_bytes_per_block: int,
                        advertise_host: str = "") -> KvTransferParams:
    """Type the kv_transfer_params a finished prefill-only request returns.

    vLLM puts its side channel's *bind* address (VLLM_NIXL_SIDE_CHANNEL_HOST) in remote_host; a decode engine
    on another host cannot dial 0.0.0.0 or 127.0.0.1, so ``advertise_host`` (the worker's --nixl-advertise)
    replaces it when given.
    """
    if not params:
        raise EngineError("prefill finished without kv_transfer_params: is the NixlConnector loaded?")
    try:
        groups = params["remote_block_ids"]
        if len(groups) != 1:
            raise EngineError(f"{len(groups)} KV cache groups; only single-group models are supported")
        block_ids = tuple(int(b) for b in groups[0])
        return KvTransferParams(
            remote_engine_id=str(params["remote_engine_id"]),
            remote_block_ids=block_ids,
            remote_host=advertise_host or str(params["remote_host"]),
            remote_port=int(params["remote_port"]),
            tp_size=int(params.get("tp_size", 1)),
            remote_request_id=str(params["remote_request_id"]),
            num_bytes=len(block_ids) * kv_bytes_per_block,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"unexpected kv_transfer_params from vLLM: {params!r}") from exc
