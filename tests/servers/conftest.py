"""Fixtures of the ``servers`` tier: real processes on 127.0.0.1 (the serving tests' Redis)."""

from tests.serve.conftest import redis_url  # noqa: F401 - the throwaway redis-server fixture
