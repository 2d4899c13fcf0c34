"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}`` with the
HTTP status OpenAI uses for the same mistake, so clients (the ``openai`` package raises
``BadRequestError``, ``AuthenticationError``, ``NotFoundError`` ...) report them as they would
for OpenAI's own API."""
from __future__ import annotations

from typing import Any, Optional

#: HTTP status -> OpenAI's error type.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
         503: "server_error"}


class ApiError(Exception):
    """A request that gets an error response instead of a completion."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)
