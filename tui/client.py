"""HTTP + server-sent-events client for one node's API (aiohttp).

Only three endpoints: GET /v1/topology, GET /v1/topology/events (SSE) and
POST /v1/chat/completions (streamed). Nothing here knows about Textual.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import aiohttp


class NodeError(Exception):
    """The node could not be reached or answered with an error."""


@dataclass
class ChatChunk:
    text: str = ""
    finish_reason: str | None = None
    swarm: dict = field(default_factory=dict)   # {"entry", "path", "plan_id"} on the last chunk


async def read_sse(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str]]:
    """Yield (event type, data) per server-sent event; comments and ids are skipped."""
    event, data = "message", []
    async for raw in resp.content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)


def _json_or_none(body: str):
    try:
        return json.loads(body)
    except ValueError:
        return None


def _error_text(status: int, body: str) -> str:
    try:
        return f"HTTP {status}: {json.loads(body)['error']['message']}"
    except Exception:
        return f"HTTP {status}: {body[:200]}"


class NodeClient:
    """One aiohttp session, used against whichever node URL the caller passes."""

    def __init__(self, timeout: float = 3.0, api_key: str | None = None):
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # a node's --api-key
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def topology(self, url: str) -> dict:
        try:
            async with self.session.get(url + "/v1/topology",
                                        timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                body = await r.text()
                data = _json_or_none(body)
                # 503 still carries a (minimal) topology while the node starts: can_serve false.
                if r.status != 200 and not (isinstance(data, dict) and "can_serve" in data):
                    raise NodeError(_error_text(r.status, body))
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise NodeError(str(e) or type(e).__name__) from e
        if not isinstance(data, dict):
            raise NodeError("the topology is not a JSON object")
        return data

    async def events(self, url: str) -> AsyncIterator[tuple[str, Any]]:
        """Yield (type, parsed data) from the topology event stream until it ends.

        Raises NodeError if the stream cannot be opened; returns when the node closes it.
        `sock_read` bounds silence: the node sends snapshots on change, so a long silence
        is handled by the caller (it checks liveness), not here.
        """
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=None)
        try:
            async with self.session.get(url + "/v1/topology/events", timeout=timeout,
                                        headers={"Accept": "text/event-stream"}) as r:
                if r.status != 200:
                    raise NodeError(_error_text(r.status, await r.text()))
                async for event, data in read_sse(r):
                    try:
                        yield event, json.loads(data)
                    except ValueError:
                        yield event, data
        except (aiohttp.ClientError, TimeoutError) as e:
            raise NodeError(str(e) or type(e).__name__) from e

    async def chat(self, url: str, messages: list[dict], **params) -> AsyncIterator[ChatChunk]:
        """Stream a chat completion: yields text deltas, then one chunk with finish_reason."""
        body = {"messages": messages, "stream": True, **{k: v for k, v in params.items() if v is not None}}
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=120)
        try:
            async with self.session.post(url + "/v1/chat/completions", json=body, timeout=timeout) as r:
                if r.status != 200:
                    raise NodeError(_error_text(r.status, await r.text()))
                async for _event, data in read_sse(r):
                    if data.strip() == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise NodeError(str(chunk["error"].get("message", chunk["error"])))
                    choices = chunk.get("choices") or [{}]
                    choice = choices[0] if isinstance(choices[0], dict) else {}
                    delta = choice.get("delta") or {}
                    yield ChatChunk(text=delta.get("content") or "", finish_reason=choice.get("finish_reason"),
                                    swarm=chunk.get("swarm") if isinstance(chunk.get("swarm"), dict) else {})
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise NodeError(str(e) or type(e).__name__) from e
