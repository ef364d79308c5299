"""The generic route (:class:`~infra.serving.model_route.ModelRoute`) with a toy predictor, no HTTP:
one version per batch, one model call per group of consecutive requests, a failing call made again
for each request alone, the split challenger deciding its share of subjects (and the score log
saying which version decided each row), and a failing challenger leaving the champion to answer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel

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
