"""Errors as RFC 9457 problem documents: every error the API returns is JSON, never a traceback."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class Problem(Exception):
    """Raise to answer with a problem document."""

    def __init__(self, status: int, title: str, detail: str = "",
                 headers: dict[str, str] | None = None, **extra):
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.headers = headers
        self.extra = extra


def problem_response(status: int, title: str, detail: str = "",
                     headers: dict[str, str] | None = None, **extra) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type="application/problem+json",
                        headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.title, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in exc.errors()]
        # "query.from: Value error, ...": each bad parameter named with where it was sent.
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: "
                           f"{str(e['msg']).removeprefix('Value error, ')}" for e in errors)
        return problem_response(422, "invalid request", f"invalid {detail}", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem_response(exc.status_code, str(exc.detail), str(exc.detail),
                                getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(500, "internal error", "the controller hit an unexpected error")
