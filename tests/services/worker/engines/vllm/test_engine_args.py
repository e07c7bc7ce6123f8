"""The user's vLLM engine arguments: vLLM's parser reads them, only what was given comes back, the contract's own
are refused, and the engine's AsyncEngineArgs put them over splitserve's defaults (CPU: eager; GPU: vLLM's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


def _parse(*argv: str):
    from services.worker.engines.vllm.engine_args import parse_engine_args

    return parse_engine_args(list(argv))


@pytest.mark.parametrize(("argv", "given"), [
    ((), {}),
    (("--",), {}),
    (("-tp", "2", "-pp", "2"), {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}),
    (("--max-model-len", "16k"), {"max_model_len": 16000}),  # vLLM's value syntax (16k = 16,000; 16K = 16,384)
    (("--max_num_seqs=8",), {"max_num_seqs": 8}),  # underscores and = as vLLM takes them
    (("--enforce-eager",), {"enforce_eager": True}),
    (("--no-enforce-eager",), {"enforce_eager": False}),  # given, though it is vLLM's default: it counts
    (("--served-model-name", "a", "b"), {"served_model_name": ["a", "b"]}),
    (("--gpu-memory-utilization", "0.45", "--kv-cache-dtype", "fp8"),
     {"gpu_memory_utilization": 0.45, "kv_cache_dtype": "fp8"}),
])
def test_only_the_given_arguments_come_back(argv, given) -> None:
    assert dict(_parse(*argv).given) == given


def test_json_and_dotted_configs_are_vllms() -> None:
    args = _parse("--compilation-config.mode", "3", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}')
    assert int(args.given["compilation_config"].mode) == 3
    assert args.given["speculative_config"]["num_speculative_tokens"] == 2


def test_a_config_file_as_in_vllm_serve(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("max-model-len: 8192\ntensor-parallel-size: 2\n")
    args = _parse("--config", str(path), "-tp", "4")  # the command line wins over the file
    assert dict(args.given) == {"max_model_len": 8192, "tensor_parallel_size": 4}


@pytest.mark.parametrize(("argv", "message"), [
    (("--max-modl-len", "3"), "did you mean --max-model-len?"),
    (("--max-num-seqs", "x"), "invalid int value: 'x'"),
    (("--kv-cache-dtype", "fp3"), "invalid choice"),
    (("--kv-transfer-config", '{"kv_connector": "NixlConnector"}'), "set by splitserve"),
    (("--no-enable-prefix-caching",), "prefix cache"),
    (("--kv-events-config", "{}"), "set by splitserve"),
    (("--kv_transfer_config.kv_connector", "X"), "set by splitserve"),
    (("--max-num-seqs", "0", "--kv-cache-dtype", "fp8", "--block-size", "x"), "invalid"),
    (("--model", "x"), "worker's --model"),
    (("--config", "/nonexistent.yaml"), "nonexistent"),
])
def test_bad_arguments_are_one_line_errors(argv, message) -> None:
    from services.worker.engines.vllm.engine_args import EngineArgsError

    with pytest.raises(EngineArgsError) as err:
        _parse(*argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def _kwargs(monkeypatch, on_cuda: bool, **config):
    from services.worker.engines.vllm import engine
    from services.worker.engines.vllm.config import VllmEngineConfig

    monkeypatch.setattr(engine, "_has_cuda", lambda: on_cuda)
    config = {"kv_role": None, **config}
    return engine.VllmEngine(VllmEngineConfig(model=Path("m"), kv_events=False, **config))._engine_kwargs()


def test_on_cpu_eager_and_the_measured_batch_limits_unless_the_user_says(monkeypatch) -> None:
    kwargs = _kwargs(monkeypatch, False)
    assert (kwargs["enforce_eager"], kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (True, 64, 2048)
    assert "max_model_len" not in kwargs  # the model's full context, vLLM's default
    kwargs = _kwargs(monkeypatch, False, engine_args={"enforce_eager": False, "max_model_len": 32768}, max_num_seqs=8)
    assert (kwargs["enforce_eager"], kwargs["max_model_len"], kwargs["max_num_seqs"]) == (False, 32768, 8)


def test_a_cpu_prefill_engine_takes_short_steps_and_caps_a_long_prompt_unless_the_user_sets_the_batch(
        monkeypatch) -> None:
    kwargs = _kwargs(monkeypatch, False, kv_role="prefill")
    assert (kwargs["max_num_batched_tokens"], kwargs["long_prefill_token_threshold"]) == (512, 256)
    kwargs = _kwargs(monkeypatch, False, kv_role="decode")
    assert kwargs["max_num_batched_tokens"] == 2048 and "long_prefill_token_threshold" not in kwargs
    # The user's batch size: none of ours (a 256-token cap under a 16k budget would starve a long prompt).
    kwargs = _kwargs(monkeypatch, False, kv_role="prefill", max_num_batched_tokens=16384)
    assert kwargs["max_num_batched_tokens"] == 16384 and "long_prefill_token_threshold" not in kwargs
    kwargs = _kwargs(monkeypatch, False, kv_role="prefill", engine_args={"long_prefill_token_threshold": 64})
    assert (kwargs["max_num_batched_tokens"], kwargs["long_prefill_token_threshold"]) == (512, 64)
    assert "long_prefill_token_threshold" not in _kwargs(monkeypatch, True, kv_role="prefill")


def test_on_gpus_vllms_defaults_compiled_with_cuda_graphs(monkeypatch) -> None:
    kwargs = _kwargs(monkeypatch, True)
    assert not {"enforce_eager", "max_num_seqs", "max_num_batched_tokens", "max_model_len"} & set(kwargs)
    kwargs = _kwargs(monkeypatch, True, engine_args={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.45})
    assert (kwargs["tensor_parallel_size"], kwargs["gpu_memory_utilization"]) == (2, 0.45)


def test_the_contract_is_kept_whatever_the_user_gave(monkeypatch) -> None:
    kwargs = _kwargs(monkeypatch, False, engine_args={"max_num_seqs": 4})
    assert kwargs["enable_prefix_caching"] is True and kwargs["skip_tokenizer_init"] is False
    assert kwargs["logits_processors"] and kwargs["disable_log_stats"] is True


def test_every_given_argument_is_an_async_engine_args_field() -> None:
    """What the worker hands vLLM is AsyncEngineArgs(**kwargs): every dest the parser makes must be a field."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    from services.worker.engines.vllm.engine_args import engine_arg_names

    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert engine_arg_names() - fields == set()
