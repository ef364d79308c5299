"""The served fraud route with its features free: what any online-feature design could reach (issue 47).

``bench/serve_floor.py`` compares the served route with its floor (a bare route plus the model). This
module serves a third thing between them: ``python -m flows.serve``'s app as it is (keys and scopes,
quotas, the body checks, the audit line, the batcher and breaker, the score log, the response),
serving :class:`BoundPredictor`: a :class:`~flows.serve.fraud.FraudPredictor` whose ``predict`` keeps
only what a stateful scorer must do for each request whatever its features:

* validate the rows (the one validator, :func:`~solutions.fraud.request_rows.validate_rows`);
* name each transaction id's owner (the keyed hash of its account, as the server claims ids);
* run the model once per batch (input tensors and forward pass) on one request's real inputs, computed
  once at setup by the online state after 40 earlier requests (so the features cost nothing);
* write each row and each claim to RocksDB, one write batch per model call (the rows that later
  features read, and the claims that refuse a reused id and answer a retry).

It reads nothing back: no order check, no replay, no windows. Its rate is therefore an upper bound on
what the served route can reach with today's app, validator, model and store, however fast its features.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_path_bench import real_row_inputs

from flows.serve.fraud import FraudPredictor, FraudScoreRequest
from infra.registry import ModelRef
from infra.serving.model_route import ModelRoute
from infra.serving.runtime import Services, Vertical


class BoundPredictor(FraudPredictor):
    """The fraud predictor with its features free (see the module docstring)."""

    def __init__(self, model_name: str, services: Services) -> None:
        super().__init__(model_name, services)
        self._inputs: list[Any] = []
        self._db: Any = None

    def setup(self, ref: ModelRef) -> Any:
        import rocksdict

        model = super().setup(ref)
        self._inputs = real_row_inputs(model, self.services.layout.root / "bound-inputs")
        if self._db is None:  # the store's engine and write options (unsynced WAL: RocksStateStore's default)
            options = rocksdict.Options(raw_mode=True)
            options.create_if_missing(True)
            self._db = rocksdict.Rdict(str(self.services.layout.root / "bound-state"), options=options)
            write = rocksdict.WriteOptions()
            write.sync = False
            self._db.set_write_options(write)
        return model

    def predict(self, model: Any, items: list[FraudScoreRequest], challenger: Any = None) -> list[Any]:
        import rocksdict

        from infra.errors import DataValidationError
        from solutions.fraud.online import ScoredRequest, validate_rows

        frames: list[Any] = []
        for body in items:
            try:
                frames.append((validate_rows(body.transactions, body.columns,
                                             max_amount=self.services.settings.fraud_max_amount),
                               [who for _, who in self.id_pairs(body.transactions, body.columns)]))
            except (DataValidationError, ValueError) as exc:
                frames.append(exc)
        n = sum(len(f[0].t_ns) for f in frames if not isinstance(f, Exception))
        scores = model.predict([self._inputs[i % len(self._inputs)] for i in range(n)]) if n else []
        batch, out, start = rocksdict.WriteBatch(raw_mode=True), [], 0
        for frame in frames:
            if isinstance(frame, Exception):
                out.append(frame)
                continue
            rows, owners = frame
            mine = scores[start:start + len(rows.t_ns)]
            for i, (tx, who) in enumerate(zip(rows.tx_ids, owners, strict=True)):
                key = (tx or f"{start + i}").encode()
                batch.put(b"r" + key, orjson.dumps([rows.t_ns[i], rows.amounts[i], rows.accounts[i],
                                                    rows.terminals[i], float(mine[i])]))
                batch.put(b"o" + key, orjson.dumps([who, rows.t_ns[i]]))
            out.append(ScoredRequest(scores=mine, inputs=[], accounts=rows.accounts, ids=rows.tx_ids,
                                     has_terminal=rows.has_terminal))
            start += len(rows.t_ns)
        self._db.write(batch)
        return out

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()


def build(services: Services) -> Vertical:
    """The bound's fraud vertical: :class:`BoundPredictor` behind the route every model kind uses."""
    predictor = BoundPredictor(services.settings.fraud_model, services)
    route = ModelRoute(services, predictor)
    router = APIRouter(tags=["fraud"])
    route.mount(router)

    def stop() -> None:
        route.close()
        predictor.close()

    return Vertical("fraud", router, [route.slot], on_stop=stop)


def bound_app() -> Any:
    """``flows.serve``'s app serving :func:`build`'s vertical alone."""
    from flows.serve.app import create_app

    return create_app(build_verticals=[build])


def serve_bound(port: int) -> None:
    """Run :func:`bound_app` as ``flows.serve`` runs its app (same HTTP protocol class)."""
    import uvicorn

    from infra.serving.protocol import GuardedHttpProtocol

    uvicorn.run("serve_bound:bound_app", factory=True, host="127.0.0.1", port=port, log_level="warning",
                proxy_headers=False, http=GuardedHttpProtocol, app_dir=str(Path(__file__).resolve().parent))
