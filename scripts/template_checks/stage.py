"""The HTTP API's stage (throttling from parameters, a JSON access log) and the log groups."""

from __future__ import annotations

import json
import re

from .model import Template, param_ref, sub_text, target_of
from .report import check


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
