"""`sam local invoke` on the local stack: events/env.json against the template and scripts/env.sh."""

from __future__ import annotations

import json
import re
import tomllib

from .model import NO_VALUE, REPO, Template
from .report import check
from .routes import http_api_events


LOCAL_ENV = REPO / "events" / "env.json"
# The local stack's addresses: scripts/env.sh is the one place that names them.
LOCAL_STACK_VARIABLES = ("DATABASE_URL", "REDIS_URL", "ORDER_QUEUE_URL", "ENTRY_QUEUE_URL",
                         "AWS_ENDPOINT_URL_SQS")


def env_sh_defaults() -> dict[str, str]:
    """The `: "${NAME:=value}"` defaults of scripts/env.sh."""
    text = (REPO / "scripts" / "env.sh").read_text()
    return dict(re.findall(r'^: "\$\{([A-Z0-9_]+):=([^}]*)\}"', text, flags=re.M))


def check_local_invoke(t: Template) -> None:
    """`sam local invoke` (samconfig's local_invoke) runs each function on the local stack:
    events/env.json may only override variables the template declares (SAM ignores the rest),
    points the stack's addresses where scripts/env.sh does, and blanks every secret ARN so
    nothing is read from AWS; every HTTP route has its event under events/."""
    local = json.loads(LOCAL_ENV.read_text())
    samconfig = tomllib.loads((REPO / "samconfig.toml").read_text())
    local_invoke = samconfig.get("default", {}).get("local_invoke", {}).get("parameters", {})
    check(local_invoke.get("env_vars") == "events/env.json",
          f"samconfig.toml's local_invoke reads events/env.json (got {local_invoke.get('env_vars')!r})")
    shared = local.get("Parameters", {})
    defaults = env_sh_defaults()
    check(all(shared.get(v) == defaults.get(v) for v in LOCAL_STACK_VARIABLES),
          "events/env.json points the functions where scripts/env.sh points the local stack "
          f"({[v for v in LOCAL_STACK_VARIABLES if shared.get(v) != defaults.get(v)]} differ)")
    for name, fn in t.functions():
        declared = {k for k, v in t.env(fn).items() if t.evaluate(v) != NO_VALUE}
        mine = {**shared, **local.get(name, {})}
        needed = set(local.get(name, {})) | (set(LOCAL_STACK_VARIABLES) & set(shared))
        undeclared = sorted(needed - declared)
        secrets = sorted(k for k in declared if k.endswith(("_ARN", "_ARNS")) and mine.get(k) != "")
        check(not undeclared and not secrets,
              f"{name}: sam local invoke with events/env.json points it at the local stack and blanks every "
              f"secret ARN (not declared, so SAM would ignore them: {undeclared}; ARNs not blanked: {secrets})")
    missing = sorted({f"{str(ev.get('Method')).upper()} {ev.get('Path')}" for _, _, ev in http_api_events(t)}
                     - event_route_keys(t))
    check(not missing, f"every HTTP route has its event under events/ (missing: {missing})")


def event_route_keys(t: Template) -> set[str]:
    """The route keys of the API Gateway events under events/ (a breakage may stand in its own)."""
    if "event_route_keys" in t.__dict__:
        return t.__dict__["event_route_keys"]
    return {json.loads(f.read_text()).get("routeKey") for f in (REPO / "events").glob("*.json")}
