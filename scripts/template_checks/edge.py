"""The edge (CloudFront + WAF, EdgeProtection=on): the parameter Rules, the distribution's
behaviours, viewer TLS, security headers, access log and the storefront bucket."""

from __future__ import annotations

import fnmatch
import re

from .model import (
    EDGE_ON,
    IDENTITY_GIVEN,
    SAMPLE_CERTIFICATE,
    SAMPLE_DOMAIN,
    Template,
    as_list,
    param_ref,
    refs_in,
    strings_in,
    sub_text,
    target_of,
)
from .origin_secret import api_origin
from .report import check
from .routes import JWT_AUTHORIZER, auth_of, http_api_events, shape
from .waf import check_web_acl


# Resource types only the edge creates (EdgeProtection=off must create none of them).
EDGE_TYPE_PREFIXES = ("AWS::CloudFront::", "AWS::WAFv2::", "AWS::S3::")
CACHING_DISABLED = "4135ea2d-6df8-44a3-9df3-4b5a84be39ad"
# Forwards every viewer header but Host (API Gateway answers 403 to the viewer's Host). With
# caching off it is how Authorization reaches the origin: an origin request policy cannot list
# Authorization on its own.
ALL_VIEWER_EXCEPT_HOST = "b689b0a8-53d0-40ab-baf2-68738e2966ac"
# The 4xx/5xx codes CloudFront caches (10 s by default).
CACHED_ERROR_CODES = (400, 403, 404, 405, 414, 500, 501, 502, 503, 504)
PUBLIC_VIEW = ("GET", "/activities/{}")
# Security policies that hold viewers to TLS 1.2 or later.
TLS12_POLICIES = {"TLSv1.2_2018", "TLSv1.2_2019", "TLSv1.2_2021", "TLSv1.2_2025", "TLSv1.3_2025"}

# Paths the per-user behaviours must cover beyond the template's own routes.
PER_USER_SAMPLES = [("POST", "/activities/1/orders"), ("GET", "/activities/1/orders/me"), ("POST", "/orders/1/pay"),
                    ("POST", "/orders/1/cancel"), ("GET", "/admin/activities"), ("GET", "/admin/activities/1"),
                    ("PUT", "/admin/activities/1"), ("POST", "/admin/activities")]
# The security headers every answer of the edge carries.
MIN_HSTS_SECS = 31536000
CSP = {"default-src": ["'self'"], "img-src": ["'self'", "data:"], "style-src": ["'self'"], "script-src": ["'self'"],
       "connect-src": ["'self'"], "frame-ancestors": ["'none'"]}
# With payments on (PaymentSecretArn: Stripe) the page confirms payments with Stripe.js: what
# Stripe documents it needs besides, and nothing else.
CSP_STRIPE = {**CSP, "script-src": ["'self'", "https://js.stripe.com"], "connect-src": ["'self'", "https://api.stripe.com"],
              "frame-src": ["https://js.stripe.com", "https://hooks.stripe.com"]}
SAMPLE_PAYMENT_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:seckill/payments-AbCdEf"
STOREFRONT_ORIGIN_TYPES = ("s3",)


# ---------------------------------------------------------------- the parameter Rules


def check_rules(t: Template) -> None:
    """The Rules refuse the edge without a domain and certificate, and the storefront without the
    edge; the defaults and a complete edge pass; the certificate must come from us-east-1. Each
    case names an issuer (IDENTITY_GIVEN): without one the issuer's own Rule refuses every
    deploy (identity.check_issuer_rules)."""
    cert = SAMPLE_CERTIFICATE
    given = IDENTITY_GIVEN
    check(not t.refusals(**given), f"Rules: the default parameters with an issuer pass every Rule "
          f"(refused by {t.refusals(**given)})")
    for what, params in (("EdgeDomainName", {"EdgeProtection": "on", "EdgeCertificateArn": cert}),
                         ("EdgeCertificateArn", {"EdgeProtection": "on", "EdgeDomainName": SAMPLE_DOMAIN})):
        check(bool(t.refusals(**given, **params)), f"Rules: EdgeProtection=on is refused without {what}")
    check(not t.refusals(**given, **EDGE_ON), f"Rules: EdgeProtection=on with a domain and a us-east-1 certificate passes "
          f"(refused by {t.refusals(**given, **EDGE_ON)})")
    check(bool(t.refusals(**given, Storefront="true")), "Rules: Storefront=true is refused without EdgeProtection=on")
    check(not t.refusals(**given, Storefront="true", **EDGE_ON),
          f"Rules: Storefront=true with the edge on passes (refused by {t.refusals(**given, Storefront='true', **EDGE_ON)})")
    pattern = str(t.doc.get("Parameters", {}).get("EdgeCertificateArn", {}).get("AllowedPattern"))
    elsewhere = cert.replace("us-east-1", "eu-west-1")
    ok = all(bool(re.fullmatch(pattern, v)) == want for v, want in (("", True), (cert, True), (elsewhere, False)))
    check(ok, f"parameter EdgeCertificateArn: AllowedPattern takes an ACM certificate in us-east-1 only (or empty) ({pattern})")


# ---------------------------------------------------------------- the distribution


def behaviour_for(config: dict, path: str) -> tuple[str, dict]:
    """The cache behaviour CloudFront picks for a path: the first PathPattern that matches, in
    order (`*` matches any characters, `/` included), else the default."""
    for b in config.get("CacheBehaviors") or []:
        if fnmatch.fnmatchcase(path, b.get("PathPattern", "")):
            return b["PathPattern"], b
    return "default", config.get("DefaultCacheBehavior") or {}


def api_routes(t: Template) -> dict[tuple[str, str], tuple[str, str]]:
    """(METHOD, path with "1" for each parameter) -> (the route's path, its authorizer)."""
    out = {}
    for _, _, ev in http_api_events(t):
        route = str(ev.get("Path"))
        out[(str(ev.get("Method")).upper(), re.sub(r"\{[^}]+\}", "1", route))] = (route, auth_of(t, ev))
    return out


def check_public_view_behaviour(t: Template, where: str, b: dict, api_id: str) -> None:
    policy = t.resources.get(target_of(b.get("CachePolicyId")), {})
    conf = t.evaluate(policy.get("Properties", {}).get("CachePolicyConfig") or {})
    key = conf.get("ParametersInCacheKeyAndForwardedToOrigin") or {}
    headers = key.get("HeadersConfig") or {}
    problems = []
    if policy.get("Type") != "AWS::CloudFront::CachePolicy":
        problems.append(f"cache policy {b.get('CachePolicyId')!r} is not the stack's")
    if t.number(conf.get("MinTTL")) != 0 or (t.number(conf.get("MaxTTL")) or 0) > 1 or (t.number(conf.get("DefaultTTL")) or 0) > 1:
        problems.append(f"TTLs min {conf.get('MinTTL')} default {conf.get('DefaultTTL')} max {conf.get('MaxTTL')}")
    if headers.get("HeaderBehavior") != "none" and "authorization" in [str(h).lower() for h in headers.get("Headers") or []]:
        problems.append("Authorization in the cache key")
    if headers.get("HeaderBehavior") not in ("none", "whitelist"):
        problems.append(f"HeaderBehavior {headers.get('HeaderBehavior')}")
    if (key.get("CookiesConfig") or {}).get("CookieBehavior") != "none" or (key.get("QueryStringsConfig") or {}).get("QueryStringBehavior") != "none":
        problems.append("cookies or query strings in the cache key")
    if set(b.get("AllowedMethods") or ["GET", "HEAD"]) - {"GET", "HEAD", "OPTIONS"}:
        problems.append(f"allows {b.get('AllowedMethods')}")
    if b.get("OriginRequestPolicyId"):
        problems.append("forwards viewer values beyond the cache key")
    if b.get("TargetOriginId") != api_id:
        problems.append(f"goes to origin {b.get('TargetOriginId')!r}")
    check(not problems, f"GET /activities/{{activityId}} ({where}): the public view from the HTTP API, cached at most 1 s "
          "by the stack's policy, nothing of the viewer in the key" + (f" -- {problems}" if problems else ""))


def refusing_function(t: Template, b: dict) -> str | None:
    """The stack's CloudFront Function a behaviour runs on viewer requests, if it only ever
    answers itself (returns a response with a status code and never the request)."""
    for assoc in b.get("FunctionAssociations") or []:
        fn = target_of(assoc.get("FunctionARN"))
        res = t.resources.get(fn, {})
        code = str(res.get("Properties", {}).get("FunctionCode") or "")
        if (assoc.get("EventType") == "viewer-request" and res.get("Type") == "AWS::CloudFront::Function"
                and t.active(res) and "statusCode" in code and "event.request" not in code):
            return fn
    return None


def check_behaviours(t: Template, dist: str, config: dict, api_id: str, storefront: bool) -> None:
    default = config.get("DefaultCacheBehavior") or {}
    if not storefront:
        check(default.get("CachePolicyId") == CACHING_DISABLED and default.get("OriginRequestPolicyId") == ALL_VIEWER_EXCEPT_HOST
              and default.get("TargetOriginId") == api_id,
              f"{dist}: default behaviour to the HTTP API, never cached (CachingDisabled) and Authorization forwarded "
              "(AllViewerExceptHostHeader)")
    for b in [default] + list(config.get("CacheBehaviors") or []):
        writes = sorted(set(b.get("AllowedMethods") or []) & {"POST", "PUT", "PATCH", "DELETE"})
        check(not writes or b.get("CachePolicyId") == CACHING_DISABLED,
              f"{dist} {b.get('PathPattern', 'default')}: never cached where it lets writes through "
              f"(allows {writes or 'no write method'})")
    routes = {k: (route, auth) for k, (route, auth) in api_routes(t).items()}
    for method, path in PER_USER_SAMPLES:
        routes.setdefault((method, path), (path, JWT_AUTHORIZER))
    for (method, path), (route, auth) in sorted(routes.items()):
        where, b = behaviour_for(config, path)
        if (method, shape(route)) == PUBLIC_VIEW and auth == "NONE":
            check_public_view_behaviour(t, where, b, api_id)
            continue
        if auth == "AWS_IAM":
            fn = refusing_function(t, b)
            check(fn is not None, f"{method} {path} ({where}): answered at the edge by a viewer-request function of the "
                  f"stack, never forwarded to the origin (the route needs SigV4) (function {fn})")
            continue
        problems = []
        if b.get("TargetOriginId") != api_id:
            problems.append(f"origin {b.get('TargetOriginId')!r}")
        if b.get("CachePolicyId") != CACHING_DISABLED:
            problems.append(f"cache policy {b.get('CachePolicyId')!r}")
        if b.get("OriginRequestPolicyId") != ALL_VIEWER_EXCEPT_HOST:
            problems.append(f"origin request policy {b.get('OriginRequestPolicyId')!r}")
        if method not in (b.get("AllowedMethods") or ["GET", "HEAD"]):
            problems.append(f"{method} not allowed ({b.get('AllowedMethods')})")
        check(not problems, f"{method} {path} ({where}): to the HTTP API, never cached (CachingDisabled), Authorization forwarded "
              "with every other viewer header but Host (AllViewerExceptHostHeader), method allowed"
              + (f" -- {problems}" if problems else ""))
    errors = {t.number(e.get("ErrorCode")): t.number(e.get("ErrorCachingMinTTL")) for e in config.get("CustomErrorResponses") or []}
    kept = [c for c in CACHED_ERROR_CODES if errors.get(c) != 0]
    check(not kept, f"{dist}: origin errors are never cached at the edge (ErrorCachingMinTTL 0; not for {kept})")


def check_viewer_tls(t: Template, dist: str, config: dict) -> None:
    """TLS 1.2 or later for viewers: an ACM certificate of our own with SNI and a TLSv1.2 policy
    (the default *.cloudfront.net certificate is always TLSv1), on EdgeDomainName."""
    vc = config.get("ViewerCertificate") or {}
    ok = (param_ref(t, vc.get("AcmCertificateArn")) == "EdgeCertificateArn" and vc.get("SslSupportMethod") == "sni-only"
          and vc.get("MinimumProtocolVersion") in TLS12_POLICIES and vc.get("CloudFrontDefaultCertificate") is not True
          and [param_ref(t, a) for a in config.get("Aliases") or []] == ["EdgeDomainName"])
    check(ok, f"{dist}: viewers get TLS >= 1.2 (ACM certificate EdgeCertificateArn, sni-only, MinimumProtocolVersion "
          f"TLSv1.2_*; alias EdgeDomainName) (got {vc}, aliases {config.get('Aliases')})")
    plain = [b.get("PathPattern", "default") for b in [config.get("DefaultCacheBehavior") or {}] + list(config.get("CacheBehaviors") or [])
             if b.get("ViewerProtocolPolicy") not in ("https-only", "redirect-to-https")]
    check(not plain, f"{dist}: every behaviour answers viewers over TLS only (https-only or redirect-to-https; not: {plain})")


def csp_directives(text: str) -> dict[str, list[str]]:
    out = {}
    for part in str(text).split(";"):
        words = part.split()
        if words:
            out[words[0].lower()] = words[1:]
    return out


def check_security_headers(t: Template, dist: str, config: dict) -> None:
    behaviours = [config.get("DefaultCacheBehavior") or {}] + list(config.get("CacheBehaviors") or [])
    policies = {target_of(b.get("ResponseHeadersPolicyId")) for b in behaviours}
    missing = [b.get("PathPattern", "default") for b in behaviours
               if t.resources.get(target_of(b.get("ResponseHeadersPolicyId")), {}).get("Type") != "AWS::CloudFront::ResponseHeadersPolicy"]
    check(not missing and len(policies) == 1,
          f"{dist}: every behaviour has the stack's response headers policy (missing: {missing}; policies {sorted(map(str, policies))})")
    for pid in sorted(p for p in policies if p in t.resources):
        conf = t.evaluate(t.resources[pid].get("Properties", {}).get("ResponseHeadersPolicyConfig") or {})
        sec = conf.get("SecurityHeadersConfig") or {}
        hsts, nosniff = sec.get("StrictTransportSecurity") or {}, sec.get("ContentTypeOptions") or {}
        frame, referrer = sec.get("FrameOptions") or {}, sec.get("ReferrerPolicy") or {}
        csp = sec.get("ContentSecurityPolicy") or {}
        problems = []
        if not ((t.number(hsts.get("AccessControlMaxAgeSec")) or 0) >= MIN_HSTS_SECS and hsts.get("IncludeSubdomains") is True):
            problems.append(f"HSTS {hsts}")
        if frame.get("FrameOption") != "DENY":
            problems.append(f"X-Frame-Options {frame}")
        if referrer.get("ReferrerPolicy") != "strict-origin-when-cross-origin":
            problems.append(f"Referrer-Policy {referrer}")
        # The policy with payments off and on, whichever the parameters chose.
        for arn, want in (("", CSP), (SAMPLE_PAYMENT_SECRET, CSP_STRIPE)):
            policy = t.with_params(PaymentSecretArn=arn).evaluate(
                t.resources[pid].get("Properties", {}).get("ResponseHeadersPolicyConfig") or {})
            text = ((policy.get("SecurityHeadersConfig") or {}).get("ContentSecurityPolicy") or {}).get("ContentSecurityPolicy")
            if csp_directives(text) != want:
                problems.append(f"CSP with PaymentSecretArn={arn!r}: {text!r}")
        if not nosniff:
            problems.append("no X-Content-Type-Options")
        weak = [k for k, v in (("HSTS", hsts), ("nosniff", nosniff), ("frame", frame), ("referrer", referrer), ("CSP", csp))
                if v and v.get("Override") is not True]
        if weak:
            problems.append(f"not overriding the origin: {weak}")
        check(not problems, f"{pid}: security headers: HSTS >= {MIN_HSTS_SECS} s with includeSubDomains, nosniff, "
              "X-Frame-Options DENY, Referrer-Policy strict-origin-when-cross-origin, the same-origin CSP (and Stripe.js's "
              "origins only with payments on)"
              + (f" -- {problems}" if problems else ""))


def bucket_problems(t: Template, bucket: str, ownership: tuple[str, ...]) -> list[str]:
    res = t.resources.get(bucket, {})
    props = t.evaluate(res.get("Properties", {}))
    problems = [] if res.get("Type") == "AWS::S3::Bucket" and t.active(res) else [f"{bucket} is not a bucket of the stack"]
    block = props.get("PublicAccessBlockConfiguration") or {}
    if not all(block.get(k) is True for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")):
        problems.append(f"public access not blocked ({block})")
    owners = [r.get("ObjectOwnership") for r in (props.get("OwnershipControls") or {}).get("Rules") or []]
    if len(owners) != 1 or owners[0] not in ownership:
        problems.append(f"ObjectOwnership {owners} (want {' or '.join(ownership)})")
    if not (props.get("BucketEncryption") or {}).get("ServerSideEncryptionConfiguration"):
        problems.append("no default encryption")
    if props.get("AccessControl") or props.get("WebsiteConfiguration"):
        problems.append("a canned ACL or a website endpoint")
    return problems


def check_access_log(t: Template, dist: str, config: dict) -> None:
    """CloudFront's standard log to a stack bucket: ACLs on (that delivery writes with them),
    nothing public, encrypted, expiring after LogRetentionDays; no cookies logged."""
    logging = config.get("Logging") or {}
    bucket = target_of(logging.get("Bucket"))
    via_domain = isinstance(logging.get("Bucket"), dict) and "DomainName" in str(logging["Bucket"].get("Fn::GetAtt"))
    check(via_domain and logging.get("IncludeCookies") is False,
          f"{dist}: standard access logging to a stack bucket's DomainName, cookies not logged (got {logging})")
    if not bucket:
        return
    problems = bucket_problems(t, bucket, ("BucketOwnerPreferred", "ObjectWriter"))
    rules = (t.evaluate(t.resources.get(bucket, {}).get("Properties", {})).get("LifecycleConfiguration") or {}).get("Rules") or []
    if not any(r.get("Status") == "Enabled" and param_ref(t, r.get("ExpirationInDays")) == "LogRetentionDays" for r in rules):
        problems.append("no enabled lifecycle rule expiring objects after LogRetentionDays")
    check(not problems, f"{bucket}: the access-log bucket keeps ACLs for CloudFront's log delivery (BucketOwnerPreferred), "
          "blocks public access, is encrypted, expires logs after LogRetentionDays" + (f" -- {problems}" if problems else ""))


def check_storefront(t: Template, dist: str, config: dict, api_id: str, storefront: bool) -> None:
    origins = [o for o in config.get("Origins") or [] if o.get("Id") != api_id]
    buckets = [n for n, r in t.of_type("AWS::S3::Bucket") if r.get("Condition") == "StorefrontOn"]
    oacs = [n for n, _ in t.of_type("AWS::CloudFront::OriginAccessControl")]
    if not storefront:
        check(not origins and not buckets and not oacs and "DefaultRootObject" not in config,
              f"Storefront=false: no storefront bucket, Origin Access Control or bucket origin "
              f"(got {[o.get('Id') for o in origins]}, {buckets}, {oacs})")
        return
    check(len(origins) == 1, f"{dist}: one origin besides the HTTP API, the storefront bucket ({[o.get('Id') for o in origins]})")
    if not origins:
        return
    origin = origins[0]
    bucket = target_of(origin.get("DomainName"))
    oac_id = target_of(origin.get("OriginAccessControlId"))
    oac = t.evaluate(t.resources.get(oac_id, {}).get("Properties", {}).get("OriginAccessControlConfig") or {})
    ok = (t.resources.get(oac_id, {}).get("Type") == "AWS::CloudFront::OriginAccessControl"
          and oac.get("OriginAccessControlOriginType") in STOREFRONT_ORIGIN_TYPES and oac.get("SigningBehavior") == "always"
          and oac.get("SigningProtocol") == "sigv4" and (origin.get("S3OriginConfig") or {}).get("OriginAccessIdentity") == ""
          and "RegionalDomainName" in str(origin.get("DomainName")))
    check(ok, f"{dist}: the storefront origin reads bucket {bucket} through Origin Access Control {oac_id} "
          f"(s3, always signed, sigv4; no origin access identity) (got {origin})")
    problems = bucket_problems(t, bucket, ("BucketOwnerEnforced",))
    check(not problems, f"{bucket}: the storefront bucket is private (public access blocked, ACLs disabled, encrypted, "
          "no website endpoint)" + (f" -- {problems}" if problems else ""))
    statements_ = [st for _, r in t.of_type("AWS::S3::BucketPolicy") if target_of(r["Properties"].get("Bucket")) == bucket
                   for st in as_list(t.evaluate(r["Properties"].get("PolicyDocument") or {}).get("Statement"))]
    allows = [st for st in statements_ if st.get("Effect") == "Allow"]
    ok = bool(allows) and all(
        st.get("Principal") == {"Service": "cloudfront.amazonaws.com"} and as_list(st.get("Action")) == ["s3:GetObject"]
        and f"distribution/${{{dist}}}" in sub_text(((st.get("Condition") or {}).get("StringEquals") or {}).get("AWS:SourceArn"))
        for st in allows)
    check(ok, f"{bucket}: its policy lets only CloudFront, for this distribution (AWS:SourceArn), read objects (got {allows})")
    served = [("default", config.get("DefaultCacheBehavior") or {})] + [
        (b.get("PathPattern"), b) for b in config.get("CacheBehaviors") or [] if b.get("PathPattern") == "/assets/*"]
    bad = [w for w, b in served if b.get("TargetOriginId") != origin.get("Id") or b.get("CachePolicyId") in (None, CACHING_DISABLED)
           or set(b.get("AllowedMethods") or []) - {"GET", "HEAD"} or b.get("OriginRequestPolicyId")]
    check(config.get("DefaultRootObject") == "index.html" and len(served) == 2 and not bad,
          f"{dist}: / (DefaultRootObject index.html) and /assets/* served from the storefront bucket, cached, GET/HEAD, "
          f"nothing of the viewer forwarded (not: {bad}, root {config.get('DefaultRootObject')!r})")
    outputs = [n for n, o in (t.doc.get("Outputs") or {}).items() if t.active(o) and target_of(o.get("Value")) == bucket]
    check(bool(outputs), f"an output gives the storefront bucket's name ({outputs})")


def check_edge(t: Template) -> None:
    param = t.doc.get("Parameters", {}).get("EdgeProtection", {})
    check(set(param.get("AllowedValues") or []) == {"off", "on"} and str(param.get("Default")) == "off",
          "parameter EdgeProtection: off (default) or on")
    on = str(t.params.get("EdgeProtection")) == "on"
    storefront = on and str(t.params.get("Storefront")) == "true"
    edge = [n for n, r in t.resources.items() if t.active(r) and str(r.get("Type")).startswith(EDGE_TYPE_PREFIXES)]
    if not on:
        check(not edge, f"EdgeProtection=off creates no CloudFront, WAF or S3 resource (created: {edge})")
        return
    rules = t.doc.get("Rules", {})
    check(any("EdgeProtection" in refs_in(r.get("RuleCondition")) | set(strings_in(r.get("RuleCondition")))
              and "us-east-1" in set(strings_in(r.get("Assertions"))) for r in rules.values()),
          "a Rule refuses to create the CLOUDFRONT web ACL outside us-east-1")
    dists = t.of_type("AWS::CloudFront::Distribution")
    check(len(dists) == 1, f"EdgeProtection=on creates one CloudFront distribution ({[d for d, _ in dists]})")
    if not dists:
        return
    dist, res = dists[0]
    config = t.evaluate(res["Properties"]["DistributionConfig"])
    origin = api_origin(t, config)
    check(origin is not None and (origin.get("CustomOriginConfig") or {}).get("OriginProtocolPolicy") == "https-only",
          f"{dist}: one origin is the HTTP API's execute-api domain, HTTPS only")
    api_id = (origin or {}).get("Id")
    acl = target_of(config.get("WebACLId"))
    acl_ok = t.resources.get(acl, {}).get("Type") == "AWS::WAFv2::WebACL" and t.active(t.resources[acl])
    check(acl_ok or param_ref(t, config.get("WebACLId")) == "EdgeWebAclArn",
          f"{dist}: WebACLId is the stack's web ACL (or EdgeWebAclArn) (got {config.get('WebACLId')!r})")
    if acl_ok:
        check_web_acl(t, acl)
    check_viewer_tls(t, dist, config)
    check_behaviours(t, dist, config, api_id, storefront)
    check_security_headers(t, dist, config)
    check_access_log(t, dist, config)
    check_storefront(t, dist, config, api_id, storefront)
    outputs = [n for n, o in (t.doc.get("Outputs") or {}).items() if t.active(o) and dist in refs_in(o.get("Value"))
               and "DomainName" in "".join(strings_in(o.get("Value")))]
    check(bool(outputs), f"an output gives {dist}'s domain name ({outputs})")
