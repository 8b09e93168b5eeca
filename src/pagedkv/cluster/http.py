"""What every HTTP endpoint of the router and of ``pagedkv serve`` does before its own work:
check the API key, read at most ``max_body_bytes``, parse JSON strictly (no NaN or
infinity, nesting too deep is a 400, not a 500), and answer errors in OpenAI's shape."""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ApiKeyMiddleware",
    "HTTPError",
    "error_response",
    "parse_json_object",
    "read_body",
    "read_json_object",
]

DEFAULT_MAX_BODY_BYTES = 8 << 20


class HTTPError(Exception):
    """An error the client caused (or an engine's), with the status to answer."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


async def read_json_object(request: Request, max_body_bytes: int) -> dict[str, Any]:
    """The request's body as a JSON object; HTTPError 413 past ``max_body_bytes``, 400
    for anything that is not one strict JSON object."""
    return parse_json_object(await read_body(request, max_body_bytes))


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request's body; HTTPError 413 past ``max_body_bytes`` (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise HTTPError(413, f"the body is over {max_body_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            raise HTTPError(413, f"the body is over {max_body_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """One strict JSON object (no NaN or infinity); HTTPError 400 otherwise."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise HTTPError(400, f"the body is not valid JSON: {detail}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the body must be a JSON object")
    return body


class ApiKeyMiddleware:
    """Refuse (401) HTTP requests whose ``Authorization: Bearer KEY`` is not one of
    ``keys``, on every path that starts with one of ``prefixes`` ("/" for all)."""

    def __init__(self, app: ASGIApp, keys: Iterable[str], prefixes: Iterable[str] = ("/",)):
        self.app = app
        self.keys = [k.encode("utf-8") for k in keys]
        self.prefixes = tuple(prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys:
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith(self.prefixes) and not self._allowed(scope):
            response = error_response(401, "missing or wrong API key", "authentication_error")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        # compare against every key, so the time taken does not tell which one is close
        return any([hmac.compare_digest(token.strip(), key) for key in self.keys])
