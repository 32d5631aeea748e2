"""Bearer-token authentication and project scoping of the API's ``/v1`` routes.

Every ``/v1`` route except the agents' (``/v1/agent/*``, which authenticate with per-node
credentials) depends on :data:`Caller`: a request without ``Authorization: Bearer <token>``, or
with a token that is unknown, expired or revoked, gets 401 with a ``WWW-Authenticate`` challenge
(RFC 6750). Tokens are issued by ``burst token create`` and stored hashed
(:mod:`orchestrator.store.tokens`).

Scoping rules (the same for every route, see docs/api.md):

* a route that needs a role the token lacks answers 403 (e.g. a viewer posting a job);
* a caller that names a project outside its token's projects gets 403, never an empty answer
  that would let it probe which projects exist;
* lists are filtered to the caller's projects before anything is summed, so a project token never
  sees, nor can deduce from a total, another project's rows. Rows of no project (nodes kept for
  ``min_nodes`` or a pre-warm, pool-wide budgets, work of jobs of no project) are the admin's only;
* users are seen through projects: a project token sees the users of its projects' jobs and
  nobody else's. A ``user`` filter narrows within the caller's projects, so a user unknown there
  (or only in another project) is an empty answer, never a 403 that would say the user exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.api.problems import Problem
from orchestrator.domain.costs import NO_PROJECT
from orchestrator.domain.jobs import check_user
from orchestrator.store.tokens import PROJECT_RE, ApiToken, Role
from orchestrator.wiring import Runtime

REALM = 'Bearer realm="burst"'

bearer = HTTPBearer(
    auto_error=False, scheme_name="token",
    description="An API token from `burst token create` (roles: admin, viewer, submitter).")


def runtime_of(request: Request) -> Runtime:
    """The runtime :func:`orchestrator.api.create_app` serves."""
    return request.app.state.runtime


async def bearer_secret(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> str:
    """The request's bearer secret, 401 when it sends none. No I/O, so FastAPI runs it on the
    event loop; the store's check is :func:`check_secret`."""
    if credentials is None or not credentials.credentials:
        raise Problem(401, "missing token",
                      "send Authorization: Bearer <token> (create one with burst token create)",
                      headers={"WWW-Authenticate": REALM})
    return credentials.credentials


def check_secret(request: Request, secret: str) -> ApiToken:
    """The :class:`ApiToken` a bearer secret names, 401 unless it is usable (one store read)."""
    runtime = runtime_of(request)
    token, status = runtime.store.check_api_token(secret, runtime.clock.now())
    if token is None or status != "ok":
        why = {"unknown": "the token is not valid", "revoked": "the token was revoked",
               "expired": "the token has expired"}[status]
        raise Problem(401, "invalid token", why, headers={
            "WWW-Authenticate": f'{REALM}, error="invalid_token", error_description="{why}"'})
    return token


Secret = Annotated[str, Depends(bearer_secret)]


def current_token(request: Request, secret: Secret) -> ApiToken:
    """The dependency that turns the request's bearer token into its :class:`ApiToken`. A sync
    route on a :class:`~orchestrator.api.one_hop.OneHopRoute` router runs the same check in its
    own worker call instead (one hand-off to the thread pool a request, not two)."""
    return check_secret(request, secret)


Caller = Annotated[ApiToken, Depends(current_token)]


def require_role(token: ApiToken, *roles: Role) -> None:
    """403 unless the token has one of ``roles`` (admin always may)."""
    if token.role is Role.ADMIN or token.role in roles:
        return
    wanted = ", ".join(["admin", *(str(r) for r in roles)])
    raise Problem(403, "forbidden", f"this needs a token with role {wanted}; token {token.id} "
                                    f"has role {token.role}")


def parse_projects(values: Iterable[str] | None, name: str = "project") -> frozenset[str] | None:
    """``?project=a&project=b`` or ``?project=a,b`` as a set of names (None: not given; ``-``:
    no project); a 422 naming the parameter for anything that is not a project name."""
    if not values:
        return None
    names: set[str] = set()
    for part in _listed(values):
        # "-" is how the ledger names the spend of nodes launched for no project.
        if part != NO_PROJECT and not PROJECT_RE.match(part):
            raise invalid(name, f"{part!r} is not a project name (letters, digits, '.', '_', "
                                "'/', '-'; at most 128 characters)")
        names.add(part)
    return frozenset(names)


def parse_users(values: Iterable[str] | None, name: str = "user") -> frozenset[str] | None:
    """``?user=a&user=b`` or ``?user=a,b`` as a set of user names (None: not given); a 422
    naming the parameter for anything that is not a user name."""
    if not values:
        return None
    names: set[str] = set()
    for part in _listed(values):
        try:
            names.add(check_user(part))
        except ValueError as exc:
            raise invalid(name, str(exc)) from None
    return frozenset(names)


def _listed(values: Iterable[str]) -> Iterator[str]:
    """Each name of ``?key=a&key=b`` or ``?key=a,b``, stripped."""
    for value in values:
        for part in value.split(","):
            yield part.strip()


def project_scope(token: ApiToken, asked: frozenset[str] | None) -> frozenset[str] | None:
    """The projects a request may read: what it asked for (403 if any is outside the token's
    scope), else the token's scope; None means every project (an admin asking for none)."""
    scope = token.scope
    if asked is None:
        return scope
    if scope is not None:
        foreign = sorted(asked - scope)
        if foreign:
            raise Problem(403, "forbidden", f"token {token.id} may not see project(s) "
                                            f"{', '.join(foreign)}")
    return asked


def invalid(parameter: str, message: str, where: str = "query") -> RequestValidationError:
    """A 422 naming one bad parameter, in the same problem form as FastAPI's own validation."""
    return RequestValidationError([{"loc": (where, parameter), "msg": message,
                                    "type": "value_error"}])


__all__ = ["REALM", "Caller", "Secret", "bearer", "bearer_secret", "check_secret", "current_token",
           "invalid", "parse_projects", "parse_users", "project_scope", "require_role",
           "runtime_of"]
