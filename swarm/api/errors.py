"""Errors every failure a client can cause becomes: a 4xx with a message, in the shape of the API it called.

The shape follows the route: Ollama's routes (/api/...) answer `{"error": "..."}` as Ollama
does; Anthropic's (/v1/messages...) `{"type": "error", "error": {"type", "message"}}`, the
type following from the status as Anthropic's do; every other route answers OpenAI's
`{"error": {"message", "type", "param", "code"}}`, which the Responses API shares with chat
completions.
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Iterator

from aiohttp import web

log = logging.getLogger(__name__)

OLLAMA_PREFIX = "/api/"
ANTHROPIC_PREFIX = "/v1/messages"
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self, path: str = "") -> web.Response:
        return error_response(self.status, self.message, self.type, self.param, self.code, path=path)

    def body(self, path: str = "") -> dict:
        return error_body(self.message, self.type, self.param, self.code, path=path, status=self.status)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, *, path: str = "", status: int = 400) -> dict:
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    if path.startswith(ANTHROPIC_PREFIX):
        return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None, *, path: str = "") -> web.Response:
    return web.json_response(error_body(message, type, param, code, path=path, status=status), status=status)


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


@web.middleware
async def error_middleware(request: web.Request, handler):
    path = request.path
    try:
        return await handler(request)
    except ApiError as e:
        return e.response(path)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(413, f"request body too large: {e.text}", code="body_too_large", path=path)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "not_found_error" if e.status == 404 else "invalid_request_error"
        return error_response(e.status, f"{e.reason}: {request.method} {path}", kind, path=path)
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, path)
        return error_response(500, "internal error (see the node's log)", "server_error", path=path)


@contextmanager
def renamed_params(names: dict[str, str]) -> Iterator[None]:
    """A face that hands its body to the shared parsers in chat-completions form gets their errors back
    under its own field names. `names`: a regex of the shared parser's name (matched at the start of the
    param, `tools\\[\\d+\\]\\.function`) -> the face's; mentions in the message are renamed too."""
    try:
        yield
    except ApiError as e:
        for old, new in names.items():
            if e.param and re.match(rf"{old}(?![\w])", e.param):
                e.param = re.sub(rf"^{old}", new, e.param)
                e.message = re.sub(rf"{old}(?![\w])", new, e.message)
                e.args = (e.message,)
                break
        raise
