"""Who issues the API's tokens: no placeholder issuer, the Rules that make a deploy name one, and
the opt-in Cognito user pool (UserPool=on) whose issuer and app clients the JWT authorizer then
trusts, with the routes' scopes in its tokens as the API spells them.

Each check runs in both identity modes (model.IDENTITY_MODES), whatever the parameters of the
run: the template must be right with your issuer and with the stack's pool."""

from __future__ import annotations

import os
import re
from unittest import mock

from .model import IDENTITY_GIVEN, IDENTITY_MODES, SAMPLE_ISSUER, Template, as_list, param_ref, strings_in, sub_text, target_of
from .report import check
from .routes import JWT_AUTHORIZER, http_api_events


POOL = "AWS::Cognito::UserPool"
CLIENT = "AWS::Cognito::UserPoolClient"
RESOURCE_SERVER = "AWS::Cognito::UserPoolResourceServer"
DOMAIN = "AWS::Cognito::UserPoolDomain"
# Cognito's issuer of a pool (the JWT authorizer's `issuer`), as the template must write it.
POOL_ISSUER = "https://cognito-idp.${AWS::Region}.amazonaws.com/${%s}"
TOKEN_ENDPOINT = "https://${%s}.auth.${AWS::Region}.amazoncognito.com/oauth2/token"
# A literal issuer in the template: a Cognito pool URL, or a placeholder (the old default was
# https://cognito-idp.us-east-1.amazonaws.com/us-east-1_EXAMPLE).
LITERAL_ISSUER = re.compile(r"https://cognito-idp\.[a-z0-9-]+\.amazonaws\.com/[\w-]+_|EXAMPLE")
# The plans whose pre-token-generation trigger may change access tokens (V2_0, V3_0).
TOKEN_CUSTOMISING_TIERS = {"ESSENTIALS", "PLUS"}
TRIGGER_SCOPES_ENV = "API_SCOPES"
# The scope parameters of the admin routes and of the user routes.
ADMIN_SCOPE_PARAM, USER_SCOPE_PARAM = "AdminScope", "UserScope"


def pool_on(t: Template) -> Template:
    return t.with_params(**dict(IDENTITY_MODES)["UserPool=on"])


def route_scopes(t: Template) -> set[str]:
    """The parameters the JWT routes' AuthorizationScopes name (UserScope, AdminScope)."""
    return {param_ref(t, s) or str(s) for _, _, ev in http_api_events(t)
            if (ev.get("Auth") or {}).get("Authorizer") == JWT_AUTHORIZER
            for s in as_list((ev.get("Auth") or {}).get("AuthorizationScopes") or [])}


def jwt_configs(t: Template):
    """(api, its JwtAuthorizer's JwtConfiguration with every Fn::If decided)."""
    for name, api in t.of_type("AWS::Serverless::HttpApi"):
        auth = (api.get("Properties", {}).get("Auth") or {}).get("Authorizers") or {}
        yield name, t.evaluate((auth.get(JWT_AUTHORIZER) or {}).get("JwtConfiguration") or {})


# ---------------------------------------------------------------- no placeholder issuer


def check_issuer_parameters(t: Template) -> None:
    """JwtIssuer and JwtAudience have no default (a deploy must name them, or UserPool=on), and no
    literal issuer hides anywhere else in the template."""
    params = t.doc.get("Parameters", {})
    defaults = {name: params.get(name, {}).get("Default") for name in ("JwtIssuer", "JwtAudience")}
    literal = sorted({s for s in strings_in({"Parameters": params, "Resources": t.resources})
                      if LITERAL_ISSUER.search(s) and "${" not in s})
    check(all(v in (None, "") for v in defaults.values()) and not literal,
          f"JwtIssuer: no placeholder issuer -- JwtIssuer and JwtAudience have no default, no literal issuer in "
          f"the template (defaults {defaults}, literals {literal})")


def check_issuer_rules(t: Template) -> None:
    """The Rules refuse a deploy that names no issuer, or names one beside the stack's pool."""
    cases = (("the defaults (no issuer)", {}, True),
             ("JwtIssuer without JwtAudience", {"JwtIssuer": SAMPLE_ISSUER}, True),
             ("JwtIssuer and JwtAudience", IDENTITY_GIVEN, False),
             ("UserPool=on", {"UserPool": "on"}, False),
             ("UserPool=on with a JwtIssuer too", {"UserPool": "on", "JwtIssuer": SAMPLE_ISSUER}, True))
    wrong = [f"{what}: {'passes' if want else 'refused by ' + str(t.refusals(**params))}"
             for what, params, want in cases if bool(t.refusals(**params)) != want]
    check(not wrong, "Rules: JwtIssuer + JwtAudience, or UserPool=on, and not both; a deploy naming neither is "
          f"refused{' -- ' + str(wrong) if wrong else ''}")


# ---------------------------------------------------------------- the JWT authorizer


def check_authorizer(t: Template) -> None:
    """The JWT authorizer's issuer and audience: the parameters with the pool off, the pool's
    issuer and exactly its app clients with the pool on."""
    for mode, params in IDENTITY_MODES:
        m = t.with_params(**params)
        pools = [n for n, _ in m.of_type(POOL)]
        clients = sorted(n for n, c in m.of_type(CLIENT) if target_of(c["Properties"].get("UserPoolId")) in pools)
        for api, conf in jwt_configs(m):
            issuer, audience = conf.get("issuer"), conf.get("audience")
            if params["UserPool"] == "on":
                want = f"the stack's user pool's issuer and its app clients {clients}"
                ok = (len(pools) == 1 and sub_text(issuer) == POOL_ISSUER % pools[0] and isinstance(audience, list)
                      and sorted(target_of(a) or str(a) for a in audience) == clients and bool(clients))
            else:
                want = "the parameters JwtIssuer and JwtAudience"
                ok = param_ref(m, issuer) == "JwtIssuer" and param_ref(m, audience) == "JwtAudience"
            check(ok, f"{api}.JwtAuthorizer ({mode}): issuer and audience are {want} (got issuer {issuer!r}, "
                  f"audience {audience!r})")


# ---------------------------------------------------------------- the stack's user pool


def check_user_pool_off(t: Template) -> None:
    m = t.with_params(**dict(IDENTITY_MODES)["UserPool=off, JwtIssuer given"])
    made = sorted(n for n, r in m.resources.items() if str(r.get("Type")).startswith("AWS::Cognito::") and m.active(r))
    check(not made, f"UserPool=off creates no Cognito resource (got {made})")


def check_user_pool(t: Template) -> None:
    """UserPool=on: one pool, no self sign-up, a domain and its token endpoint as an output, a
    resource server with every scope the routes require, client_credentials clients that hold
    them, and the trigger that writes them into tokens verbatim."""
    m = pool_on(t)
    pools = m.of_type(POOL)
    check(len(pools) == 1, f"UserPool=on creates one Cognito user pool ({[n for n, _ in pools]})")
    if len(pools) != 1:
        return
    pool, props = pools[0][0], m.evaluate(pools[0][1].get("Properties", {}))
    of_pool = lambda type_: [(n, m.evaluate(r.get("Properties", {}))) for n, r in m.of_type(type_)  # noqa: E731
                             if target_of(r.get("Properties", {}).get("UserPoolId")) == pool]
    signup = (props.get("AdminCreateUserConfig") or {}).get("AllowAdminCreateUserOnly")
    check(signup is True, f"{pool}: no self sign-up (AdminCreateUserConfig.AllowAdminCreateUserOnly true, got {signup!r})")
    check_domain(m, pool, of_pool(DOMAIN))
    check_scopes_and_clients(m, pool, of_pool(RESOURCE_SERVER), of_pool(CLIENT))
    check_trigger(m, pool, props, of_pool(RESOURCE_SERVER))


def check_domain(m: Template, pool: str, domains: list) -> None:
    check(len(domains) == 1, f"{pool}: one UserPoolDomain, for the token endpoint ({[n for n, _ in domains]})")
    outputs = [n for n, o in (m.doc.get("Outputs") or {}).items() if m.active(o)
               and any(sub_text(o.get("Value")) == TOKEN_ENDPOINT % d for d, _ in domains)]
    check(len(outputs) == 1, f"{pool}: an output gives the token endpoint https://<domain>.auth.<region>.amazoncognito.com"
          f"/oauth2/token ({outputs})")


def scope_of(value, servers: set[str]) -> str | None:
    """The scope parameter an AllowedOAuthScopes entry `${<server>}/${<Scope>}` names, or None."""
    found = re.fullmatch(r"\$\{([A-Za-z0-9]+)\}/\$\{([A-Za-z0-9]+)\}", sub_text(value))
    return found.group(2) if found and found.group(1) in servers else None


def check_scopes_and_clients(m: Template, pool: str, servers: list, clients: list) -> None:
    """Each client is a client_credentials client with a secret, allowed scopes of the pool's
    resource server only; one client, the operator's, is allowed the admin scope, and a buyer's
    client holds the user scope without it."""
    wanted = route_scopes(m)
    defined = {param_ref(m, s.get("ScopeName")) for _, rs in servers for s in rs.get("Scopes") or []}
    names = {n for n, _ in servers}
    granted: dict[str, set[str]] = {}  # what a client's token can carry: its scopes the server defines
    listed: dict[str, set[str]] = {}   # what its AllowedOAuthScopes name
    for name, c in clients:
        scopes = [scope_of(s, names) for s in as_list(c.get("AllowedOAuthScopes") or [])]
        granted[name] = {s for s in scopes if s in defined}
        listed[name] = set(scopes) - {None}
        problems = []
        if as_list(c.get("AllowedOAuthFlows") or []) != ["client_credentials"]:
            problems.append(f"flows {c.get('AllowedOAuthFlows')}")
        if c.get("AllowedOAuthFlowsUserPoolClient") is not True or c.get("GenerateSecret") is not True:
            problems.append("not an OAuth client with a secret")
        if not scopes or None in scopes or not set(scopes) <= defined:
            problems.append(f"scopes {c.get('AllowedOAuthScopes')} not all of the pool's resource server {sorted(names)}")
        check(not problems, f"{name}: a client_credentials client with a secret, allowed only scopes of the pool's "
              f"resource server{' -- ' + str(problems) if problems else ''}")
    admins = sorted(n for n, g in listed.items() if ADMIN_SCOPE_PARAM in g)
    buyers = sorted(n for n, g in listed.items() if USER_SCOPE_PARAM in g and ADMIN_SCOPE_PARAM not in g)
    check(len(admins) == 1 and bool(buyers),
          f"{pool}: exactly one client (the operator's) is allowed {ADMIN_SCOPE_PARAM}, and a buyer's client "
          f"{USER_SCOPE_PARAM} without it (admin clients {admins}, buyer clients {buyers})")
    reachable = set().union(*granted.values()) if granted else set()
    check(len(servers) == 1 and wanted <= defined and wanted <= reachable,
          f"{pool}: its resource server defines every scope the routes require {sorted(wanted)} and a client is allowed "
          f"each (defined {sorted(s for s in defined if s)}, allowed {sorted(reachable)})")


def trigger_adds(code: str, api_scopes: str, granted: list[str]) -> list[str]:
    """The scopes the trigger's inline code adds to a token granted `granted`."""
    env = {"__name__": "trigger"}
    with mock.patch.dict(os.environ, {TRIGGER_SCOPES_ENV: api_scopes}):
        exec(compile(code, "<UserPoolScopeTrigger>", "exec"), env)  # noqa: S102 - the template's own code
        event = env["handler"]({"version": "3", "triggerSource": "TokenGeneration_ClientCredentials",
                                "request": {"scopes": granted}, "response": {}}, None)
    details = ((event.get("response") or {}).get("claimsAndScopeOverrideDetails") or {})
    return list((details.get("accessTokenGeneration") or {}).get("scopesToAdd") or [])


def check_trigger(m: Template, pool: str, props: dict, servers: list) -> None:
    """A V3_0 pre-token-generation trigger (it runs for client_credentials tokens too) on a plan
    that allows it, told the routes' scopes, invocable by Cognito for this pool only, whose code
    adds a granted `<server>/<scope>` as `<scope>` and nothing that was not granted."""
    config = (props.get("LambdaConfig") or {}).get("PreTokenGenerationConfig") or {}
    fn_name = target_of(config.get("LambdaArn"))
    fn = m.evaluate(m.resources.get(fn_name, {}).get("Properties", {}))
    told = set(re.findall(r"\$\{([A-Za-z0-9]+)\}", sub_text((fn.get("Environment") or {}).get("Variables", {}).get(TRIGGER_SCOPES_ENV))))
    wanted = route_scopes(m)
    permitted = [n for n, p in m.of_type("AWS::Lambda::Permission")
                 if target_of(p["Properties"].get("FunctionName")) == fn_name
                 and p["Properties"].get("Principal") == "cognito-idp.amazonaws.com"
                 and target_of(p["Properties"].get("SourceArn")) == pool]
    problems = []
    if config.get("LambdaVersion") != "V3_0":
        problems.append(f"LambdaVersion {config.get('LambdaVersion')!r}")
    if props.get("UserPoolTier") not in TOKEN_CUSTOMISING_TIERS:
        problems.append(f"UserPoolTier {props.get('UserPoolTier')!r}")
    if m.resources.get(fn_name, {}).get("Type") != "AWS::Lambda::Function":
        problems.append(f"LambdaArn {config.get('LambdaArn')!r} is not a function of the stack")
    if told != wanted:
        problems.append(f"{TRIGGER_SCOPES_ENV} names {sorted(told)}")
    if not permitted:
        problems.append("no Lambda permission for cognito-idp.amazonaws.com with this pool as SourceArn")
    check(not problems, f"{pool}: pre-token-generation trigger V3_0 on the Essentials or Plus plan, told the routes' "
          f"scopes ({TRIGGER_SCOPES_ENV}), invocable by Cognito for this pool only{' -- ' + str(problems) if problems else ''}")
    code = str((fn.get("Code") or {}).get("ZipFile") or "")
    scopes = {p: str(m.params.get(p)) for p in sorted(wanted)}
    server = str(servers[0][1].get("Identifier")) if servers else "seckill"
    # (scopes Cognito grants, scopes the trigger must add): each alone, both, another scope of
    # the server, none; bare scopes in the request (Cognito never grants them) add nothing.
    cases = [([f"{server}/{v}"], [v]) for v in scopes.values()]
    cases += [([f"{server}/{v}" for v in scopes.values()], sorted(scopes.values())), ([f"{server}/other"], []),
              ([], []), (list(scopes.values()), [])]
    try:
        wrong = [(g, got) for g, want in cases if sorted(got := trigger_adds(code, " ".join(scopes.values()), g)) != want]
    except Exception as e:  # noqa: BLE001 - any failure of the code is the finding
        wrong = [f"{type(e).__name__}: {e}"]
    check(not wrong, f"{fn_name}: its code adds each granted <resource server>/<scope> the routes require as <scope>, "
          f"and nothing else{' -- ' + str(wrong) if wrong else ''}")


# ---------------------------------------------------------------- outputs


SECRET_ATTRIBUTES = ("ClientSecret",)


def check_outputs_no_secret(t: Template) -> None:
    """No output gives a secret: no app client's ClientSecret, no resolved secret value."""
    found = []
    for mode, params in IDENTITY_MODES:
        m = t.with_params(**params)
        for name, out in (m.doc.get("Outputs") or {}).items():
            if not m.active(out):
                continue
            value = out.get("Value")
            atts = [str(v) for v in _getatts(value)]
            subs = re.findall(r"\$\{([A-Za-z0-9]+\.[A-Za-z0-9.]+)\}", "".join(strings_in(value)))
            if any(a.split(".")[-1] in SECRET_ATTRIBUTES for a in atts + subs) or "{{resolve:" in "".join(strings_in(value)):
                found.append(f"{name} ({mode})")
    check(not found, f"no secret in Outputs: no app client secret, no resolved secret (got {sorted(set(found))})")


def _getatts(value):
    if isinstance(value, dict):
        if "Fn::GetAtt" in value:
            att = value["Fn::GetAtt"]
            yield ".".join(att) if isinstance(att, list) else att
        for v in value.values():
            yield from _getatts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _getatts(v)
