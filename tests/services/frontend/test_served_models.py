"""A frontend answers to its models' names and aliases (vLLM's --served-model-name NAME ALIAS...), under the name,
and to the LoRA adapters their live workers hold (docs/fleet.md)."""

from __future__ import annotations

import orjson
import pytest

from common.protocol import WorkerInfo, WorkerList
from services.frontend.openai_api import ApiError
from services.frontend.served_models import ServedModel, ServedModels, Target


def _workers(*infos: tuple[str, tuple[str, ...]]) -> WorkerList:
    return WorkerList(request_id="ls", loads=(), workers=tuple(
        WorkerInfo(worker_id=f"w{i}", role="both", model=model, block_size=32, num_blocks=8, endpoint="tcp://x:1",
                   lora_names=loras) for i, (model, loras) in enumerate(infos)))


@pytest.mark.parametrize(("requested", "canonical"), [("qwen3", "qwen3"), ("Qwen/Qwen3-8B", "qwen3"), ("q", "qwen3")])
def test_any_name_or_alias_is_served_under_the_name(requested, canonical) -> None:
    assert ServedModels.one("qwen3", ("Qwen/Qwen3-8B", "q")).canonical(requested) == canonical


def test_another_model_is_a_404_naming_what_is_served() -> None:
    with pytest.raises(ApiError) as err:
        ServedModels.one("qwen3", ("q",)).canonical("llama")
    assert err.value.status == 404 and "'qwen3', 'q'" in str(err.value)


def test_models_lists_every_name() -> None:
    data = orjson.loads(ServedModels.one("qwen3", ("q",)).listing())["data"]
    assert [(m["id"], m["root"]) for m in data] == [("qwen3", "qwen3"), ("q", "qwen3")]


SERVED = ServedModels((ServedModel("tiny", ("t",)), ServedModel("tiny2")))
WORKERS = _workers(("tiny", ("sql",)), ("tiny", ("sql", "chat")), ("tiny2", ("poem",)), ("other", ("x",)))


@pytest.mark.parametrize(("requested", "target"), [
    ("tiny", Target("tiny", "", "tiny")), ("t", Target("tiny", "", "tiny")), ("tiny2", Target("tiny2", "", "tiny2")),
    ("sql", Target("tiny", "sql", "sql")), ("chat", Target("tiny", "chat", "chat")),
    ("poem", Target("tiny2", "poem", "poem")),
])
def test_several_models_and_their_workers_adapters(requested, target) -> None:
    assert SERVED.target(requested, WORKERS) == target


@pytest.mark.parametrize("requested", ["x", "other", "llama"])  # another frontend's model and its adapter: 404
def test_names_nobody_here_serves_are_a_404_listing_what_is(requested) -> None:
    with pytest.raises(ApiError) as err:
        SERVED.target(requested, WORKERS)
    assert err.value.status == 404 and "'tiny', 't', 'chat', 'sql', 'tiny2', 'poem'" in str(err.value)


def test_models_lists_each_model_and_its_adapters_with_their_parent() -> None:
    data = orjson.loads(SERVED.listing(WORKERS))["data"]
    assert [(m["id"], m["root"], m["parent"]) for m in data] == [
        ("tiny", "tiny", None), ("t", "tiny", None), ("tiny2", "tiny2", None),
        ("chat", "chat", "tiny"), ("sql", "sql", "tiny"), ("poem", "poem", "tiny2")]
