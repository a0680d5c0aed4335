"""The origin secret: with the edge on, CloudFront sends a stack secret in x-origin-verify and the
functions behind the HTTP API (and no other) may read it."""

from __future__ import annotations

import re

from .access import MIN_PASSWORD_LENGTH, secret_reads
from .model import Template, strings_in, sub_text, target_of
from .report import check
from .routes import http_api_events


ORIGIN_SECRET_HEADER = "x-origin-verify"
ORIGIN_SECRET_ENV = "EDGE_ORIGIN_SECRET_ARN"
# What CloudFront sends: the stack secret's JSON key, optionally pinned to a version id.
ORIGIN_SECRET_REF = re.compile(r"^\{\{resolve:secretsmanager:\$\{([A-Za-z0-9]+)\}:SecretString:([A-Za-z0-9_]+)(?:::\$\{[A-Za-z0-9]+\})?\}\}$")


def api_origin(t: Template, config: dict) -> dict | None:
    apis = {n for n, _ in t.of_type("AWS::Serverless::HttpApi")}
    found = [o for o in config.get("Origins") or []
             if any(sub_text(o.get("DomainName")).startswith(f"${{{a}}}.execute-api.") for a in apis)]
    return found[0] if len(found) == 1 else None


def origin_secret_ref(t: Template) -> tuple[str | None, str | None, str]:
    """(secret logical id, JSON key, header value) of the origin secret header, with the edge on."""
    for _, dist in t.of_type("AWS::CloudFront::Distribution"):
        origin = api_origin(t, t.evaluate(dist["Properties"]["DistributionConfig"])) or {}
        values = [h.get("HeaderValue") for h in origin.get("OriginCustomHeaders") or []
                  if str(h.get("HeaderName")).lower() == ORIGIN_SECRET_HEADER]
        if len(values) == 1:
            m = ORIGIN_SECRET_REF.match(sub_text(values[0]))
            return (m.group(1), m.group(2), sub_text(values[0])) if m else (None, None, repr(values[0]))
    return None, None, "none"


def origin_secrets(t: Template) -> set[str]:
    """The origin secret as CloudFront sends it and as the functions are told it (whether those
    agree, and who reads it, is check_origin_secret's to say)."""
    named = {target_of(t.env(t.evaluate(fn)).get(ORIGIN_SECRET_ENV)) for _, fn in t.functions()}
    return ({origin_secret_ref(t)[0]} | named) - {None}


def behind_http_api(t: Template) -> set[str]:
    return {fn for fn, _, _ in http_api_events(t)}


def check_origin_secret(t: Template) -> None:
    """With the edge on, CloudFront sends a stack secret in x-origin-verify, the functions behind
    the HTTP API (and no other) get its ARN and may read it, and no output gives the execute-api
    URL; with the edge off, none of it, and ApiUrl is an output."""
    on = str(t.params.get("EdgeProtection")) == "on"
    outputs = {n: o for n, o in (t.doc.get("Outputs") or {}).items() if t.active(o)}
    raw = [n for n, o in outputs.items() if "execute-api" in "".join(strings_in(o.get("Value")))]
    api_fns = behind_http_api(t)
    if not on:
        check(bool(raw), f"EdgeProtection=off: an output gives the execute-api URL ({raw})")
        for name, fn in t.functions():
            env = t.env(t.evaluate(fn))
            check(not env.get(ORIGIN_SECRET_ENV), f"EdgeProtection=off: {name} has no {ORIGIN_SECRET_ENV}")
        return
    check(not raw, f"EdgeProtection=on: no output gives the execute-api URL, only the edge's (got {raw})")
    secret, key, value = origin_secret_ref(t)
    res = t.resources.get(secret, {})
    gen = res.get("Properties", {}).get("GenerateSecretString") or {}
    weak = [] if secret else ["no {{resolve:secretsmanager:${<secret>}:SecretString:<key>}} reference"]
    if secret and gen.get("GenerateStringKey") != key:
        weak.append(f"GenerateStringKey {gen.get('GenerateStringKey')!r} is not the referenced key {key!r}")
    if secret and gen.get("ExcludePunctuation") is not True:
        weak.append("punctuation allowed")
    if secret and (t.number(gen.get("PasswordLength")) or 32) < MIN_PASSWORD_LENGTH:
        weak.append(f"PasswordLength {gen.get('PasswordLength')}")
    ok = res.get("Type") == "AWS::SecretsManager::Secret" and t.active(res) and not weak
    check(ok, f"the HTTP API origin sends {ORIGIN_SECRET_HEADER} = a generated stack secret's value by dynamic reference "
          f"(>= {MIN_PASSWORD_LENGTH} chars, no punctuation) (got {value}{': ' + str(weak) if weak else ''})")
    # Who holds it is judged against the header's secret, or (the header broken) the one stack
    # secret the functions behind the API are given, so each fault fails its own check.
    if secret is None:
        given = {target_of(t.env(t.evaluate(fn)).get(ORIGIN_SECRET_ENV)) for n, fn in t.functions() if n in api_fns} - {None}
        secret = next(iter(given)) if len(given) == 1 else None
    for name, fn in t.functions():
        fn = t.evaluate(fn)
        env = target_of(t.env(fn).get(ORIGIN_SECRET_ENV))
        reads = secret is not None and secret in secret_reads(fn)
        if name in api_fns:
            check(secret is not None and env == secret and reads,
                  f"{name}: {ORIGIN_SECRET_ENV} is the origin secret {secret} and it may read it (behind the HTTP API) "
                  f"(got {env}, read {reads})")
        else:
            check(env is None and not reads,
                  f"{name}: no {ORIGIN_SECRET_ENV} and no read of the origin secret (not behind the HTTP API) "
                  f"(got {env}, read {reads})")
