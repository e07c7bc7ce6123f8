"""Translation between our request types and vLLM 0.32's SamplingParams / NIXL connectors' transfer params."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm import SamplingParams as VllmSamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from common.errors import EngineError
from common.protocol import (
    KvTransferMode,
    KvTransferParams,
    StructuredOutput,
    TokenLogprobs,
)
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
    # min_tokens counts output tokens like max_tokens does: the forced first token is one more of them here,
    # and a prefill-only request emits one token (vLLM refuses min_tokens > max_tokens).
    min_tokens = sampling.min_tokens
    if forced_token is not None and min_tokens > 0:
        min_tokens += 1
    try:
        params = VllmSamplingParams(
            max_tokens=max_tokens,
            min_tokens=min(min_tokens, max_tokens),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            seed=sampling.seed,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            logit_bias=dict(sampling.logit_bias) or None,
            logprobs=sampling.logprobs,
            structured_outputs=_structured(sampling.structured),
            ignore_eos=sampling.ignore_eos,
            stop_token_ids=sorted(stop_ids),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
        )
    except (ValueError, VLLMValidationError) as exc:  # vLLM's own checks of the values
        raise EngineError(f"{request.request_id}: sampling parameters refused by vLLM: {exc}") from exc
    return params, forced_token


def _structured(structured: StructuredOutput | None) -> StructuredOutputsParams | None:
    """vLLM's guided decoding for a JSON schema or any JSON object. The prefill and the decode side of one
    request get the same grammar: the prefill's (forced) first token is then a valid first step for the
    decode engine's grammar, which advances over it as over any sampled token."""
    if structured is None:
        return None
    # Whitespace: the engine's StructuredOutputsConfig decides (vLLM reads it there, not per request).
    if structured.json_schema:
        return StructuredOutputsParams(json=structured.json_schema)
    return StructuredOutputsParams(json_object=True)


def token_logprobs(token_ids: tuple[int, ...], positions: Any, num_top: int) -> tuple[TokenLogprobs, ...]:
    """Our logprobs for new tokens from vLLM's per-position {token id: Logprob} (the sampled token plus the
    top ``num_top`` by rank); alternatives sorted highest first."""
    if positions is None:
        return ()
    out = []
    for i, token_id in enumerate(token_ids):
        position = positions[i]
        sampled = position.get(token_id)
        top = sorted(((tid, float(lp.logprob)) for tid, lp in position.items()
                      if lp.rank is not None and lp.rank <= num_top), key=lambda pair: -pair[1])[:num_top]
        out.append(TokenLogprobs(token_id=token_id, logprob=float(sampled.logprob) if sampled else float("nan"),
                                 top=tuple(top)))
    return tuple(out)


def decode_kv_params(kv: KvTransferParams, mode: KvTransferMode = "pull") -> dict[str, Any]:
    """The kv_transfer_params a decode request gives vLLM's NIXL connector (key names as 0.32 reads them).

    Pull (NixlConnector) READs ``remote_block_ids`` of request ``remote_request_id``. Push (NixlPushConnector)
    ignores both: the decode engine allocates its blocks, sends them to the prefill engine's agent (a NIXL
    notification through the side channel named here), and the prefill engine matches that registration with
    its finished request by request id (vLLM's random suffix stripped): the decode request must carry the
    prefill request's id, as the frontend's does.
    """
    if kv.mode != mode:
        raise EngineError(f"the prefill engine moves KV by {kv.mode}, this decode engine by {mode}: start every "
                          f"worker of a pool pair with the same --kv-transfer")
    if mode == "pull" and not kv.remote_request_id:
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
                        advertise_host: str = "", mode: KvTransferMode = "pull") -> KvTransferParams:
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
            # vLLM 0.32 names its connector's mode; older ones do not (the engine's own setting then).
            mode="push" if params.get("transfer_mode", mode) == "push" else "pull",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"unexpected kv_transfer_params from vLLM: {params!r}") from exc


def request_extras(request: EngineRequest, engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """``AsyncLLM.generate``'s keywords beyond the sampling: vLLM's own priority (it refuses one unless started with
    ``--scheduling-policy priority``; without it the frontend's admission queue orders alone) and the trace context
    (vLLM's own spans, when it traces itself)."""
    extras: dict[str, Any] = {}
    if request.sampling.priority and engine_args.get("scheduling_policy") == "priority":
        extras["priority"] = request.sampling.priority
    if request.traceparent:
        extras["trace_headers"] = {"traceparent": request.traceparent}
    return extras
