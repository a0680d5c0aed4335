"""functions/shape.toml against the template: each function's Timeout, the database role and
the Redis user its secrets log it in as, and the order consumer's event source (BatchSize, the
batching window, the MaximumConcurrency parameter's default) are what the shape says. The dev
server and the tests run each function by the shape, so the two must agree."""

from __future__ import annotations

import tomllib

from .model import REPO, Template, target_of
from .report import check

SHAPE = REPO / "functions" / "shape.toml"


def shape() -> dict[str, dict]:
    """Each function's table of functions/shape.toml, by binary name."""
    return tomllib.loads(SHAPE.read_text())


# The PostgreSQL login role each function's binary uses (the roles' migration creates them);
# the migrate binary alone logs in as the master and sets the roles' passwords.
DB_ROLE_OF_BINARY = {binary: s["role"] for binary, s in shape().items() if "role" in s}


def check_shape(t: Template) -> None:
    wanted = shape()
    deployed = {t.binary(fn): (name, fn) for name, fn in t.functions()}
    check(set(wanted) == set(deployed),
          f"functions/shape.toml has a table for each function and no other "
          f"(shape {sorted(wanted)}, template {sorted(deployed)})")
    for binary, s in wanted.items():
        if binary not in deployed:
            continue
        name, fn = deployed[binary]
        timeout = t.number(t.prop(fn, "Timeout"))
        check(timeout == s["timeout_secs"],
              f"{name}: Timeout {timeout} is functions/shape.toml's {s['timeout_secs']}")
        if "db_max_connections" in s:
            pool = t.number(parameter_default(t, t.env(fn).get("DB_MAX_CONNECTIONS")))
            check(pool == s["db_max_connections"],
                  f"{name}: DB_MAX_CONNECTIONS {pool} is functions/shape.toml's {s['db_max_connections']}")
        for ev_name, ev in (fn.get("Properties", {}).get("Events") or {}).items():
            if ev.get("Type") != "SQS":
                continue
            p = ev.get("Properties", {})
            got = (t.number(p.get("BatchSize", 10)),
                   t.number(p.get("MaximumBatchingWindowInSeconds", 0)),
                   t.number(parameter_default(t, (p.get("ScalingConfig") or {}).get("MaximumConcurrency"))))
            want = (s.get("batch_size"), s.get("batching_window_secs"), s.get("maximum_concurrency"))
            check(got == want,
                  f"{name}.{ev_name}: BatchSize, window, MaximumConcurrency (default) {got} are "
                  f"functions/shape.toml's {want}")


def parameter_default(t: Template, value):
    """A `{Ref: Parameter}`'s default (not the value a mode sets): what a deploy gets unless
    told otherwise."""
    ref = target_of(value)
    if ref and ref in t.doc.get("Parameters", {}):
        return t.doc["Parameters"][ref].get("Default")
    return value
