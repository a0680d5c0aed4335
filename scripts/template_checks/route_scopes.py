"""Each route's authorizer and scopes in template.yaml against functions/routes.toml, the table
the dev server enforces, the OpenAPI document states and the tests hold the routers to: a client
built against `make serve` meets the same 401s and 403s on AWS."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .model import REPO, Template, as_list, target_of
from .report import check
from .routes import JWT_AUTHORIZER, auth_of, http_api_events

TABLE = Path("functions") / "routes.toml"
# The table's `auth` and the authorizer a route's event names for it.
AUTHORIZERS = {"jwt": JWT_AUTHORIZER, "none": "NONE", "iam": "AWS_IAM"}


def table_routes(repo: Path) -> dict[str, tuple[str, list[str]]]:
    """Route key ("POST /activities/{activityId}/orders") -> (authorizer, scopes), as the table says."""
    rows = tomllib.loads((repo / TABLE).read_text())["routes"]
    return {key: (AUTHORIZERS.get(row.get("auth"), f"unknown auth {row.get('auth')!r}"), list(row.get("scopes") or []))
            for key, row in rows.items()}


def template_routes(t: Template) -> dict[str, tuple[str, list[str]]]:
    """Route key -> (authorizer, scopes with each parameter resolved), over every function's events."""
    found = {}
    for _, _, ev in http_api_events(t):
        key = f"{str(ev.get('Method')).upper()} {ev.get('Path')}"
        scopes = [t.resolve(s) if target_of(s) else s for s in as_list((ev.get("Auth") or {}).get("AuthorizationScopes") or [])]
        found[key] = (auth_of(t, ev), [str(s) for s in scopes])
    return found


def kind(auth: str, scopes: list[str]) -> str:
    """How a failure names a route: by who may call it."""
    if auth == JWT_AUTHORIZER:
        return "admin route" if "seckill:admin" in scopes else "user route" if scopes else "token route"
    return {"NONE": "public route", "AWS_IAM": "IAM route"}.get(auth, "route")


def describe(auth: str, scopes: list[str]) -> str:
    if auth == JWT_AUTHORIZER:
        return f"the JwtAuthorizer with {scopes or 'no scope'}"
    return {"NONE": "no token (NONE)", "AWS_IAM": "a SigV4 signature (AWS_IAM)"}.get(auth, auth)


def check_route_scopes(t: Template, repo: Path = REPO) -> None:
    """Every route of the table is an event of the template with the same authorizer and the
    same scopes (parameters resolved), and every event is a row of the table."""
    try:
        want = table_routes(repo)
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        check(False, f"{TABLE} reads as a [routes] table -- {e!r}")
        return
    got = template_routes(t)
    for key in sorted(set(want) | set(got)):
        mine, theirs = want.get(key), got.get(key)
        label = kind(*(mine or theirs))
        if mine is None:
            check(False, f"{label} {key}: an event of template.yaml ({describe(*theirs)}) with no row in {TABLE}")
        elif theirs is None:
            check(False, f"{label} {key}: {TABLE} asks {describe(*mine)}, and template.yaml has no such route")
        else:
            check(mine == theirs, f"{label} {key}: {describe(*mine)}, as {TABLE} says"
                  + ("" if mine == theirs else f" -- template.yaml: {describe(*theirs)}"))
