"""OpenAI-style errors: every failure a client can cause becomes a 4xx with a message."""

from __future__ import annotations

import logging

from aiohttp import web

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(413, f"request body too large: {e.text}", code="body_too_large")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "not_found_error" if e.status == 404 else "invalid_request_error"
        return error_response(e.status, f"{e.reason}: {request.method} {request.path}", kind)
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(500, "internal error (see the node's log)", "server_error")
