"""The generic route (:class:`~infra.serving.model_route.ModelRoute`) with a toy predictor, no HTTP:
one version per batch, one model call per group of consecutive requests, a failing call made again
for each request alone, the split challenger deciding its share of subjects (and the score log
saying which version decided each row), a failing challenger leaving the champion to answer, and a
predictor of no registered model that is not batched (the knowledge base's ask)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel
from starlette.requests import Request

from infra.home import HomeLayout
from infra.registry import CHALLENGER, CHAMPION, ModelRef, ModelRegistry
from infra.serving.challenger import SCORES_DIR, read_score_log
from infra.serving.model_route import ModelRoute
from infra.serving.predictor import Answer, Audit, Encoded, Predictor, Rows
from infra.serving.runtime import ServeTuning, Services
from infra.settings import ServeSettings

TOY = "toy-route"


@dataclass(frozen=True)
class Item:
    subjects: list[str]
    group: str = ""
    broken: bool = False  # the model call fails whenever this request is in it


@dataclass(frozen=True)
class Scored:
    subjects: list[str]
    scores: np.ndarray


class Out(BaseModel):
    scores: list[float]


class Toy(Predictor[Item, float, Scored]):
    """Scores each subject as the version's weight; a request marked ``broken`` breaks the model call."""

    path, route_name, tag, response_model = "/v1/toy/route", "score", "toy", Out

    def __init__(self, registry: ModelRegistry) -> None:
        super().__init__(TOY)
        self.registry = registry
        self.calls: list[list[Item]] = []
        self.challenger_fails = False

    def setup(self, ref: ModelRef) -> float:
        return float(self.registry.load_state_dict(ref)["w"][0])

    async def decode_request(self) -> Item:  # not used here: the tests call the batch directly
        raise NotImplementedError

    def predict(self, model: float, items: list[Item], challenger: float | None = None) -> list[Scored | Exception]:
        self.calls.append(items)
        if any(item.broken for item in items):
            raise RuntimeError("the model failed")
        return [Scored(item.subjects, np.full(len(item.subjects), model)) for item in items]

    def encode_response(self, decoded: Item, answer: Answer[Scored]) -> Encoded:
        assert not isinstance(answer.output, Exception)
        return Encoded(Out(scores=answer.output.scores.tolist()), Audit(len(decoded.subjects), {}))

    def group(self, item: Item) -> object:
        return item.group

    def rows(self, output: Scored) -> Rows:
        return Rows(subjects=output.subjects, ids=list(output.subjects), scores=output.scores)

    def predict_challenger(self, challenger: float, items: list[Item],
                           outputs: list[Scored | Exception]) -> list[Scored | None]:
        if self.challenger_fails:
            raise RuntimeError("the challenger failed")
        return [Scored(o.subjects, np.full(len(o.subjects), challenger)) if isinstance(o, Scored) else None
                for o in outputs]


def _route(tmp_path: Path, mode: str) -> tuple[ModelRoute[Item, float, Scored], Toy, Services]:
    layout = HomeLayout(tmp_path / "home")
    registry = ModelRegistry(layout.registry())
    for weight in (1.0, 2.0):
        registry.register(TOY, {"w": torch.full((1,), weight)}, params={}, metrics={"m": weight}, primary_metric="m")
    registry.set_alias(TOY, CHAMPION, 1)
    registry.set_alias(TOY, CHALLENGER, 2)
    services = Services.from_settings(ServeSettings(challenger_share=0.5), layout, registry, ServeTuning())
    toy = Toy(registry)
    route = ModelRoute(services, toy, challenger_mode=mode)
    assert route.slot.check_now()
    if route.challenger is not None:
        assert route.challenger.slot.check_now()
    return route, toy, services


def _logged(services: Services, role: str) -> dict[str, tuple[int, bool]]:
    services.scores.close()
    return {r["id"]: (r["version"], r["decided"])
            for r in read_score_log(services.layout.serving() / SCORES_DIR, TOY) if r["role"] == role}


def test_one_call_per_group_and_a_failing_call_made_again_per_request(tmp_path: Path) -> None:
    route, toy, _ = _route(tmp_path, "off")
    items = [Item(["a"], "x"), Item(["b"], "x"), Item(["c"], "y"), Item(["d"], "y", broken=True), Item(["e"], "x")]
    answers = route.run_batch(items)
    # x | y, y (fails) then each of them alone | x
    assert [len(c) for c in toy.calls] == [2, 2, 1, 1, 1]
    assert [a.output.scores.tolist() for a in answers if not isinstance(a.output, Exception)] == [[1.0]] * 4
    assert isinstance(answers[3].output, RuntimeError)
    assert {a.ref.version for a in answers} == {1}


def test_a_lone_request_that_breaks_the_model_fails_its_batch(tmp_path: Path) -> None:
    route, _, _ = _route(tmp_path, "off")
    with pytest.raises(RuntimeError, match="the model failed"):
        route.run_batch([Item(["a"], broken=True)])


def test_a_split_challenger_decides_its_share_of_subjects_and_the_log_says_so(tmp_path: Path) -> None:
    route, _, services = _route(tmp_path, "split")
    subjects = [f"s{i}" for i in range(64)]
    [answer] = route.run_batch([Item(subjects)])
    assert route.challenger is not None
    want = route.challenger.answers(subjects)
    assert 0 < want.sum() < len(subjects)  # a share of them, by the keyed hash
    assert answer.challenger is not None and answer.challenger.version == 2
    assert (answer.by_challenger == want).all()
    champion, challenger = _logged(services, "champion"), _logged(services, "challenger")
    assert {s: d for s, (_, d) in champion.items()} == {s: not w for s, w in zip(subjects, want, strict=True)}
    assert {s: d for s, (_, d) in challenger.items()} == dict(zip(subjects, want.tolist(), strict=True))
    assert {v for v, _ in champion.values()} == {1} and {v for v, _ in challenger.values()} == {2}


def test_a_failing_challenger_leaves_the_champion_to_answer(tmp_path: Path) -> None:
    route, toy, services = _route(tmp_path, "split")
    toy.challenger_fails = True
    [answer] = route.run_batch([Item(["a", "b", "c", "d"])])
    assert answer.challenger is None and not answer.by_challenger.any()
    assert answer.output.scores.tolist() == [1.0] * 4  # type: ignore[union-attr]
    assert set(_logged(services, "champion")) == {"a", "b", "c", "d"} and not _logged(services, "challenger")


class Echo(BaseModel):
    text: str


class Local(Predictor[str, str, str]):
    """No registry version, no batching: each request its own call, two of them in flight at once."""

    path, route_name, tag, response_model = "/v1/toy/local", "local", "toy", Echo
    batchable = False
    registered = False

    def __init__(self) -> None:
        super().__init__("toy-local")
        self.setups = 0
        self.together = threading.Barrier(2, timeout=10)  # broken unless two calls run at the same time

    def setup(self, ref: ModelRef | None) -> str:
        assert ref is None
        self.setups += 1
        return "built"

    async def decode_request(self) -> str:
        raise NotImplementedError

    def predict(self, model: str, items: list[str], challenger: str | None = None) -> list[str | Exception]:
        assert len(items) == 1
        self.together.wait()
        return [f"{model}:{items[0]}"]

    def encode_response(self, decoded: str, answer: Answer[str]) -> Encoded:
        assert answer.ref is None and isinstance(answer.output, str)
        return Encoded(Echo(text=answer.output), Audit(1, {}, fields={"asked": len(decoded)}))

    def rows(self, output: str) -> Rows:
        return Rows(subjects=[], ids=[output], scores=np.zeros(1), logged=False)


def test_an_unbatched_unregistered_predictor_answers_each_request_in_its_own_call(tmp_path: Path) -> None:
    layout = HomeLayout(tmp_path / "home")
    services = Services.from_settings(ServeSettings(), layout, ModelRegistry(layout.registry()), ServeTuning())
    local = Local()
    with pytest.raises(ValueError, match="no challenger"):
        ModelRoute(services, Local(), challenger_mode="shadow")
    route = ModelRoute(services, local)
    assert route.batcher is None and route.challenger is None and route.slot not in services.slots
    requests = [Request({"type": "http", "headers": []}) for _ in range(2)]

    async def both() -> list[object]:
        return await asyncio.gather(route.answer(requests[0], "a"), route.answer(requests[1], "bb"))

    # batched, the two would share one call (or wait for each other in the batch's one thread)
    assert asyncio.run(both()) == [Echo(text="built:a"), Echo(text="built:bb")]
    assert local.setups == 1
    # the predictor's fields only: no model version to name
    assert [r.state.audit for r in requests] == [{"asked": 1}, {"asked": 2}]
    services.scores.close()
    assert not read_score_log(layout.serving() / SCORES_DIR, "toy-local")
