"""The online REST API: ``python -m flows.serve`` (the server) and ``python -m flows.serve keys``.

:mod:`flows.serve.app` assembles the app (probes, metrics, docs, the shared middleware) around
the verticals' routers (:mod:`flows.serve.fraud`, :mod:`flows.serve.sensor`); the generic
machinery (auth, limits, audit, metrics, breaker, model slots) lives in :mod:`infra.serving`.
"""
