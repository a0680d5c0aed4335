"""The HTTP API's routes: throttles where no token is needed, the admin router's routes, who may
call each entry route, and GET /health/deep behind IAM."""

from __future__ import annotations

import re

from .model import REPO, Template, as_list, num, strings_in, sub_text, target_of
from .report import check


def http_api_events(t: Template):
    for name, fn in t.functions():
        for ev_name, ev in (fn.get("Properties", {}).get("Events") or {}).items():
            if ev.get("Type") == "HttpApi":
                yield name, ev_name, ev.get("Properties", {})


def auth_of(t: Template, ev: dict) -> str:
    """The authorizer a route's event ends up with: its own, else its API's default."""
    own = (ev.get("Auth") or {}).get("Authorizer")
    if own:
        return own
    api = t.resources.get(target_of(ev.get("ApiId")), {}).get("Properties", {})
    return (api.get("Auth") or {}).get("DefaultAuthorizer") or "NONE"


JWT_AUTHORIZER = "JwtAuthorizer"


def check_route_throttles(t: Template) -> None:
    """Every route that needs no token (no auth, or IAM) has a throttle of its own, at most the stage's."""
    apis = {n: r for n, r in t.resources.items() if r.get("Type") == "AWS::Serverless::HttpApi"}
    for fn_name, ev_name, ev in http_api_events(t):
        auth = auth_of(t, ev)
        if auth == JWT_AUTHORIZER:
            continue
        route = f"{ev.get('Method', '').upper()} {ev.get('Path')}"
        api = apis.get(target_of(ev.get("ApiId")), {}).get("Properties", {})
        stage = api.get("DefaultRouteSettings") or {}
        own = ev.get("RouteSettings") or (api.get("RouteSettings") or {}).get(route) or {}
        for limit in ("ThrottlingRateLimit", "ThrottlingBurstLimit"):
            mine, default = t.number(own.get(limit)), t.number(stage.get(limit))
            check(
                mine is not None and default is not None and mine <= default,
                f"{route} ({'no token' if auth == 'NONE' else auth}, {fn_name}.{ev_name}): {limit} {num(mine)}"
                f" <= the stage's {num(default)}",
            )


# ---------------------------------------------------------------- admin routes


def router_routes(src: Path) -> set[tuple[str, str]]:
    """(METHOD, path) of every #[utoipa::path(method, path = "...")] handler under src."""
    found = set()
    for rs in sorted(src.glob("**/*.rs")):
        for m in re.finditer(r"#\[utoipa::path\(\s*(get|post|put|patch|delete)\s*,\s*path\s*=\s*\"([^\"]+)\"", rs.read_text()):
            found.add((m.group(1).upper(), m.group(2)))
    return found


def shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def check_admin_routes(t: Template) -> None:
    admins = [(n, f) for n, f in t.functions() if t.binary(f) == "admin"]
    check(len(admins) == 1, "exactly one function builds admin")
    if not admins:
        return
    name, fn = admins[0]
    routes = router_routes(REPO / "functions" / "admin" / "src")
    check(bool(routes), f"functions/admin/src declares its routes with #[utoipa::path] ({len(routes)} found)")
    events = {}
    for ev_name, ev in (fn.get("Properties", {}).get("Events") or {}).items():
        if ev.get("Type") == "HttpApi":
            props = ev.get("Properties", {})
            events[(str(props.get("Method")).upper(), shape(str(props.get("Path"))))] = props
    for method, path in sorted(routes):
        ev = events.get((method, shape(path)))
        auth = (ev or {}).get("Auth") or {}
        scopes = [target_of(s) or s for s in as_list(auth.get("AuthorizationScopes") or [])]
        check(ev is not None and auth.get("Authorizer") == "JwtAuthorizer" and scopes == ["AdminScope"],
              f"admin route {method} {path}: an event of {name} with the JwtAuthorizer and AdminScope"
              + ("" if ev else " (missing)") + (f" (scopes {scopes})" if ev and scopes != ["AdminScope"] else ""))
    stale = sorted(set(events) - {(m, shape(p)) for m, p in routes})
    check(not stale, f"{name}: every HttpApi event is a route of functions/admin's router (not: {stale})")


# ---------------------------------------------------------------- who may call each route


ENTRY_BINARY = "seckill-entry"
# Every route of the entry function and what it takes (the admin routes are checked against
# functions/admin's router above): user routes a token with UserScope, the public view, the
# liveness check and the provider's webhook nothing, the deep health check an IAM signature.
ENTRY_ROUTE_AUTH = {
    ("POST", "/activities/{activityId}/orders"): (JWT_AUTHORIZER, ["UserScope"]),
    ("GET", "/activities/{activityId}/orders/me"): (JWT_AUTHORIZER, ["UserScope"]),
    ("POST", "/orders/{orderId}/pay"): (JWT_AUTHORIZER, ["UserScope"]),
    ("POST", "/orders/{orderId}/cancel"): (JWT_AUTHORIZER, ["UserScope"]),
    ("GET", "/activities/{activityId}"): ("NONE", []),
    ("GET", "/health"): ("NONE", []),
    ("POST", "/payments/webhook"): ("NONE", []),
    ("GET", "/health/deep"): ("AWS_IAM", []),
}
USER_SCOPE = ("UserScope", "seckill:user")


def describe_auth(auth: str, scopes: list) -> str:
    if auth == JWT_AUTHORIZER:
        return f"the JwtAuthorizer with {scopes or 'no scope'}"
    return {"NONE": "no token (Authorizer NONE)", "AWS_IAM": "IAM only (AWS_IAM, SigV4)"}.get(auth, auth)


def check_route_auth(t: Template) -> None:
    name, default = USER_SCOPE
    param = t.doc.get("Parameters", {}).get(name, {})
    check(str(param.get("Default")) == default, f"parameter {name} exists and defaults to {default} (got {param.get('Default')!r})")
    entries = [(n, f) for n, f in t.functions() if t.binary(f) == ENTRY_BINARY]
    if not entries:
        return  # check_entry_policy reports it
    fn_name, fn = entries[0]
    events = {}
    for ev in (fn.get("Properties", {}).get("Events") or {}).values():
        if ev.get("Type") == "HttpApi":
            props = ev.get("Properties", {})
            events[(str(props.get("Method")).upper(), shape(str(props.get("Path"))))] = props
    for (method, path), (want, want_scopes) in ENTRY_ROUTE_AUTH.items():
        ev = events.get((method, shape(path)))
        auth = auth_of(t, ev) if ev else None
        scopes = [target_of(s) or s for s in as_list((ev or {}).get("Auth", {}).get("AuthorizationScopes") or [])]
        check(ev is not None and auth == want and scopes == want_scopes,
              f"{method} {path}: {describe_auth(want, want_scopes)}"
              + ("" if ev else f" -- not an event of {fn_name}")
              + (f" -- got {describe_auth(auth, scopes)}" if ev and (auth, scopes) != (want, want_scopes) else ""))
    unknown = sorted(set(events) - {(m, shape(p)) for m, p in ENTRY_ROUTE_AUTH})
    check(not unknown, f"{fn_name}: every HttpApi route is one whose auth is checked here (not: {unknown})")


# ---------------------------------------------------------------- GET /health/deep (IAM)


DEEP_HEALTH = ("GET", "/health/deep")


def check_deep_health(t: Template) -> None:
    """The IAM route: the API enables IAM authorization, and one managed policy (an output)
    grants execute-api:Invoke on exactly that route for a monitoring role to attach."""
    apis = [n for n, _ in t.of_type("AWS::Serverless::HttpApi")]
    for api in apis:
        auth = t.resources[api].get("Properties", {}).get("Auth") or {}
        check(auth.get("EnableIamAuthorizer") is True, f"{api}: Auth.EnableIamAuthorizer true (GET /health/deep is AWS_IAM)")
    method, path = DEEP_HEALTH
    want = {f"arn:${{AWS::Partition}}:execute-api:${{AWS::Region}}:${{AWS::AccountId}}:${{{a}}}/$default/{method}{path}" for a in apis}
    policies = [(n, r) for n, r in t.of_type("AWS::IAM::ManagedPolicy")
                if "execute-api:Invoke" in set(strings_in(r.get("Properties", {}).get("PolicyDocument")))]
    check(len(policies) == 1, f"one managed policy grants execute-api:Invoke ({[n for n, _ in policies]})")
    for name, pol in policies:
        problems = []
        for st in as_list(pol["Properties"]["PolicyDocument"].get("Statement")):
            if st.get("Effect") != "Allow":
                continue
            if as_list(st.get("Action")) != ["execute-api:Invoke"]:
                problems.append(f"actions {st.get('Action')}")
            resources = [sub_text(r) for r in as_list(st.get("Resource"))]
            if len(resources) != 1 or resources[0] not in want:
                problems.append(f"resources {resources}")
        check(not problems, f"{name}: execute-api:Invoke on exactly {method} {path} of the HTTP API, stage $default"
              + (f" -- {problems}" if problems else ""))
        outputs = [o for o, v in (t.doc.get("Outputs") or {}).items() if t.active(v) and target_of(v.get("Value")) == name]
        check(bool(outputs), f"{name}: an output gives its ARN for the monitoring role ({outputs})")
