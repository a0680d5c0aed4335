"""Time budgets: every step on a function's path has a bound, and in sequence they end, with margin,
before the function's Timeout.

An invocation Lambda kills mid-path leaves its protocol half done and its caller with the
gateway's error instead of ours. The bounds come from where they are set: shared::Config's
defaults (its clap `default_value`s) overridden by the function's environment in the template,
the constants in the Rust sources, RDS Proxy's borrow timeout in the template, and the roles'
statement timeouts in migrations/. docs/capacity.md, "Time budgets", is `--budget`'s output."""

from __future__ import annotations

import re

from .shape import DB_ROLE_OF_BINARY
from .model import REPO, Template, num
from .report import check


CONFIG_RS = REPO / "shared" / "src" / "infra" / "config" / "mod.rs"
# The least margin a path leaves before its function's Timeout: the runtime's own work, and
# the answer's way out.
MIN_MARGIN_SECS = 1.0
MIN_MARGIN_FRACTION = 0.05
# What each role's CONNECTION LIMIT adds to its function's reservation x pool size (the
# migration's header says what for).
ROLE_CONNECTION_HEADROOM = 10


def config_defaults() -> dict[str, str]:
    """shared::Config's default of each variable: the `default_value` of every `#[arg(...)]`
    that reads an `env` (what `--help` shows)."""
    defaults = {}
    for block in re.findall(r"#\[arg\((.*?)\)\]", CONFIG_RS.read_text(), re.S):
        env = re.search(r'\benv\s*=\s*"([A-Z0-9_]+)"', block)
        default = re.search(r'\bdefault_value\s*=\s*"([^"]*)"', block)
        if env and default:
            defaults[env.group(1)] = default.group(1)
    return defaults


def rust_const(path: str, name: str) -> float:
    """A Rust constant of the sources: a Duration (`from_millis` / `from_secs`) in seconds, or a
    number."""
    text = (REPO / path).read_text()
    m = re.search(rf"const {name}: [\w:]*Duration\s*=\s*[\w:]*Duration::from_(millis|secs)\((\d[\d_]*)\)", text)
    if m:
        value = float(m.group(2).replace("_", ""))
        return value / 1000 if m.group(1) == "millis" else value
    m = re.search(rf"const {name}: \w+\s*=\s*(\d[\d_]*)\s*;", text)
    if not m:
        raise ValueError(f"no constant {name} in {path}")
    return float(m.group(1).replace("_", ""))


def role_bounds() -> dict[str, dict[str, float]]:
    """Each role's statement timeout and idle-in-transaction timeout (s) and connection limit,
    as the last migration that sets them says (rows `('role', 'Nms', 'Nms', limit)`)."""
    bounds = {}
    row = re.compile(r"\('(seckill_[a-z]+)',\s*'(\d+)ms',\s*'(\d+)ms',\s*(\d+)\)")
    for sql in sorted((REPO / "migrations").glob("*.sql")):
        for role, statement, idle, limit in row.findall(sql.read_text()):
            bounds[role] = {"statement": int(statement) / 1000, "idle": int(idle) / 1000,
                            "limit": int(limit)}
    return bounds


def proxy_borrow_timeout(t: Template) -> float | None:
    """RDS Proxy's ConnectionBorrowTimeout (s): how long a statement may wait for the proxy to
    lend it a database connection (0 means forever; AWS's default is 120)."""
    for _, group in t.of_type("AWS::RDS::DBProxyTargetGroup"):
        info = group.get("Properties", {}).get("ConnectionPoolConfigurationInfo") or {}
        value = t.number(info.get("ConnectionBorrowTimeout", 120))
        return float("inf") if value == 0 else value
    return None


def setting(t: Template, fn: dict, defaults: dict[str, str], name: str) -> float | None:
    """A shared::Config setting of a function: its environment in the template, else the default."""
    value = t.env(fn).get(name, defaults.get(name))
    return t.number(value)


def budget_paths(t: Template, name: str, fn: dict) -> list[tuple[str, list[tuple[str, float]]]]:
    """The worst paths of a function (the entry, the consumer), each as its steps in sequence with
    their bounds (s); [] for the others. A database step is a pool wait (DB_ACQUIRE_TIMEOUT_MS),
    RDS Proxy lending a connection (ConnectionBorrowTimeout) and its statements (each at most the
    role's statement_timeout)."""
    binary = t.binary(fn)
    if binary not in ("seckill-entry", "order-consumer"):
        return []
    defaults = config_defaults()
    role = role_bounds().get(DB_ROLE_OF_BINARY[binary], {})
    redis, sqs, acquire = (setting(t, fn, defaults, v) for v in
                           ("REDIS_TIMEOUT_MS", "SQS_TIMEOUT_MS", "DB_ACQUIRE_TIMEOUT_MS"))
    borrow, statement = proxy_borrow_timeout(t), role.get("statement")
    if None in (redis, sqs, acquire, borrow, statement):
        raise ValueError(f"{name}: a bound is missing (redis {redis}, sqs {sqs}, acquire {acquire}, "
                         f"proxy borrow {borrow}, statement {statement})")
    redis, sqs, acquire = redis / 1000, sqs / 1000, acquire / 1000

    def db(what: str, statements: int = 1) -> tuple[str, float]:
        return (f"db: {what}" + (f" ({statements} statements)" if statements > 1 else ""),
                acquire + borrow + statements * statement)

    if binary == "order-consumer":
        batch = next((t.number(ev.get("Properties", {}).get("BatchSize", 10))
                      for ev in (fn.get("Properties", {}).get("Events") or {}).values() if ev.get("Type") == "SQS"), 10)
        buckets = min(batch, rust_const("shared/src/domain/settings.rs", "MAX_BUCKETS"))
        stop = rust_const("functions/order-consumer/src/lib.rs", "STOP_BEFORE_DEADLINE")
        fast = [(f"redis: the ledger, one HMGET per home bucket (x{buckets:g})", buckets * redis),
                db("the batch statement: confirm_orders, its inserts and the stock in one transaction"),
                ("redis: drop the ledger entries", redis)]
        slowest = [db("the request's row"),
                   ("redis: its ledger entry", redis),
                   db("the order transaction: begin, insert, stock, epoch, rollback", 5),
                   db("claim: insert the failed row"),
                   db("claim: read the row it met"),
                   ("redis: give the units back", redis)]
        return [("an SQS batch: the slowest batch write, then the slowest message, then the stop",
                 [(f"batch write: {w}", v) for w, v in fast]
                 + [(f"message: {w}", v) for w, v in slowest]
                 + [("STOP_BEFORE_DEADLINE: the batch answers this long before the deadline", stop)])]

    provider = rust_const("shared/src/infra/payments.rs", "PROVIDER_TIMEOUT")
    other_cancel = rust_const("shared/src/protocol/cancel.rs", "OTHER_ATTEMPT_WAIT")
    deep = rust_const("functions/seckill-entry/src/health.rs", "DEEP_CHECK_TIMEOUT")
    claim = [db("claim: insert the failed row"), db("claim: read the row it met")]
    return [
        ("POST /activities/{id}/orders, the send failed",
         [("redis: the purchase script", redis), ("sqs: the order message", sqs), *claim,
          ("redis: give the units back", redis)]),
        ("POST /activities/{id}/orders, a draw entry's send failed",
         [("redis: the entry script", redis), ("sqs: the entry message", sqs), *claim,
          ("redis: leave the pool", redis), db("the user's other kept entry"),
          ("redis: put it back", redis), db("mark it late")]),
        ("POST /activities/{id}/orders, the script unanswered",
         [("redis: the purchase script", redis), *claim,
          ("redis: give the units back, first try (half REDIS_TIMEOUT_MS)", redis / 2)]),
        ("POST /activities/{id}/orders, a sale Redis does not hold",
         [("redis: the purchase script", redis), ("redis: the user's database rate", redis), db("the highest sale id"),
          db("the sale")]),
        ("POST /orders/{id}/pay",
         [("redis: the user's database rate", redis), db("the order"), db("its payment"), db("the sale"),
          ("provider: start the payment (PROVIDER_TIMEOUT)", provider),
          db("record the payment"), db("read it back")]),
        ("POST /orders/{id}/pay, the order cancelled meanwhile",
         [("redis: the user's database rate", redis), db("the order"), db("its payment"), db("the sale"),
          ("provider: start the payment (PROVIDER_TIMEOUT)", provider),
          db("record the payment: refused"),
          ("provider: cancel the payment just made, read-back included (PROVIDER_TIMEOUT in all)", provider)]),
        ("POST /orders/{id}/cancel, its payment paid at the provider",
         [("redis: the user's database rate", redis), db("the order"), db("its payment"),
          ("provider: cancel the payment, read-back included (PROVIDER_TIMEOUT in all)", provider),
          db("pay the order: begin, lock, paid, succeeded, commit", 5)]),
        ("POST /orders/{id}/cancel, its payment cancelled at the provider",
         [("redis: the user's database rate", redis), db("the order"), db("its payment"),
          ("provider: cancel the payment, read-back included (PROVIDER_TIMEOUT in all)", provider),
          db("record it cancelled"), ("redis: announce the cancel", redis),
          db("the cancel's database function"), ("redis: finish the cancel", redis)]),
        ("POST /orders/{id}/cancel, its payment cancelled at the provider, another cancel in flight",
         [("redis: the user's database rate", redis), db("the order"), db("its payment"),
          ("provider: cancel the payment, read-back included (PROVIDER_TIMEOUT in all)", provider),
          db("record it cancelled"), ("redis: announce the cancel", redis),
          db("the order again (no wait after the provider)")]),
        ("POST /orders/{id}/cancel, another cancel of it in flight",
         [("redis: the user's database rate", redis), db("the order"), ("redis: announce the cancel", redis), db("the order again"),
          ("redis: the ledger entry", redis),
          ("wait for the other cancel (OTHER_ATTEMPT_WAIT)", other_cancel), db("the order, last look")]),
        ("POST /orders/{id}/cancel, a sale Redis does not hold",
         [("redis: the user's database rate", redis), db("the order"), ("redis: announce the cancel", redis), db("the sale"),
          db("the cancel's database function"), db("the order again")]),
        ("POST /payments/webhook, a concurrent delivery decided first",
         [db("the event"), db("the transaction: begin, payment, order, paid, succeeded, event, "
                              "rollback", 7), db("the event again")]),
        ("GET /activities/{id}/orders/me",
         [("redis: the bucket count", redis), ("redis: the ledger entry", redis),
          ("redis: the draw pool entry", redis), ("redis: the user's database rate", redis), db("the latest order")]),
        ("GET /activities/{id}, Redis out of reach",
         [("redis: the view", redis), db("the highest sale id"), db("the sale")]),
        ("GET /health/deep (the three asked at once)",
         [("redis, database and queue at once (DEEP_CHECK_TIMEOUT)", deep)]),
    ]


def budget_margin(timeout: float) -> float:
    return max(MIN_MARGIN_SECS, MIN_MARGIN_FRACTION * timeout)


def check_time_budgets(t: Template) -> None:
    """The worst path of the entry and of the consumer ends, with margin, before its Timeout."""
    for name, fn in t.functions():
        timeout = t.number(t.prop(fn, "Timeout")) or 3.0
        try:
            paths = budget_paths(t, name, fn)
        except ValueError as e:
            check(False, f"{name}: time budget -- {e}")
            continue
        for path, steps in paths:
            total = sum(v for _, v in steps)
            margin = timeout - total
            check(margin >= budget_margin(timeout),
                  f"{name}: time budget of {path}: {total:g} s + margin {margin:g} s (at least "
                  f"{budget_margin(timeout):g}) <= Timeout {timeout:g} s")


def check_role_connection_limits(t: Template) -> None:
    """Each function's role may open what the function's reserved executions can hold
    (reservation x DB_MAX_CONNECTIONS), plus ROLE_CONNECTION_HEADROOM, and not much more. The
    reservations are the parameters' defaults, which the migration was written for: a
    deployment that overrides them carries a migration of its own for the limits (the roles are
    the database's, not the stack's)."""
    defaults = config_defaults()
    bounds = role_bounds()
    t = t.with_params(**{k: v.get("Default") for k, v in t.doc.get("Parameters", {}).items()})
    for name, fn in t.functions():
        role = DB_ROLE_OF_BINARY.get(t.binary(fn))
        reserved = t.reserved(fn)
        if role is None or reserved is None:
            continue
        pool = setting(t, fn, defaults, "DB_MAX_CONNECTIONS")
        need = reserved * (pool or 0)
        limit = bounds.get(role, {}).get("limit")
        check(limit is not None and need + ROLE_CONNECTION_HEADROOM <= limit <= need + 2 * ROLE_CONNECTION_HEADROOM,
              f"{name}: {role}'s connection limit {limit} is reservation {reserved:g} x DB_MAX_CONNECTIONS "
              f"{num(pool)} = {need:g} + {ROLE_CONNECTION_HEADROOM}..{2 * ROLE_CONNECTION_HEADROOM}")


def step_kind(what: str) -> str:
    """A step's kind: the word before its first colon (redis, sqs, db, provider), or itself."""
    return what.split(":")[0].split(" (")[0] if ":" in what else what.split(" (")[0]


def print_budgets(t: Template) -> None:
    """The time budgets as docs/capacity.md's tables: every path in one line each, then each
    path's steps."""
    rows, details = [], []
    for name, fn in t.functions():
        timeout = t.number(t.prop(fn, "Timeout")) or 3.0
        for path, steps in budget_paths(t, name, fn):
            total = sum(v for _, v in steps)
            groups: dict[tuple[str, float], int] = {}
            for what, v in steps:
                key = (step_kind(what.removeprefix("batch write: ").removeprefix("message: ")), v)
                groups[key] = groups.get(key, 0) + 1
            formula = " + ".join(f"{n} × {kind} {v:g}" if n > 1 else f"{kind} {v:g}"
                                 for (kind, v), n in groups.items())
            rows.append(f"| `{t.binary(fn)}` | {path} | {formula} | {total:g} | {timeout:g} | {timeout - total:g} |")
            details.append(f"\n**`{t.binary(fn)}`: {path}**\n\n| step | bound (s) |\n|---|---:|")
            details += [f"| {what} | {v:g} |" for what, v in steps]
            details.append(f"| **sum** / Timeout / margin | **{total:g}** / {timeout:g} / {timeout - total:g} |")
    print("| function | path | steps (s) | sum (s) | Timeout (s) | margin (s) |\n|---|---|---|---:|---:|---:|")
    print("\n".join(rows))
    print("\n".join(details))
