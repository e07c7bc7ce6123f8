"""A frontend answers to its served name and aliases (vLLM's --served-model-name NAME ALIAS...), under the name."""

from __future__ import annotations

import orjson
import pytest

from services.frontend.openai_api import ApiError
from services.frontend.served_models import ServedModels


@pytest.mark.parametrize(("requested", "canonical"), [("qwen3", "qwen3"), ("Qwen/Qwen3-8B", "qwen3"), ("q", "qwen3")])
def test_any_name_or_alias_is_served_under_the_name(requested, canonical) -> None:
    assert ServedModels("qwen3", ("Qwen/Qwen3-8B", "q")).canonical(requested) == canonical


def test_another_model_is_a_404_naming_what_is_served() -> None:
    with pytest.raises(ApiError) as err:
        ServedModels("qwen3", ("q",)).canonical("llama")
    assert err.value.status == 404 and "'qwen3', 'q'" in str(err.value)


def test_models_lists_every_name() -> None:
    data = orjson.loads(ServedModels("qwen3", ("q",)).listing())["data"]
    assert [(m["id"], m["root"]) for m in data] == [("qwen3", "qwen3"), ("q", "qwen3")]
