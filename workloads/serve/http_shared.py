"""The HTTP pieces every serving process shares (the gateway and the CPU engine): a refusal raised while handling a
request, and the OpenAI error body it is answered with. Imports nothing else of workloads.serve."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code}}, status_code=status)
