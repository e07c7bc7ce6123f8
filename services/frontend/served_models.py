"""The model names this frontend answers to (docs/fleet.md): each served model's name (what its workers register
and responses carry) and aliases, as vLLM's `--served-model-name NAME ALIAS...` (an alias is answered under the
first name), and the LoRA adapters its live workers hold (a request naming one runs on that model with it;
responses carry the adapter's name, as vLLM's do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import msgspec
import orjson

from common.protocol import WorkerList
from services.frontend.openai_api import ApiError, ChatCompletionRequest, CompletionRequest

_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Target:
    """What a request's ``model`` names: a served model, and the adapter of it to run with ("": none)."""

    model: str
    lora_name: str = ""
    name: str = ""  # what the response carries: the served name or the adapter's


def adapters(workers: WorkerList | None, model: str) -> dict[str, str]:
    """Adapter name -> its model, for every adapter a live worker of ``model`` holds."""
    if workers is None:
        return {}
    return {lora: w.model for w in workers.workers if w.model == model for lora in w.lora_names}


@dataclass(frozen=True, slots=True)
class ServedModels:
    models: tuple[ServedModel, ...]

    @classmethod
    def one(cls, name: str, aliases: tuple[str, ...] = ()) -> ServedModels:
        return cls((ServedModel(name, aliases),))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def canonical(self, requested: str) -> str:
        """The served name for a request's ``model``; 404 in OpenAI's shape for one not served here."""
        return self.target(requested, None).model

    def target(self, requested: str, workers: WorkerList | None) -> Target:
        """The model (and adapter) a request's ``model`` names; a 404 that lists what is served for another.
        ``workers``: the router's last list, where the adapters are."""
        for m in self.models:
            if requested == m.name or requested in m.aliases:
                return Target(m.name, "", m.name)
        for m in self.models:
            if requested in adapters(workers, m.name):
                return Target(m.name, requested, requested)
        served = ", ".join(repr(n) for n in self._all_names(workers))
        raise ApiError(404, f"model {requested!r} does not exist; this server serves {served}", param="model",
                       code="model_not_found")

    def served(self, body: _Body) -> _Body:
        """The request under its model's served name (what workers registered); a 404 for a name not served
        here. (The frontend resolves adapter names before: service.py ``_served``.)"""
        name = self.canonical(body.model)
        return body if name == body.model else msgspec.structs.replace(body, model=name)

    def _all_names(self, workers: WorkerList | None) -> list[str]:
        return [n for m in self.models for n in (m.name, *m.aliases, *sorted(adapters(workers, m.name)))]

    def listing(self, workers: WorkerList | None = None) -> bytes:
        """/v1/models: every name, each pointing at its served one (``root``); adapters as vLLM lists them,
        with their model as ``parent``."""
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "splitserve", "root": m.name,
                 "parent": None} for m in self.models for name in (m.name, *m.aliases)]
        data += [{"id": lora, "object": "model", "created": 0, "owned_by": "splitserve", "root": lora,
                  "parent": m.name} for m in self.models for lora in sorted(adapters(workers, m.name))]
        return orjson.dumps({"object": "list", "data": data})
