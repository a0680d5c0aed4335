"""The operations dashboard: the widgets it must hold, and only metrics the Rust code emits."""

from __future__ import annotations

import json
import re

from .model import REPO, Template, sub_text
from .report import check


# What the entry function counts (EMF, namespace Seckill, dimension Function).
ENTRY_ACCEPTED = ("Accepted", "Queued", "Compensations")
ENTRY_REFUSALS = ("RejectedSoldOutCached", "RejectedUnavailable", "RejectedNotFound", "RejectedNotStarted",
                  "RejectedEnded", "RejectedQuantityExceedsLimit", "RejectedSoldOut", "RejectedAlreadyPurchased",
                  "RejectedExpired", "RejectedRateLimited", "BreakerOpens")


def seckill(function: str, *metrics: str) -> list:
    return [("Seckill", m, {"Function": function}, None) for m in metrics]


# (what the widget shows, the metrics one widget must hold: namespace, name, dimensions, stat)
DASHBOARD_WIDGETS = [
    ("purchases accepted", seckill("seckill-entry", *ENTRY_ACCEPTED)),
    ("purchases refused by reason", seckill("seckill-entry", *ENTRY_REFUSALS)),
    ("entry p99", [("AWS/Lambda", "Duration", {"FunctionName": "${SeckillEntryFunction}"}, "p99"),
                   ("AWS/ApiGateway", "Latency", {"ApiId": "${HttpApi}"}, "p99")]),
    ("order queue depth and age",
     [("AWS/SQS", "ApproximateNumberOfMessagesVisible", {"QueueName": "${OrderQueue.QueueName}"}, None),
      ("AWS/SQS", "ApproximateAgeOfOldestMessage", {"QueueName": "${OrderQueue.QueueName}"}, None)]),
    ("dead-letter queue depth",
     [("AWS/SQS", "ApproximateNumberOfMessagesVisible", {"QueueName": "${OrderDeadLetterQueue.QueueName}"}, None)]),
    ("reconcile", seckill("reconcile", "Drift", "Repairs", "ReleasedUnpaid")),
    ("order consumer", seckill("order-consumer", "Committed", "Failed", "Retried")),
]
# Where the EMF names are written: the library and every function's sources.
RUST_SOURCE_DIRS = ("shared/src", "functions/*/src")


def rust_literals() -> set[str]:
    found = set()
    for pattern in RUST_SOURCE_DIRS:
        for d in REPO.glob(pattern):
            for rs in d.glob("**/*.rs"):
                found |= set(re.findall(r'"([A-Za-z][A-Za-z0-9_-]*)"', rs.read_text()))
    return found


def dashboard_metrics(body: dict) -> list[tuple[int, str, str, dict, str | None]]:
    """(widget index, namespace, name, dimensions, stat) of every metric of every widget."""
    out = []
    for i, w in enumerate(body.get("widgets") or []):
        props = w.get("properties") or {}
        for m in props.get("metrics") or []:
            opts = m[-1] if m and isinstance(m[-1], dict) else {}
            parts = [x for x in m if not isinstance(x, dict)]
            if len(parts) < 2 or "." in parts[:2]:
                out.append((i, str(parts[0] if parts else ""), "<unreadable: use full metric arrays>", {}, None))
                continue
            dims = dict(zip(parts[2::2], parts[3::2]))
            out.append((i, parts[0], parts[1], dims, opts.get("stat") or props.get("stat")))
    return out


def check_dashboard(t: Template) -> None:
    dashboards = t.of_type("AWS::CloudWatch::Dashboard")
    check(len(dashboards) == 1, f"a CloudWatch dashboard exists ({[n for n, _ in dashboards]})")
    if not dashboards:
        return
    name, dash = dashboards[0]
    try:
        body = json.loads(sub_text(dash.get("Properties", {}).get("DashboardBody")))
    except ValueError as e:
        check(False, f"{name}: DashboardBody (a Fn::Sub) is one JSON document -- {e}")
        return
    metrics = dashboard_metrics(body)
    for what, wanted in DASHBOARD_WIDGETS:
        widgets = {i for i, *_ in metrics}
        def holds(i, ns, metric, dims, stat):
            return any(j == i and n == ns and m == metric and d == dims and (stat is None or st == stat)
                       for j, n, m, d, st in metrics)
        best = min(widgets, key=lambda i: sum(not holds(i, *w) for w in wanted), default=None)
        missing = [w[1] for w in wanted if best is None or not holds(best, *w)]
        check(not missing, f"{name}: a widget with {what} ({', '.join(w[1] for w in wanted)})"
              + (f" -- the closest lacks {missing}" if missing else ""))
    literals = rust_literals()
    named = sorted({m for _, ns, m, _, _ in metrics if ns == "Seckill"})
    for metric in named:
        check(metric in literals, f"{name}: Seckill metric {metric} is emitted by the Rust sources "
              f"(a quoted literal under {' or '.join(RUST_SOURCE_DIRS)})")
    functions = sorted({d.get("Function") for _, ns, _, d, _ in metrics if ns == "Seckill"})
    for fn in functions:
        check(fn in literals, f"{name}: Seckill dimension Function={fn} is a function name the Rust sources emit")
