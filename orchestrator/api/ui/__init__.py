"""The web dashboard at ``/ui``: server-rendered (Jinja2) pages over the store, read-only.

Sign-in is a form where the user pastes an API token (``burst token create``); the token is kept
in an HttpOnly, SameSite=Strict cookie scoped to ``/ui`` (Secure on HTTPS) and never appears in a
URL or a log. Every page checks it like the API's bearer auth (unknown, expired and revoked tokens
go back to the sign-in form) and shows only what that token may see through the API
(:mod:`orchestrator.api.ui.views`). Pages: fleet, queue, budgets, spend (with CSV download),
decisions and each decision's explanation (admin only, as in the API). They work without
JavaScript; a small script (``static/refresh.js``) only adds auto-refresh.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from orchestrator.api.ui import views
from orchestrator.api.ui.charts import burn_up
from orchestrator.api.v1 import NAME_PATTERN
from orchestrator.domain.snapshot_json import decision_to_jsonable
from orchestrator.store.tokens import ApiToken, Role
from orchestrator.wiring import Runtime

HERE = Path(__file__).parent
COOKIE = "burst_ui"
STATIC = {"ui.css": "text/css", "refresh.js": "text/javascript"}
MAX_FORM = 8192
PAGES = (("fleet", "Fleet"), ("queue", "Queue"), ("budgets", "Budgets"), ("spend", "Spend"),
         ("decisions", "Decisions"))

templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                        autoescape=select_autoescape(["html"]), trim_blocks=True,
                        lstrip_blocks=True)
templates.filters["usd"] = lambda v: f"${float(v):,.2f}"
templates.filters["duration"] = lambda s: (f"{s / 3600:.1f} h" if s >= 3600 else
                                           f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s")
templates.filters["pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)


class SignIn(Exception):
    """No valid token in the cookie: back to the sign-in form."""


def router(runtime: Runtime) -> APIRouter:
    ui = APIRouter(prefix="/ui", include_in_schema=False)

    def signed_in(request: Request) -> ApiToken:
        secret = request.cookies.get(COOKIE)
        if not secret:
            raise SignIn
        token, status = runtime.store.check_api_token(secret, runtime.clock.now())
        if token is None or status != "ok":
            raise SignIn
        return token

    def page(request: Request, name: str, title: str, token: ApiToken, status: int = 200,
             **context: Any) -> HTMLResponse:
        html = templates.get_template(f"{name}.html").render(
            title=title, pages=PAGES, current=name, token=token, admin=token.role is Role.ADMIN,
            scope=sorted(token.scope) if token.scope is not None else None, **context)
        return HTMLResponse(html, status_code=status, headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    @ui.get("")
    @ui.get("/")
    def home() -> RedirectResponse:
        return RedirectResponse("/ui/fleet", status_code=303)

    @ui.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            return Response("not found", status_code=404, media_type="text/plain")
        return FileResponse(HERE / "static" / name, media_type=STATIC[name],
                            headers={"Cache-Control": "max-age=300"})

    @ui.get("/login")
    def login_form(request: Request) -> HTMLResponse:
        return HTMLResponse(templates.get_template("login.html").render(
            title="Sign in", error=None), headers={"Cache-Control": "no-store"})

    @ui.post("/login")
    async def login(request: Request) -> Response:
        raw = await request.body()
        form = parse_qs(raw[:MAX_FORM].decode("utf-8", "replace"))
        secret = (form.get("token") or [""])[0].strip()
        token, status = (runtime.store.check_api_token(secret, runtime.clock.now())
                         if secret else (None, "unknown"))
        if token is None or status != "ok":
            why = {"unknown": "That token is not valid.", "revoked": "That token was revoked.",
                   "expired": "That token has expired."}.get(status, "That token is not valid.")
            return HTMLResponse(templates.get_template("login.html").render(
                title="Sign in", error=why), status_code=401, headers={"Cache-Control": "no-store"})
        response = RedirectResponse("/ui/fleet", status_code=303)
        response.set_cookie(COOKIE, secret, httponly=True, samesite="strict", path="/ui",
                            secure=request.url.scheme == "https", max_age=12 * 3600)
        return response

    @ui.post("/logout")
    def logout() -> Response:
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    @ui.get("/fleet")
    def fleet(request: Request) -> HTMLResponse:
        token = signed_in(request)
        return page(request, "fleet", "Fleet", token, view=views.fleet(runtime, token))

    @ui.get("/queue")
    def queue(request: Request) -> HTMLResponse:
        token = signed_in(request)
        return page(request, "queue", "Queue", token, view=views.queue(runtime, token))

    @ui.get("/budgets")
    def budgets(request: Request) -> HTMLResponse:
        token = signed_in(request)
        at, found = views.budgets(runtime, token)
        return page(request, "budgets", "Budgets", token, at=at,
                    budgets=[(b, burn_up(b)) for b in found])

    def spend_args(request: Request) -> tuple[str, int]:
        by = request.query_params.get("by", "project")
        days = request.query_params.get("days", "30")
        by = by if by in views.SPEND_GROUPINGS else "project"
        days_n = int(days) if days.isdigit() and 1 <= int(days) <= 366 else 30
        return by, days_n

    @ui.get("/spend")
    def spend(request: Request) -> HTMLResponse:
        token = signed_in(request)
        by, days = spend_args(request)
        report = views.spend_report(runtime, token, by, days)
        return page(request, "spend", "Spend", token, report=report.as_json(), by=by, days=days)

    @ui.get("/spend.csv")
    def spend_csv(request: Request) -> Response:
        token = signed_in(request)
        by, days = spend_args(request)
        report = views.spend_report(runtime, token, by, days)
        return Response(report.as_csv(), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="burst-spend-{by}-{days}d.csv"',
            "Cache-Control": "no-store"})

    @ui.get("/decisions")
    def decisions(request: Request) -> HTMLResponse:
        token = signed_in(request)
        if token.role is not Role.ADMIN:
            return page(request, "forbidden", "Decisions", token, status=403)
        found = runtime.store.decisions(limit=100)
        return page(request, "decisions", "Decisions", token,
                    decisions=[decision_to_jsonable(d) for d in found])

    @ui.get("/decisions/{decision_id}")
    def decision(request: Request,
                 decision_id: Annotated[str, PathParam(max_length=64, pattern=NAME_PATTERN)]
                 ) -> HTMLResponse:
        token = signed_in(request)
        if token.role is not Role.ADMIN:
            return page(request, "forbidden", "Decision", token, status=403)
        found = runtime.store.get_decision(decision_id)
        if found is None:
            return page(request, "missing", "Decision", token, status=404, what=decision_id)
        return page(request, "decision", f"Decision {decision_id}", token,
                    d=decision_to_jsonable(found))

    return ui


def install(app: FastAPI, runtime: Runtime) -> None:
    """Serve the dashboard on ``app``: its routes, and sign-in redirects for its pages."""
    app.include_router(router(runtime))

    async def to_sign_in(request: Request, exc: Exception) -> Response:
        return RedirectResponse("/ui/login", status_code=303)

    app.add_exception_handler(SignIn, to_sign_in)


__all__ = ["COOKIE", "install", "router"]
