"""Our request types <-> vLLM 0.32 SamplingParams and NixlConnector kv_transfer_params."""

from __future__ import annotations

import importlib.util

import pytest
from msgspec.structs import replace

from common.errors import EngineError
from common.protocol import Handoff, KvTransferParams, SamplingParams
from services.worker.engine import EngineRequest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

# What a finished prefill-only request returns in vLLM 0.32 (pull mode, one KV cache group).
VLLM_PREFILL_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[4, 9, 2]],
    "remote_engine_id": "prefill-0",
    "remote_request_id": "req-1-a70f32ca",
    "remote_host": "127.0.0.1",
    "remote_port": 15611,
    "tp_size": 1,
    "remote_num_tokens": 70,
    "transfer_mode": "pull",
}


def test_prefill_params_round_trip_to_decode_params() -> None:
    from services.worker.engines.vllm.params import (
        decode_kv_params,
        kv_params_from_vllm,
    )

    kv = kv_params_from_vllm(VLLM_PREFILL_PARAMS, kv_bytes_per_block=1000)
    assert kv.remote_block_ids == (4, 9, 2) and kv.num_bytes == 3000
    assert kv.remote_request_id == "req-1-a70f32ca"
    decode = decode_kv_params(kv)
    assert decode["do_remote_prefill"] is True and decode["do_remote_decode"] is False
    for key in ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port"):
        assert decode[key] == VLLM_PREFILL_PARAMS[key]


@pytest.mark.parametrize(("vllm_host", "advertise_host", "expected"), [
    ("127.0.0.1", "", "127.0.0.1"),  # one host: vLLM's bind address is dialable as is
    ("0.0.0.0", "198.18.0.2", "198.18.0.2"),  # bound to every interface: the worker's --nixl-advertise
    ("127.0.0.1", "198.18.0.2", "198.18.0.2"),  # an advertised host always wins
])
def test_prefill_params_carry_the_advertised_side_channel_host(vllm_host: str, advertise_host: str,
                                                              expected: str) -> None:
    from services.worker.engines.vllm.params import (
        decode_kv_params,
        kv_params_from_vllm,
    )

    kv = kv_params_from_vllm({**VLLM_PREFILL_PARAMS, "remote_host": vllm_host}, 1000, advertise_host)
    assert kv.remote_host == expected and kv.remote_port == 15611
    assert decode_kv_params(kv)["remote_host"] == expected


def test_bad_prefill_params() -> None:
    from services.worker.engines.vllm.params import (
        decode_kv_params,
        kv_params_from_vllm,
    )

    with pytest.raises(EngineError, match="NixlConnector"):
        kv_params_from_vllm(None, 1)
    with pytest.raises(EngineError, match="KV cache groups"):
        kv_params_from_vllm({**VLLM_PREFILL_PARAMS, "remote_block_ids": [[1], [2]]}, 1)
    with pytest.raises(EngineError, match="unexpected"):
        kv_params_from_vllm({"remote_block_ids": [[1]]}, 1)
    with pytest.raises(EngineError, match="remote_request_id"):
        decode_kv_params(KvTransferParams(remote_engine_id="p", remote_block_ids=(1,), remote_host="h"))
    with pytest.raises(EngineError, match="remote_host is empty"):
        decode_kv_params(KvTransferParams(remote_engine_id="p", remote_block_ids=(1,), remote_request_id="r"))


def test_sampling_for_each_request_kind() -> None:
    from services.worker.engines.vllm.first_token import FORCED_TOKEN_KEY
    from services.worker.engines.vllm.params import to_vllm_sampling

    sampling = SamplingParams(max_tokens=9, temperature=0.0, stop_token_ids=(5,))
    params, forced = to_vllm_sampling(EngineRequest("a", (7, 8), sampling, prefill_only=True), None)
    assert params.max_tokens == 1 and forced is None
    assert params.extra_args["kv_transfer_params"] == {"do_remote_decode": True}

    kv = KvTransferParams(remote_engine_id="p", remote_block_ids=(1,), remote_request_id="r")
    params, forced = to_vllm_sampling(EngineRequest("b", (7, 8), sampling, handoff=Handoff(42, kv)), None)
    # The hand-off keeps the request's budget: the forced (re-sampled, dropped) first token is one of its tokens.
    assert params.max_tokens == 9 and forced == 42 and params.extra_args[FORCED_TOKEN_KEY] == 42
    assert params.stop_token_ids == [5]
    # Without KV to pull the same: the prompt is computed here, the first token forced all the same.
    params, forced = to_vllm_sampling(EngineRequest("c", (7, 8), sampling, handoff=Handoff(42)), None)
    assert params.max_tokens == 9 and forced == 42


def test_sampling_controls_reach_vllm_on_both_sides() -> None:
    from common.protocol import StructuredOutput
    from services.worker.engines.vllm.params import to_vllm_sampling

    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    sampling = SamplingParams(max_tokens=9, temperature=0.0, presence_penalty=0.5, frequency_penalty=-0.25,
                              repetition_penalty=1.3, logit_bias={7: 100.0}, min_tokens=4, logprobs=3, seed=11,
                              structured=StructuredOutput(json_schema=schema))
    kv = KvTransferParams(remote_engine_id="p", remote_block_ids=(1,), remote_request_id="r")
    prefill, _ = to_vllm_sampling(EngineRequest("p", (7, 8), sampling, prefill_only=True), None)
    decode, _ = to_vllm_sampling(EngineRequest("d", (7, 8), sampling, handoff=Handoff(42, kv)), None)
    for params in (prefill, decode):
        assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.25, 1.3)
        assert params.logit_bias == {7: 100.0} and params.logprobs == 3 and params.seed == 11
        assert params.structured_outputs.json == schema
    # top_k and min_p (vLLM drops them under greedy sampling: temperature 0.7 here).
    sampled, _ = to_vllm_sampling(EngineRequest("s", (7,), SamplingParams(temperature=0.7, top_k=5, min_p=0.05)),
                                  None)
    assert (sampled.top_k, sampled.min_p) == (5, 0.05)
    # min_tokens: one token on the prefill side; on the decode side the request's, the forced token one of them.
    assert prefill.min_tokens == 1 and decode.min_tokens == 4 and decode.max_tokens == 9
    any_json, _ = to_vllm_sampling(EngineRequest("j", (7,), SamplingParams(
        structured=StructuredOutput(json_object=True))), None)
    assert any_json.structured_outputs.json_object is True
    with pytest.raises(EngineError, match="refused by vLLM"):
        to_vllm_sampling(EngineRequest("x", (7,), SamplingParams(max_tokens=2, repetition_penalty=-1.0)), None)


def test_token_logprobs_from_vllm_positions() -> None:
    from vllm.logprobs import Logprob

    from services.worker.engines.vllm.params import token_logprobs

    positions = [
        {5: Logprob(-0.2, 1), 6: Logprob(-1.9, 2), 9: Logprob(-3.0, 3)},
        {8: Logprob(-4.0, 7), 6: Logprob(-0.1, 1), 5: Logprob(-2.5, 2), 1: Logprob(-2.9, 3)},  # sampled rank 7
    ]
    out = token_logprobs((5, 8), positions, num_top=2)
    assert [(lp.token_id, lp.logprob) for lp in out] == [(5, -0.2), (8, -4.0)]
    assert out[0].top == ((5, -0.2), (6, -1.9)) and out[1].top == ((6, -0.1), (5, -2.5))
    assert token_logprobs((5,), None, 2) == ()


def test_push_params_name_the_side_channel_not_the_request() -> None:
    from services.worker.engines.vllm.params import (
        decode_kv_params,
        kv_params_from_vllm,
    )

    kv = kv_params_from_vllm({**VLLM_PREFILL_PARAMS, "transfer_mode": "push"}, 1000, mode="push")
    assert kv.mode == "push"
    # Push matches the decode engine's block registration to the prefill request by request id, not by
    # remote_request_id: an engine that names none still works.
    decode = decode_kv_params(replace(kv, remote_request_id=""), "push")
    assert decode["do_remote_prefill"] is True and decode["remote_host"] == "127.0.0.1"
    assert (decode["remote_engine_id"], decode["remote_port"]) == ("prefill-0", 15611)
    # Pull and push engines cannot talk (vLLM's NIXL handshake compares their modes): refused, named.
    with pytest.raises(EngineError, match="moves KV by push, this decode engine by pull"):
        decode_kv_params(kv, "pull")
    with pytest.raises(EngineError, match="moves KV by pull, this decode engine by push"):
        decode_kv_params(kv_params_from_vllm(VLLM_PREFILL_PARAMS, 1000), "push")


def test_new_fields_reach_vllm_and_prompt_logprobs_only_where_the_prompt_is_computed() -> None:
    from services.worker.engines.vllm.params import to_vllm_sampling

    sampling = SamplingParams(max_tokens=4, allowed_token_ids=(3, 5, 9), bad_words_token_ids=((7,), (8, 2)),
                              prompt_logprobs=2)
    kv = KvTransferParams(remote_engine_id="p", remote_block_ids=(1,), remote_request_id="r")
    local, _ = to_vllm_sampling(EngineRequest("a", (7, 8), sampling), None)
    prefill, _ = to_vllm_sampling(EngineRequest("p", (7, 8), sampling, prefill_only=True), None)
    decode, _ = to_vllm_sampling(EngineRequest("d", (7, 8), sampling, handoff=Handoff(42, kv)), None)
    for params in (local, prefill, decode):
        assert params.allowed_token_ids == [3, 5, 9]
        assert params.bad_words_token_ids == [[7], [8, 2]]
    assert local.prompt_logprobs == 2 and prefill.prompt_logprobs == 2
    assert decode.prompt_logprobs is None  # it pulled the KV: the prompt was never computed there


@pytest.mark.parametrize(("structured", "field", "value"), [
    ({"regex": "[ab]+"}, "regex", "[ab]+"),
    ({"choice": ("yes", "no")}, "choice", ["yes", "no"]),
    ({"grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
    ({"structural_tag": '{"type": "x"}'}, "structural_tag", '{"type": "x"}'),
    ({"json_object": True}, "json_object", True),
])
def test_every_structured_output_kind_reaches_vllm(structured: dict, field: str, value) -> None:
    from common.protocol import StructuredOutput
    from services.worker.engines.vllm.params import to_vllm_sampling

    params, _ = to_vllm_sampling(EngineRequest("s", (7,), SamplingParams(
        structured=StructuredOutput(**structured, disable_additional_properties=True))), None)
    assert getattr(params.structured_outputs, field) == value
    assert params.structured_outputs.disable_additional_properties is True


def test_prompt_logprobs_from_vllm_positions() -> None:
    from vllm.logprobs import Logprob

    from services.worker.engines.vllm.params import prompt_logprobs

    positions = [None,
                 {8: Logprob(-0.3, 1), 4: Logprob(-1.2, 2)},  # the prompt's token is the likeliest
                 {9: Logprob(-6.0, 57), 4: Logprob(-0.5, 1), 2: Logprob(-0.9, 2)}]  # far down: listed apart
    out = prompt_logprobs([5, 8, 9], positions)
    assert [(lp.token_id, lp.logprob, lp.rank) for lp in out] == [(8, -0.3, 1), (9, -6.0, 57)]
    assert out[0].top == ((8, -0.3), (4, -1.2)) and out[1].top == ((4, -0.5), (2, -0.9))
