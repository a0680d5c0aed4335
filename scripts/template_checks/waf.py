"""The edge's WAF web ACL: a model of the statements it uses, matched against sample requests,
and the rules, their order and their logging."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

from .model import Template, as_list, param_ref, refs_in, sub_text, target_of
from .report import check


# Requests the purchase-route scope-down must match, and must not.
PURCHASES = [("POST", "/activities/1/orders"), ("POST", "/activities/42/orders/"),
             ("POST", "//activities/1//orders"), ("POST", "/activities/1/%6Frders")]
NOT_PURCHASES = [("GET", "/activities/1/orders"), ("GET", "/activities/1/orders/me"), ("GET", "/activities/1"),
                 ("POST", "/orders/1/pay"), ("POST", "/orders/1/cancel"), ("POST", "/admin/activities"),
                 ("PUT", "/activities/1/orders")]
# What the public-view rate rule must count (what the cached /activities/* behaviour serves), and not.
PUBLIC_VIEWS = [("GET", "/activities/1"), ("HEAD", "/activities/1"), ("GET", "/activities/42/"),
                ("GET", "//activities/1"), ("GET", "/activities/%31")]
NOT_PUBLIC_VIEWS = [("GET", "/activities/1/orders/me"), ("GET", "/activities/1/orders"), ("POST", "/activities/1/orders"),
                    ("GET", "/activities/1//orders/me"), ("GET", "/activities/1/%6Frders/me"), ("POST", "/activities/1"),
                    ("GET", "/orders/1/pay"), ("GET", "/health"), ("GET", "/admin/activities/1"), ("GET", "/")]
# The bearer-shape rule: refused purchases, and requests it must let through.
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl-_"
PURCHASE = ("POST", "/activities/1/orders")
BEARER_REFUSED = [(*PURCHASE, {}), (*PURCHASE, {"Authorization": "Basic dXNlcjpwYXNz"}), (*PURCHASE, {"Authorization": JWT}),
                  (*PURCHASE, {"Authorization": "Bearer abc"}), (*PURCHASE, {"Authorization": "Bearer a.b"}),
                  (*PURCHASE, {"Authorization": "Bearer a.b.c.d"}), (*PURCHASE, {"Authorization": "Bearer a.b.c x"}),
                  (*PURCHASE, {"Authorization": "Bearer  a.b.c"}), (*PURCHASE, {"Authorization": "Bearer a+/.b.c="}),
                  ("POST", "//activities/1//orders", {}), ("POST", "/activities/1/%6Frders", {})]
BEARER_PASSED = [(*PURCHASE, {"Authorization": f"Bearer {JWT}"}), (*PURCHASE, {"Authorization": "bearer a.b.c"}),
                 ("GET", "/activities/1/orders/me", {}), ("POST", "/orders/1/pay", {}), ("POST", "/payments/webhook", {}),
                 ("GET", "/activities/1", {}), ("POST", "/admin/activities", {}), ("GET", "/health", {})]


def transform(text: str, transformations) -> str:
    for tt in sorted(as_list(transformations or []), key=lambda x: x.get("Priority", 0)):
        kind = tt.get("Type")
        if kind == "URL_DECODE":
            text = unquote(text)
        elif kind == "LOWERCASE":
            text = text.lower()
        elif kind != "NONE":
            raise ValueError(f"text transformation {kind} not modelled")
    return text


def waf_matches(stmt: dict, method: str, path: str, headers: dict | None = None) -> bool:
    """Whether a WAF statement (the subset this template uses) matches a request."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    (kind, body), = stmt.items()
    if kind == "AndStatement":
        return all(waf_matches(s, method, path, headers) for s in body["Statements"])
    if kind == "OrStatement":
        return any(waf_matches(s, method, path, headers) for s in body["Statements"])
    if kind == "NotStatement":
        return not waf_matches(body["Statement"], method, path, headers)
    field = body.get("FieldToMatch") or {}
    if set(field) == {"Method"}:
        text = method
    elif set(field) == {"UriPath"}:
        text = path
    elif set(field) == {"SingleHeader"}:
        name = str(field["SingleHeader"].get("Name", "")).lower()
        if name not in headers:
            return False  # a missing header matches no statement
        text = headers[name]
    else:
        raise ValueError(f"field {field} not modelled")
    text = transform(text, body.get("TextTransformations"))
    if kind == "RegexMatchStatement":
        return re.search(body["RegexString"], text) is not None
    if kind == "ByteMatchStatement":
        needle, how = str(body.get("SearchString")), body.get("PositionalConstraint")
        return {"EXACTLY": text == needle, "STARTS_WITH": text.startswith(needle),
                "ENDS_WITH": text.endswith(needle), "CONTAINS": needle in text}[how]
    raise ValueError(f"statement {kind} not modelled")


def scope_matches(stmt, matching: list, not_matching: list) -> tuple[bool, str]:
    """Whether a statement matches every request of one list and none of the other."""
    if not isinstance(stmt, dict) or not stmt:
        return False, "no scope-down"
    try:
        missed = [r for r in matching if not waf_matches(stmt, *r)]
        extra = [r for r in not_matching if waf_matches(stmt, *r)]
    except (ValueError, KeyError) as e:
        return False, str(e)
    return not missed and not extra, (f"misses {missed} " if missed else "") + (f"also matches {extra}" if extra else "")


def is_purchase_scope(stmt) -> tuple[bool, str]:
    return scope_matches(stmt, PURCHASES, NOT_PURCHASES)


def waf_regex_problems(regex: str) -> list[str]:
    """What AWS WAF's PCRE subset refuses ("Supported regular expression syntax in AWS WAF"):
    capturing groups and backreferences, atomic groups, possessive quantifiers, \\C \\R \\K."""
    problems = []
    try:
        re.compile(regex)
    except re.error as e:
        problems.append(f"not a regex: {e}")
    atoms = re.sub(r"\[(?:\\.|[^\]\\])*\]", "x", re.sub(r"\\[^0-9CRK]", "x", regex))
    if re.search(r"\((?!\?(?::|=|!|<=|<!))", atoms):
        problems.append("a capturing group")
    if re.search(r"\\[1-9]", atoms):
        problems.append("a backreference")
    if re.search(r"\\[CRK]", atoms):
        problems.append("\\C, \\R or \\K")
    if "(?>" in atoms:
        problems.append("an atomic group")
    if re.search(r"[*+?}]\+", atoms):
        problems.append("a possessive quantifier")
    if len(regex) > 512:
        problems.append("longer than 512 characters")
    return problems


def regexes_in(value) -> list[str]:
    if isinstance(value, dict):
        found = [value["RegexString"]] if isinstance(value.get("RegexString"), str) else []
        for v in value.values():
            found += regexes_in(v)
        return found
    if isinstance(value, list):
        return [r for v in value for r in regexes_in(v)]
    return []


def managed(rule: dict) -> str | None:
    stmt = (rule.get("Statement") or {}).get("ManagedRuleGroupStatement") or {}
    return stmt.get("Name") if stmt.get("VendorName") == "AWS" else None


def web_acl_rules(t: Template, acl: str) -> list[dict]:
    return t.evaluate(t.resources[acl].get("Properties", {}).get("Rules") or [])


def custom_block(rule: dict) -> dict:
    return ((rule.get("Action") or {}).get("Block") or {}).get("CustomResponse") or {}


def check_web_acl(t: Template, acl: str) -> None:
    props = t.evaluate(t.resources[acl].get("Properties", {}))
    check(props.get("Scope") == "CLOUDFRONT" and "Allow" in (props.get("DefaultAction") or {}),
          f"{acl}: Scope CLOUDFRONT, default action Allow")
    rules = web_acl_rules(t, acl)
    bodies = props.get("CustomResponseBodies") or {}
    rates = [(r, r["Statement"]["RateBasedStatement"]) for r in rules if "RateBasedStatement" in (r.get("Statement") or {})]
    ip = [(r, s) for r, s in rates if s.get("AggregateKeyType") == "IP" and not s.get("ScopeDownStatement")]
    check(len(ip) == 1 and "Block" in (ip[0][0].get("Action") or {}) and param_ref(t, ip[0][1].get("Limit")),
          f"{acl}: a rate-based rule per IP (AggregateKeyType IP, all requests, Block, Limit from a parameter)")
    views = [(r, s) for r, s in rates if s.get("AggregateKeyType") == "IP" and s.get("ScopeDownStatement")]
    ok, why = scope_matches(views[0][1].get("ScopeDownStatement") if views else None, PUBLIC_VIEWS, NOT_PUBLIC_VIEWS)
    check(len(views) == 1 and ok and param_ref(t, views[0][1].get("Limit")) == "EdgePublicViewIpRateLimit"
          and custom_block(views[0][0]).get("ResponseCode") == 429,
          f"{acl}: a rate-based rule per IP on the public view only (GET/HEAD /activities/* but not .../orders*), "
          f"Limit EdgePublicViewIpRateLimit, 429 {why}")
    keyed = [(r, s) for r, s in rates if s.get("AggregateKeyType") == "CUSTOM_KEYS"]
    want = [{"Header": {"Name": "authorization", "TextTransformations": [{"Priority": 0, "Type": "NONE"}]}}]
    on_auth = [(r, s) for r, s in keyed if s.get("CustomKeys") == want]
    check(len(on_auth) == 1 and "Block" in (on_auth[0][0].get("Action") or {}) and param_ref(t, on_auth[0][1].get("Limit")),
          f"{acl}: a rate-based rule per Authorization header (CUSTOM_KEYS: Header authorization, TextTransformations "
          f"NONE; Block; Limit from a parameter) (custom-key rules: {[s.get('CustomKeys') for _, s in keyed]})")
    if keyed:
        ok, why = is_purchase_scope(keyed[0][1].get("ScopeDownStatement"))
        check(ok, f"{acl}: the per-token rate rule is scoped down to the purchase route POST /activities/{{id}}/orders {why}")
    # The bearer-shape rule: 401 with the API's JSON, on purchases without a bearer JWT only.
    bearer = [r for r in rules if custom_block(r).get("ResponseCode") == 401]
    body = bodies.get(custom_block(bearer[0]).get("CustomResponseBodyKey"), {}) if bearer else {}
    try:
        shaped = json.loads(str(body.get("Content")))
        shaped = body.get("ContentType") == "APPLICATION_JSON" and shaped.get("error") == "unauthorized" and bool(shaped.get("message"))
    except (ValueError, AttributeError):
        shaped = False
    ok, why = scope_matches(bearer[0].get("Statement") if bearer else None, BEARER_REFUSED, BEARER_PASSED)
    check(len(bearer) == 1 and shaped and ok,
          f"{acl}: a bearer JWT rule answers 401 {{\"error\":\"unauthorized\",\"message\":...}} (JSON) to POST "
          f"/activities/{{id}}/orders whose Authorization is not 'Bearer <jwt>', and to nothing else {why}")
    # Cheapest first: per-IP rates, the token shape, the per-token rate, then the managed groups
    # (among the rules found here; a missing one is the other checks' to report).
    order = {r.get("Name"): r.get("Priority") for r in rules}
    prio = [r.get("Priority") for r in rules]
    ours = [r.get("Priority") for r in rules if not managed(r)]
    groups = [r.get("Priority") for r in rules if managed(r)]
    bot = [r.get("Priority") for r in rules if managed(r) == "AWSManagedRulesBotControlRuleSet"]
    stages = [[r.get("Priority") for r, _ in ip + views], [r.get("Priority") for r in bearer],
              [r.get("Priority") for r, _ in on_auth]]
    stages = [st for st in stages if st]
    ranked = (len(set(prio)) == len(prio) and max(ours, default=-1) < min(groups, default=10**6)
              and all(b == max(prio) for b in bot) and all(max(a) < min(b) for a, b in zip(stages, stages[1:])))
    check(ranked, f"{acl}: rule priorities unique and cheapest first (per-IP rates, the bearer JWT shape, the per-token "
          f"rate, then the managed groups, Bot Control last) (got {order})")
    bad = {rx: p for rx in regexes_in(rules) if (p := waf_regex_problems(rx))}
    check(not bad, f"{acl}: every RegexString is one AWS WAF accepts (PCRE without capturing groups, backreferences, "
          f"atomic groups or possessive quantifiers) (not: {bad})")
    for group in ("AWSManagedRulesCommonRuleSet", "AWSManagedRulesKnownBadInputsRuleSet"):
        found = [r for r in rules if managed(r) == group]
        check(len(found) == 1 and found[0].get("OverrideAction") == {"None": {}},
              f"{acl}: AWS managed rule group {group}, enforcing (OverrideAction None)")
    bot_group = "AWSManagedRulesBotControlRuleSet"
    param = "EdgeBotControl"
    check(str(t.doc.get("Parameters", {}).get(param, {}).get("Default")) == "off",
          f"parameter {param} exists and defaults to off (Bot Control is paid)")
    for value in ("off", "on"):
        found = [r for r in web_acl_rules(t.with_params(**{param: value}), acl) if managed(r) == bot_group]
        if value == "off":
            check(not found, f"{acl}: Bot Control ({bot_group}) absent with {param}=off")
        else:
            ok, why = is_purchase_scope((found[0]["Statement"]["ManagedRuleGroupStatement"].get("ScopeDownStatement")
                                         if found else None))
            check(len(found) == 1 and found[0].get("OverrideAction") == {"None": {}} and ok,
                  f"{acl}: Bot Control ({bot_group}) with {param}=on, enforcing, scoped down to the purchase route {why}")
    check_webhook_sources(t, acl)
    check_waf_logging(t, acl)


def check_webhook_sources(t: Template, acl: str) -> None:
    """With EdgeWebhookSourceIps set, one rule blocks POST /payments/webhook from any address
    outside the provider's IP set (IPV4, the parameter's addresses); empty, no such rule."""
    param = "EdgeWebhookSourceIps"
    check(str(t.doc.get("Parameters", {}).get(param, {}).get("Default")) == "",
          f"parameter {param} exists and defaults to empty (no rule)")

    def webhook_rules(tt: Template) -> list[dict]:
        return [r for r in web_acl_rules(tt, acl)
                if "webhook" in json.dumps((r.get("Statement") or {})).lower()]

    check(not webhook_rules(t.with_params(**{param: ""})), f"{acl}: no webhook rule with {param} empty")
    on = t.with_params(**{param: "3.18.12.63/32,3.130.192.231/32"})
    found = webhook_rules(on)
    stmts = ((found[0].get("Statement") or {}).get("AndStatement") or {}).get("Statements") if found else []
    path = [s.get("ByteMatchStatement") for s in stmts or [] if "ByteMatchStatement" in s]
    outside = [s.get("NotStatement", {}).get("Statement", {}).get("IPSetReferenceStatement")
               for s in stmts or [] if "NotStatement" in s]
    ok = (len(found) == 1 and "Block" in (found[0].get("Action") or {})
          and len(path) == 1 and path[0].get("SearchString") == "/payments/webhook"
          and path[0].get("PositionalConstraint") == "EXACTLY" and "UriPath" in (path[0].get("FieldToMatch") or {})
          and len(outside) == 1 and outside[0] is not None)
    check(ok, f"{acl}: with {param} set, one rule blocks /payments/webhook (UriPath EXACTLY) from addresses "
              f"outside an IP set")
    sets = [r for r in on.resources.values() if r.get("Type") == "AWS::WAFv2::IPSet"]
    props = [on.evaluate(r.get("Properties", {})) for r in sets]
    check(len(props) == 1 and props[0].get("Scope") == "CLOUDFRONT" and props[0].get("IPAddressVersion") == "IPV4"
          and param_ref(on, sets[0].get("Properties", {}).get("Addresses")) == param,
          f"an AWS::WAFv2::IPSet (CLOUDFRONT, IPV4) of {param}'s addresses")


def check_waf_logging(t: Template, acl: str) -> None:
    """WAF logs to a stack log group named aws-waf-logs-..., the Authorization header redacted."""
    configs = [(n, t.evaluate(r.get("Properties", {}))) for n, r in t.of_type("AWS::WAFv2::LoggingConfiguration")
               if target_of(r.get("Properties", {}).get("ResourceArn")) == acl]
    check(len(configs) == 1, f"{acl}: one WAF logging configuration ({[n for n, _ in configs]})")
    if not configs:
        return
    name, conf = configs[0]
    dests = as_list(conf.get("LogDestinationConfigs") or [])
    groups = [g for d in dests for g in refs_in(d) if t.resources.get(g, {}).get("Type") == "AWS::Logs::LogGroup"]
    group_name = sub_text(t.resources.get(groups[0], {}).get("Properties", {}).get("LogGroupName")) if groups else ""
    check(len(dests) == 1 and len(groups) == 1 and group_name.startswith("aws-waf-logs-")
          and not sub_text(dests[0]).endswith(":*"),
          f"{name}: WAF logs to a stack log group named aws-waf-logs-... by its ARN (no :* suffix) (got {dests}, {group_name!r})")
    redacted = [str((f.get("SingleHeader") or {}).get("Name", "")).lower() for f in conf.get("RedactedFields") or []]
    check("authorization" in redacted, f"{name}: WAF logs redact the authorization header (RedactedFields {redacted})")
