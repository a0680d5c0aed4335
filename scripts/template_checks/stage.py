"""The HTTP API's stage (throttling from parameters, a JSON access log) and the log groups, each
function's masking the secrets a log line must never show."""

from __future__ import annotations

import json
import re

from .model import Template, param_ref, sub_text, target_of
from .report import check


# What each function's log group must mask if a line ever carries it: one sample of each secret
# the functions handle, as it would appear in a log line.
SECRET_SAMPLES = {
    "a bearer token (JWT)": "authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlMTIzNDU2",
    "a live API key": "api_key=sk_live_51HqLyjWDarjtT1zdp7dc",
    "a restricted API key": "rk_live_51HqLyjWDarjtT1zdp7dcAAA",
    "a test API key": "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "a webhook secret": "PAYMENT_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIK2LWhFK",
    "a PaymentIntent's client secret": '"client_secret":"pi_3MtwBwLkdIwHu7ix28a3tqPa_secret_YrKJUKribcBjcG8HVhfZluoGH"',
    "the origin secret": '"x-origin-verify":"Qm9yZGVyQ29sbGllMTIzNDU2Nzg5MGFiY2RlZg"',
    "a password in a database URL": "postgres://seckill_entry:Zm9vYmFyYmF6cXV4MTIz@proxy.local:5432/seckill",
    "a token in a Redis URL": "rediss://seckill-loader:c2VjcmV0dG9rZW4xMjM0NTY3@cfg.cache.amazonaws.com:6379",
}
# CloudWatch Logs' custom data identifiers: at most 10, a name of letters, digits, _ and -, a
# regex of at most 200 characters from this set (no parentheses, no colon).
MAX_CUSTOM_IDENTIFIERS = 10
IDENTIFIER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
IDENTIFIER_REGEX = re.compile(r"^[A-Za-z0-9_#=@/;, ^$?\[\]{}|\\*+.-]{1,200}$")

# The access log must carry these (key -> the context variable).
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "routeKey": "$context.routeKey",
    "status": "$context.status",
    "latency": "$context.responseLatency",
}


def check_stage(t: Template) -> None:
    for name, api in t.of_type("AWS::Serverless::HttpApi"):
        props = api.get("Properties", {})
        stage = props.get("DefaultRouteSettings") or {}
        refs = {k: param_ref(t, stage.get(k)) for k in ("ThrottlingRateLimit", "ThrottlingBurstLimit")}
        values = {k: t.number(stage.get(k)) for k in refs}
        check(all(refs.values()) and all(v is not None and v >= 1 for v in values.values()),
              f"{name}: stage throttling (DefaultRouteSettings rate and burst) from parameters {refs}, values {values}")
        logs = props.get("AccessLogSettings") or {}
        dest = target_of(logs.get("DestinationArn"))
        problems = []
        if t.resources.get(dest, {}).get("Type") != "AWS::Logs::LogGroup":
            problems.append(f"DestinationArn is not a log group of the stack ({logs.get('DestinationArn')!r})")
        try:
            fmt = json.loads(str(logs.get("Format")))
        except ValueError:
            fmt = None
            problems.append("Format is not one JSON object")
        if isinstance(fmt, dict):
            problems += [f"{k} is not {v}" for k, v in ACCESS_LOG_FIELDS.items() if fmt.get(k) != v]
            leaks = [k for k, v in fmt.items() if re.search(r"authorization|\$request\.header", f"{k} {v}", re.I)]
            if leaks:
                problems.append(f"logs request headers / Authorization: {leaks}")
        check(not problems, f"{name}: JSON access log to a stack log group with {sorted(ACCESS_LOG_FIELDS)}, "
              "no Authorization header" + (f" -- {problems}" if problems else ""))


def check_log_groups(t: Template) -> None:
    retention = "LogRetentionDays"
    check(retention in t.params, f"parameter {retention} exists")
    for name, group in t.of_type("AWS::Logs::LogGroup"):
        days = group.get("Properties", {}).get("RetentionInDays")
        check(param_ref(t, days) == retention,
              f"{name}: log group retention RetentionInDays from {retention} (got {days!r})")
    seen: dict[str, str] = {}
    for name, fn in t.functions():
        config = {**(t.globals.get("LoggingConfig") or {}), **(fn.get("Properties", {}).get("LoggingConfig") or {})}
        group_id = target_of(config.get("LogGroup"))
        group = t.resources.get(group_id, {})
        group_name = sub_text(group.get("Properties", {}).get("LogGroupName"))
        ok = (group.get("Type") == "AWS::Logs::LogGroup" and t.active(group)
              and group_name.startswith("/aws/lambda/") and group_id not in seen and config.get("LogFormat") == "JSON")
        check(ok, f"{name}: writes JSON to its own log group /aws/lambda/... (LoggingConfig.LogGroup {group_id}"
              f" {group_name!r}{', shared with ' + seen[group_id] if group_id in seen else ''})")
        if group_id:
            seen.setdefault(group_id, name)
        level = config.get("ApplicationLogLevel")
        check(param_ref(t, level) == "LogLevel",
              f"{name}: logs at Lambda's ApplicationLogLevel from LogLevel, which the function reads as "
              f"AWS_LAMBDA_LOG_LEVEL (got {level!r})")


def masked_identifiers(policy: dict) -> tuple[dict[str, str], list[str]]:
    """(custom identifier name -> regex, problems) of a log group's DataProtectionPolicy: one
    audit and one mask statement naming the same identifiers, each custom one well formed."""
    problems = []
    custom = {c.get("Name"): c.get("Regex") for c in
              ((policy.get("Configuration") or {}).get("CustomDataIdentifier") or [])}
    if len(custom) > MAX_CUSTOM_IDENTIFIERS:
        problems.append(f"{len(custom)} custom identifiers, at most {MAX_CUSTOM_IDENTIFIERS}")
    for name, regex in custom.items():
        if not IDENTIFIER_NAME.match(str(name)) or not IDENTIFIER_REGEX.match(str(regex)):
            problems.append(f"custom identifier {name}: name or regex outside what CloudWatch Logs takes")
    statements = policy.get("Statement") or []
    ops = {next(iter(st.get("Operation") or {}), None): st.get("DataIdentifier") for st in statements}
    if set(ops) != {"Audit", "Deidentify"} or len(statements) != 2:
        problems.append(f"statements {sorted(map(str, ops))}, not one Audit and one Deidentify")
    elif sorted(ops["Audit"] or []) != sorted(ops["Deidentify"] or []):
        problems.append("the Audit and Deidentify statements name different identifiers")
    masked = set(ops.get("Deidentify") or [])
    if "Deidentify" in ops and (next(s for s in statements if "Deidentify" in s["Operation"])
                                ["Operation"]["Deidentify"].get("MaskConfig") is None):
        problems.append("Deidentify has no MaskConfig")
    return {n: r for n, r in custom.items() if n in masked}, problems


def check_log_protection(t: Template) -> None:
    """Every function's log group masks each secret the functions handle (a sample of each must
    match one of its masked custom identifiers), with a policy CloudWatch Logs accepts."""
    for name, fn in t.functions():
        config = {**(t.globals.get("LoggingConfig") or {}), **(fn.get("Properties", {}).get("LoggingConfig") or {})}
        group_id = target_of(config.get("LogGroup"))
        if group_id not in t.resources:
            continue  # no log group of its own: check_log_groups says so
        policy = t.resources[group_id].get("Properties", {}).get("DataProtectionPolicy") or {}
        regexes, problems = masked_identifiers(policy)
        for what, sample in SECRET_SAMPLES.items():
            if not any(re.search(r, sample) for r in regexes.values() if isinstance(r, str)):
                problems.append(f"{what} is not masked")
        check(bool(policy) and not problems,
              f"{name}: its log group {group_id} masks bearer tokens, API keys, webhook, client and origin "
              f"secrets, URL passwords" + (f" -- {problems}" if problems else "" if policy else " -- no DataProtectionPolicy"))
