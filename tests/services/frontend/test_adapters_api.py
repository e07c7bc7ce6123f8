"""/v1/load_lora_adapter and /v1/unload_lora_adapter: which workers are asked, and vLLM's answers."""

from __future__ import annotations

import pytest

from common.errors import TransportTimeout
from common.protocol import AdapterDone, WorkerInfo, WorkerList
from services.frontend.adapters_api import change_adapters, parse_adapter_request
from services.frontend.openai_api import ApiError
from services.frontend.served_models import ServedModel, ServedModels

ONE = ServedModels.one("tiny")
TWO = ServedModels((ServedModel("tiny"), ServedModel("tiny2", ("t2",))))


def _workers(*specs: tuple[str, str, tuple[str, ...]], draining: tuple[str, ...] = ()) -> WorkerList:
    return WorkerList(request_id="ls", loads=(), draining=draining, workers=tuple(
        WorkerInfo(worker_id=wid, role="both", model=model, block_size=32, num_blocks=8, endpoint=f"tcp://{wid}:1",
                   lora_names=loras) for wid, model, loras in specs))


class Asked:
    def __init__(self, failing: dict[str, str] | None = None, timeout: tuple[str, ...] = ()) -> None:
        self.endpoints: list[str] = []
        self._failing, self._timeout = failing or {}, timeout

    async def __call__(self, endpoint: str, msg, timeout_s: float):
        self.endpoints.append(endpoint)
        wid = endpoint.split("//")[1].split(":")[0]
        if wid in self._timeout:
            raise TransportTimeout("silent")
        why = self._failing.get(wid, "")
        return AdapterDone(request_id=msg.request_id, worker_id=wid, ok=not why, message=why)


def _req(body: str, load: bool = True):
    return parse_adapter_request(body.encode(), load)


async def test_load_asks_every_live_worker_of_the_model_that_lacks_it() -> None:
    ask = Asked()
    workers = _workers(("a", "tiny2", ()), ("b", "tiny2", ("sql",)), ("c", "tiny", ()), ("d", "tiny2", ()),
                       draining=("d",))
    text = await change_adapters(ask, workers, TWO, _req('{"lora_name": "sql", "lora_path": "/p", "model": "t2"}'),
                                 True)
    assert text == "Success: LoRA adapter 'sql' added successfully." and ask.endpoints == ["tcp://a:1"]
    text = await change_adapters(ask, workers, TWO, _req('{"lora_name": "sql", "model": "tiny2"}', False), False)
    assert text == "Success: LoRA adapter 'sql' removed successfully." and ask.endpoints[1:] == ["tcp://b:1"]


@pytest.mark.parametrize(("body", "load", "served", "workers", "ask", "status", "words"), [
    ('{"lora_name": "sql", "lora_path": "/p"}', True, ONE, _workers(("a", "tiny", ("sql",))), Asked(), 400,
     "already been loaded"),
    ('{"lora_name": "sql"}', False, ONE, _workers(("a", "tiny", ())), Asked(), 404, "cannot be found"),
    ('{"lora_name": "sql", "lora_path": "/p"}', True, TWO, _workers(("a", "tiny", ())), Asked(), 400,
     "say which model"),
    ('{"lora_name": "sql", "lora_path": "/p"}', True, ONE, _workers(("a", "other", ())), Asked(), 503,
     "no live worker serves model 'tiny'"),
    ('{"lora_name": "tiny", "lora_path": "/p"}', True, ONE, _workers(("a", "tiny", ())), Asked(), 400,
     "a model's name"),
    ('{"lora_name": "sql", "lora_path": "/p"}', True, ONE, _workers(("a", "tiny", ()), ("b", "tiny", ())),
     Asked({"a": "bad adapter"}), 500, "on 1 of 2 workers: a: bad adapter"),
    ('{"lora_name": "sql", "lora_path": "/p"}', True, ONE, _workers(("a", "tiny", ())), Asked(timeout=("a",)), 400,
     "a: silent"),
])
async def test_refusals(body, load, served, workers, ask, status, words) -> None:
    with pytest.raises(ApiError) as err:
        await change_adapters(ask, workers, served, _req(body, load), load)
    assert err.value.status == status and words in err.value.message


@pytest.mark.parametrize(("body", "load"), [("{}", True), ('{"lora_name": "x"}', True), ("[", True),
                                            ('{"lora_name": ""}', False), ('{"lora_name": "x", "extra": 1}', False)])
def test_bad_bodies_are_400(body, load) -> None:
    with pytest.raises(ApiError) as err:
        parse_adapter_request(body.encode(), load)
    assert err.value.status == 400
