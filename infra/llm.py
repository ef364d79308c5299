"""An OpenAI-compatible chat-completions client (Qianfan/ERNIE, vLLM, Ollama, ...),
non-streaming and streaming (server-sent events). The key is never logged: error messages go
through :func:`infra.secrets.http_error_text`, and the httpx exception is not chained (its
request would carry the ``Authorization`` header into a traceback)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from infra.secrets import UpstreamError, http_error_text, scrub, shown_url
from infra.settings import LLMSettings

log = logging.getLogger(__name__)

#: Sampling temperature of answers: low, so an answer sticks to its passages (grounded question answering, not
#: creative writing), yet not 0, which some endpoints treat as greedy decoding prone to repeating itself.
TEMPERATURE = 0.1
#: Seconds a chat request may take: a long answer from a busy self-hosted model takes a minute or more.
TIMEOUT_S = 120.0


class LLMError(UpstreamError):
    """The chat endpoint failed or answered something that is not a chat completion.

    Attributes:
        status: the endpoint's HTTP status when it answered one other than 200, else None.
    """

    service = "the language model endpoint"


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation."""

    role: str
    content: str


class ChatClient:
    """Calls ``POST {url}/chat/completions``; ``url`` is the API base (e.g. ``http://host:8000/v1``)."""

    def __init__(self, settings: LLMSettings) -> None:
        if not settings.configured():
            raise ValueError("ChatClient needs INDUSFLOW_LLM_URL and INDUSFLOW_LLM_MODEL")
        self.settings = settings

    def _endpoint(self) -> str:
        base = (self.settings.url or "").rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    def _known(self) -> list[str]:
        """The values an error message must never show (the key, with and without its scheme)."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return [key, f"Bearer {key}"] if key else []

    def _error(self, status: int, body: str) -> LLMError:
        return LLMError(f"chat endpoint {shown_url(self._endpoint())} answered "
                        f"{http_error_text(status, body, self._known())}", status=status)

    def _unreachable(self, exc: Exception) -> LLMError:
        return LLMError(f"chat endpoint {shown_url(self._endpoint())} unreachable: {type(exc).__name__}: "
                        f"{scrub(str(exc), self._known())[:200]}")

    def _body(self, messages: list[ChatMessage], stream: bool) -> dict:
        return {
            "model": self.settings.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": TEMPERATURE,
            "max_tokens": self.settings.max_tokens,
            "stream": stream,
        }

    def complete(self, messages: list[ChatMessage]) -> str:
        """The assistant's whole answer."""
        try:
            resp = httpx.post(
                self._endpoint(), json=self._body(messages, False), headers=self._headers(),
                timeout=TIMEOUT_S,
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if resp.status_code != 200:
            raise self._error(resp.status_code, resp.text)
        try:
            return str(resp.json()["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, ValueError) as exc:
            raise LLMError("chat endpoint answered without choices[0].message.content") from exc

    def stream(self, messages: list[ChatMessage]) -> Iterator[str]:
        """Yield the answer's text pieces as the endpoint streams them."""
        try:
            with httpx.stream(
                "POST", self._endpoint(), json=self._body(messages, True), headers=self._headers(),
                timeout=TIMEOUT_S,
            ) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise self._error(resp.status_code, resp.text)
                for line in resp.iter_lines():
                    line = line.strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        delta = json.loads(payload)["choices"][0].get("delta", {})
                    except (ValueError, KeyError, IndexError) as exc:
                        raise LLMError("malformed streaming chunk from chat endpoint") from exc
                    piece = delta.get("content")
                    if piece:
                        yield piece
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
