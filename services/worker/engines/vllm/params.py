"""Translation between our request types and vLLM 0.32's SamplingParams / NIXL connectors' transfer params."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams as VllmSamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from common.continuation import prefill_sampling
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
    """vLLM sampling params for a request, and the first token to force (a hand-off's) or None.

    A hand-off keeps the request's budget as sent: the forced first token is one of its output tokens, and the
    engine drops it from what it emits (common/continuation.py, ``ForcedFirst``)."""
    sampling = prefill_sampling(request.sampling) if request.prefill_only else request.sampling
    stop_ids = set(sampling.stop_token_ids)
    if not sampling.ignore_eos and model is not None:
        stop_ids.update(model.eos_token_ids)
    extra_args: dict[str, Any] = {}
    forced_token: int | None = None
    if request.prefill_only:
        extra_args["kv_transfer_params"] = {"do_remote_decode": True}
    elif request.handoff is not None:
        forced_token = request.handoff.first_token_id
        extra_args[FORCED_TOKEN_KEY] = forced_token
    try:
        params = VllmSamplingParams(
            max_tokens=sampling.max_tokens,
            min_tokens=sampling.min_tokens,
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
            # The engine that computes the prompt scores it: a decode engine that pulled the KV never did.
            prompt_logprobs=None if request.kv_transfer is not None else sampling.prompt_logprobs,
            allowed_token_ids=list(sampling.allowed_token_ids) or None,
            structured_outputs=_structured(sampling.structured),
            ignore_eos=sampling.ignore_eos,
            stop_token_ids=sorted(stop_ids),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
        )
    except (ValueError, VLLMValidationError) as exc:  # vLLM's own checks of the values
        raise EngineError(f"{request.request_id}: sampling parameters refused by vLLM: {exc}") from exc
    if sampling.bad_words_token_ids:
        # Tokenized by the frontend exactly as SamplingParams.update_from_tokenizer does (bad_words stays empty,
        # so the engine's own pass leaves these alone): workers need no tokenizer for it.
        params._bad_words_token_ids = [list(ids) for ids in sampling.bad_words_token_ids]
    return params, forced_token


def _structured(structured: StructuredOutput | None) -> StructuredOutputsParams | None:
    """vLLM's guided decoding (one constraint of each kind vLLM has). The prefill and the decode side of one
    request get the same grammar: the prefill's (forced) first token is then a valid first step for the
    decode engine's grammar, which advances over it as over any sampled token."""
    if structured is None:
        return None
    options: dict[str, Any] = {"disable_any_whitespace": structured.disable_any_whitespace,
                               "disable_additional_properties": structured.disable_additional_properties,
                               "whitespace_pattern": structured.whitespace_pattern or None}
    if structured.json_schema:
        return StructuredOutputsParams(json=structured.json_schema, **options)
    if structured.regex:
        return StructuredOutputsParams(regex=structured.regex, **options)
    if structured.choice:
        return StructuredOutputsParams(choice=list(structured.choice), **options)
    if structured.grammar:
        return StructuredOutputsParams(grammar=structured.grammar, **options)
    if structured.structural_tag:
        return StructuredOutputsParams(structural_tag=structured.structural_tag, **options)
    return StructuredOutputsParams(json_object=True, **options)


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


def prompt_logprobs(prompt_ids: list[int], positions: Any) -> tuple[TokenLogprobs, ...]:
    """Our prompt logprobs from vLLM's RequestOutput.prompt_logprobs (None for the first position, then
    {token id: Logprob}: the prompt's own token at its rank and the alternatives ranked 1..N). ``top`` holds
    the alternatives in rank order (the i-th has rank i + 1), the own token's rank is ``rank``."""
    out = []
    for token_id, position in zip(prompt_ids[1:], positions[1:], strict=False):
        own = position.get(token_id)
        own_rank = int(own.rank) if own is not None and own.rank is not None else 0
        ranked = sorted((int(lp.rank or 0), tid, float(lp.logprob)) for tid, lp in position.items()
                        if tid != token_id or own_rank <= len(position))
        out.append(TokenLogprobs(token_id=token_id, logprob=float(own.logprob) if own else float("nan"),
                                 top=tuple((tid, lp) for _, tid, lp in ranked), rank=own_rank))
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
