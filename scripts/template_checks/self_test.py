"""--self-test: each breakage of template.yaml, made in memory, fails exactly the check meant to
catch it, and the unbroken template passes in every mode."""

from __future__ import annotations

import contextlib
import io
import json
import sys

from .local_invoke import event_route_keys
from .model import EDGE_MODES, EDGE_ON, REPO, Template
from .report import failures
from .run import run_checks


def events_of(t: Template, fn: str) -> dict:
    return t.resources[fn]["Properties"]["Events"]


def props(t: Template, name: str) -> dict:
    return t.resources[name]["Properties"]


def edge_on(change):
    """A breakage of the edge resources, checked with EdgeProtection=on."""
    def breaks(t: Template) -> None:
        t.params.update(EDGE_ON)
        change(t)
    return breaks


def storefront_on(change):
    """A breakage checked with EdgeProtection=on and Storefront=true."""
    def breaks(t: Template) -> None:
        t.params.update(EDGE_ON, Storefront="true")
        change(t)
    return breaks


def live(t: Template, v):
    """The branch of a (nested) Fn::If the breakage's parameters select, as the raw object."""
    while isinstance(v, dict) and set(v) == {"Fn::If"}:
        cond, yes, no = v["Fn::If"]
        v = yes if t.condition(cond) else no
    return v


def acl_rule(t: Template, name: str) -> dict:
    return next(r for r in props(t, "EdgeWebAcl")["Rules"] if r.get("Name") == name)


def webhook_rule_without_source_check(t: Template) -> None:
    """The webhook rule's AndStatement without its NotStatement on the provider's IP set."""
    rule = next(r for r in props(t, "EdgeWebAcl")["Rules"]
                if "webhook-from-provider-only" in json.dumps(r))
    statements = rule["Fn::If"][1]["Statement"]["AndStatement"]["Statements"]
    statements[:] = [st for st in statements if "NotStatement" not in st]


def distribution_config(t: Template) -> dict:
    return props(t, "EdgeDistribution")["DistributionConfig"]


def behaviour(t: Template, pattern: str) -> dict:
    config = distribution_config(t)
    if pattern == "default":
        return live(t, config["DefaultCacheBehavior"])
    return next(b for b in (live(t, x) for x in config["CacheBehaviors"]) if b.get("PathPattern") == pattern)


def drop_behaviour(t: Template, pattern: str) -> None:
    items = distribution_config(t)["CacheBehaviors"]
    items.remove(behaviour(t, pattern))


def swap_public_view_behaviour_first(t: Template) -> None:
    items = distribution_config(t)["CacheBehaviors"]
    public = behaviour(t, "/activities/*")
    items.remove(public)
    items.insert(0, public)


def storefront_origin(t: Template) -> dict:
    return next(o for o in (live(t, x) for x in distribution_config(t)["Origins"]) if o.get("Id") == "storefront")


def without_statement(t: Template, fn: str, sid: str) -> None:
    sts = props(t, fn)["Policies"][0]["Statement"]
    sts[:] = [st for st in sts if live(t, st).get("Sid") != sid]


def edit_dashboard(change):
    def breaks(t: Template) -> None:
        body = props(t, "OperationsDashboard")["DashboardBody"]
        doc = json.loads(body["Fn::Sub"])
        change(doc)
        body["Fn::Sub"] = json.dumps(doc)
    return breaks


def drop_dlq_widget(doc: dict) -> None:
    doc["widgets"] = [w for w in doc["widgets"] if "OrderDeadLetterQueue" not in json.dumps(w)]


def name_unknown_metric(doc: dict) -> None:
    widget = next(w for w in doc["widgets"] if "RejectedSoldOut" in json.dumps(w))
    widget["properties"]["metrics"].append(["Seckill", "RejectedByMoonPhase", "Function", "seckill-entry"])


def set_priority(t: Template, name: str, priority: int) -> None:
    acl_rule(t, name)["Priority"] = priority


def drop_regex_from_scope(rule: dict) -> None:
    scope = rule["Statement"]["RateBasedStatement"]["ScopeDownStatement"]["AndStatement"]["Statements"]
    scope[:] = [s for s in scope if "RegexMatchStatement" not in s]


def open_egress(t: Template) -> None:
    t.resources["SshOut"] = {"Type": "AWS::EC2::SecurityGroupEgress", "Properties": {
        "GroupId": {"Ref": "FunctionSecurityGroup"}, "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
        "CidrIp": "0.0.0.0/0"}}


def jwt_configuration(t: Template) -> dict:
    return props(t, "HttpApi")["Auth"]["Authorizers"]["JwtAuthorizer"]["JwtConfiguration"]


# A scope trigger that makes every token an operator's.
ADMIN_FOR_EVERYONE = """def handler(event, context):
    event["response"]["claimsAndScopeOverrideDetails"] = {"accessTokenGeneration": {"scopesToAdd": ["seckill:admin"]}}
    return event
"""


def bot_control_always(t: Template) -> None:
    rules = props(t, "EdgeWebAcl")["Rules"]
    i = next(i for i, r in enumerate(rules)
             if "Fn::If" in r and r["Fn::If"][1].get("Name") == "aws-bot-control")
    rules[i] = rules[i]["Fn::If"][1]


# (what is broken, how, a phrase every failing check of the broken copy must contain)
BREAKAGES = [
    ("the user routes' scope is deployed as another than the dev server checks",
     lambda t: t.params.update(UserScope="seckill:buyer"),
     "template.yaml: the JwtAuthorizer with ['seckill:buyer']"),
    ("preheat's Timeout is not the shape's",
     lambda t: props(t, "PreheatFunction").update(Timeout=29),
     "PreheatFunction: Timeout 29"),
    ("the consumer's batch is not the shape's",
     lambda t: events_of(t, "OrderConsumerFunction")["Orders"]["Properties"].update(BatchSize=5),
     "OrderConsumerFunction.Orders: BatchSize"),
    ("a function's Redis user may run every command",
     lambda t: props(t, "RedisConsumerUser").update(AccessString="on ~* +@all"),
     "RedisConsumerUser: AccessString"),
    ("a function's Redis user may load scripts again",
     lambda t: props(t, "RedisEntryUser").update(
         AccessString=props(t, "RedisEntryUser")["AccessString"].replace("+evalsha", "+evalsha +script|load")),
     "RedisEntryUser: AccessString"),
    ("the script loader may run what it loads",
     lambda t: props(t, "RedisLoaderUser").update(AccessString="on -@all +script|load +evalsha +ping +cluster|slots"),
     "RedisLoaderUser: AccessString is scripts/redis_acl.py's loader's"),
    ("the entry gets the script loader's login",
     lambda t: props(t, "SeckillEntryFunction")["Environment"]["Variables"].update(
         REDIS_LOADER_SECRET_ARN={"Ref": "RedisLoaderSecret"}),
     "SeckillEntryFunction: neither gets nor reads the script loader's login"),
    ("the Redis cluster takes one AUTH token again",
     lambda t: props(t, "RedisReplicationGroup").update(AuthToken="{{resolve:secretsmanager:x}}"),
     "RedisReplicationGroup: no AuthToken"),
    ("the group's default user is on",
     lambda t: props(t, "RedisDefaultUser").update(AccessString="on ~* +@all"),
     "the group's required default user is off"),
    ("the entry logs in to Redis as the admin",
     lambda t: props(t, "SeckillEntryFunction")["Environment"]["Variables"].update(
         REDIS_AUTH_SECRET_ARN={"Ref": "RedisAdminSecret"}),
     "SeckillEntryFunction"),
    ("the entry has no cap",
     lambda t: t.resources["SeckillEntryFunction"]["Properties"].pop("ReservedConcurrentExecutions"),
     "SeckillEntryFunction: ReservedConcurrentExecutions"),
    ("the consumer has no reservation",
     lambda t: t.resources["OrderConsumerFunction"]["Properties"].pop("ReservedConcurrentExecutions"),
     "OrderConsumerFunction: ReservedConcurrentExecutions"),
    ("the reservations leave less than 100 unreserved",
     lambda t: t.params.update(EntryReservedConcurrency=900),
     "<= AccountConcurrency"),
    ("the consumer's reservation is below SQS's MaximumConcurrency",
     lambda t: t.params.update(ConsumerMaxConcurrency=8, ConsumerReservedConcurrency=6),
     "MaximumConcurrency 8"),
    ("the consumer's reservation x its pool exceeds the DB budget",
     lambda t: t.params.update(ConsumerReservedConcurrency=11),
     "<= DbConnectionBudget"),
    ("a public route has no throttle of its own",
     lambda t: events_of(t, "SeckillEntryFunction")["Health"]["Properties"].pop("RouteSettings"),
     "GET /health (no token"),
    ("a public route's rate is above the stage's",
     lambda t: t.params.update(PublicViewThrottlingRateLimit=6000),
     "GET /activities/{activityId} (no token"),
    ("a public route's burst is above the stage's",
     lambda t: t.params.update(HealthThrottlingBurstLimit=2001),
     "ThrottlingBurstLimit 2001 <= the stage's"),
    # ---- stage and logs
    ("the stage's rate is a literal, not a parameter",
     lambda t: props(t, "HttpApi")["DefaultRouteSettings"].update(ThrottlingRateLimit=5000),
     "stage throttling"),
    ("the HTTP API has no access log",
     lambda t: props(t, "HttpApi").pop("AccessLogSettings"),
     "access log"),
    ("the access log writes the Authorization header",
     lambda t: props(t, "HttpApi")["AccessLogSettings"].update(
         Format='{"requestId":"$context.requestId","ip":"$context.identity.sourceIp","routeKey":"$context.routeKey",'
                '"status":"$context.status","latency":"$context.responseLatency","auth":"$request.header.Authorization"}'),
     "access log"),
    ("a log group keeps its events forever",
     lambda t: props(t, "EntryLogGroup").pop("RetentionInDays"),
     "EntryLogGroup: log group retention"),
    ("sam local invoke cannot point the database anywhere",
     lambda t: t.globals["Environment"]["Variables"].pop("DATABASE_URL"),
     "sam local invoke with events/env.json points it at the local stack"),
    ("a route's event goes missing",
     lambda t: t.__dict__.update(event_route_keys=event_route_keys(t) - {"GET /health"}),
     "every HTTP route has its event under events/"),
    ("the functions log at a level nobody can set",
     lambda t: t.globals["LoggingConfig"].pop("ApplicationLogLevel"),
     "logs at Lambda's ApplicationLogLevel"),
    ("a function's log group masks nothing",
     lambda t: props(t, "ReconcileLogGroup").pop("DataProtectionPolicy"),
     "ReconcileFunction: its log group ReconcileLogGroup masks"),
    ("the origin secret is audited but not masked",
     lambda t: props(t, "EntryLogGroup")["DataProtectionPolicy"]["Statement"][1]["DataIdentifier"].remove("OriginSecret"),
     "SeckillEntryFunction: its log group EntryLogGroup masks"),
    ("a masking regex CloudWatch Logs refuses (a group)",
     lambda t: props(t, "AdminLogGroup")["DataProtectionPolicy"]["Configuration"]["CustomDataIdentifier"][1]
     .update(Regex="(sk|rk)_[a-z]{4}_[A-Za-z0-9]{10,}"),
     "AdminFunction: its log group AdminLogGroup masks"),
    ("a function writes to a log group Lambda creates",
     lambda t: props(t, "PreheatFunction").pop("LoggingConfig"),
     "PreheatFunction: writes JSON to its own log group"),
    # ---- network
    ("the functions may send anything anywhere",
     lambda t: props(t, "FunctionSecurityGroup").update(SecurityGroupEgress=[{"IpProtocol": "-1", "CidrIp": "0.0.0.0/0"}]),
     "FunctionSecurityGroup"),
    ("the functions' group keeps EC2's default allow-all egress",
     lambda t: props(t, "FunctionSecurityGroup").pop("SecurityGroupEgress"),
     "FunctionSecurityGroup"),
    ("the functions may open SSH to the internet",
     open_egress,
     "FunctionSecurityGroup"),
    ("the functions cannot reach Redis",
     lambda t: t.resources.pop("FunctionEgressToRedis"),
     "cannot reach ['redis']"),
    # ---- database
    ("the cluster has no deletion protection",
     lambda t: props(t, "DatabaseCluster").pop("DeletionProtection"),
     "DatabaseCluster: DeletionProtection"),
    ("deletion protection defaults to off",
     lambda t: t.doc["Parameters"]["DatabaseDeletionProtection"].update(Default="false"),
     "DatabaseCluster: DeletionProtection"),
    ("a function logs in with the master secret",
     lambda t: props(t, "SeckillEntryFunction")["Environment"]["Variables"].update(
         DATABASE_SECRET_ARN={"Ref": "DatabaseSecret"}),
     "SeckillEntryFunction:"),
    ("DATABASE_SECRET_ARN is back in Globals",
     lambda t: t.globals["Environment"]["Variables"].update(DATABASE_SECRET_ARN={"Ref": "DatabaseSecret"}),
     "Globals"),
    ("a function may read another role's secret",
     lambda t: props(t, "OrderConsumerFunction")["Policies"][0]["Statement"][0]["Resource"].append(
         {"Ref": "EntryDatabaseSecret"}),
     "OrderConsumerFunction: reads only its own"),
    ("a role secret has a short password",
     lambda t: props(t, "AdminDatabaseSecret")["GenerateSecretString"].update(PasswordLength=16),
     "AdminFunction: DATABASE_SECRET_ARN"),
    ("migrate is not given every role secret",
     lambda t: props(t, "MigrateFunction")["Environment"]["Variables"]["DATABASE_ROLE_SECRET_ARNS"]["Fn::Join"][1].pop(),
     "DATABASE_ROLE_SECRET_ARNS"),
    ("the proxy does not accept a role",
     lambda t: props(t, "DatabaseProxy")["Auth"].pop(),
     "DatabaseProxy: the proxy's Auth"),
    ("the proxy's role cannot read a role secret",
     lambda t: props(t, "DatabaseProxyRole")["Policies"][0]["PolicyDocument"]["Statement"][0]["Resource"].pop(),
     "DatabaseProxy: the proxy's role"),
    # ---- admin routes
    ("the router's GET /admin/activities is not in the template",
     lambda t: events_of(t, "AdminFunction").pop("ListActivities"),
     "admin route GET /admin/activities:"),
    ("an admin route lacks the admin scope",
     lambda t: events_of(t, "AdminFunction")["UpdateActivity"]["Properties"]["Auth"].pop("AuthorizationScopes"),
     "admin route PUT /admin/activities/{activityId}:"),
    # ---- edge (EdgeProtection=on)
    ("EdgeProtection=off still creates the distribution",
     lambda t: t.resources["EdgeDistribution"].pop("Condition"),
     "EdgeProtection=off creates no CloudFront"),
    ("the WAF has no per-IP rate rule",
     edge_on(lambda t: props(t, "EdgeWebAcl")["Rules"].remove(acl_rule(t, "rate-per-ip"))),
     "a rate-based rule per IP"),
    ("the per-token rule keys on another header",
     edge_on(lambda t: acl_rule(t, "purchase-rate-per-token")["Statement"]["RateBasedStatement"]["CustomKeys"][0]
             ["Header"].update(Name="x-user")),
     "a rate-based rule per Authorization header"),
    ("the per-token rule covers every POST, not the purchase route",
     edge_on(lambda t: drop_regex_from_scope(acl_rule(t, "purchase-rate-per-token"))),
     "scoped down to the purchase route"),
    ("the webhook rule no longer looks at the source address",
     edge_on(webhook_rule_without_source_check),
     "one rule blocks /payments/webhook"),
    ("the common rule set is missing",
     edge_on(lambda t: props(t, "EdgeWebAcl")["Rules"].remove(acl_rule(t, "aws-common"))),
     "AWSManagedRulesCommonRuleSet"),
    ("the known-bad-inputs rule set only counts",
     edge_on(lambda t: acl_rule(t, "aws-known-bad-inputs").update(OverrideAction={"Count": {}})),
     "AWSManagedRulesKnownBadInputsRuleSet"),
    ("Bot Control is on without its parameter",
     edge_on(bot_control_always),
     "Bot Control"),
    ("/activities/* comes before /activities/*/orders* (per-user routes hit the cache)",
     edge_on(swap_public_view_behaviour_first),
     "/activities/1/orders"),
    ("/orders/* is cached",
     edge_on(lambda t: behaviour(t, "/orders/*").update(CachePolicyId={"Ref": "EdgePublicViewCachePolicy"})),
     "/orders/*"),
    ("the per-user behaviour drops Authorization",
     edge_on(lambda t: behaviour(t, "/activities/*/orders*").pop("OriginRequestPolicyId")),
     "Authorization forwarded"),
    ("the admin behaviour forwards the viewer's Host too",
     edge_on(lambda t: behaviour(t, "/admin/*").update(OriginRequestPolicyId="216adef6-5c7f-47e4-b989-5492eafa07d3")),
     "Authorization forwarded"),
    ("the default behaviour caches",
     edge_on(lambda t: behaviour(t, "default").update(CachePolicyId={"Ref": "EdgePublicViewCachePolicy"})),
     "never cached"),
    ("the public view's cache key holds Authorization",
     edge_on(lambda t: props(t, "EdgePublicViewCachePolicy")["CachePolicyConfig"]["ParametersInCacheKeyAndForwardedToOrigin"]
             .update(HeadersConfig={"HeaderBehavior": "whitelist", "Headers": ["Authorization"]})),
     "the public view"),
    ("the public view is kept 60 s",
     edge_on(lambda t: props(t, "EdgePublicViewCachePolicy")["CachePolicyConfig"].update(MaxTTL=60)),
     "the public view"),
    ("origin errors are cached at the edge",
     edge_on(lambda t: props(t, "EdgeDistribution")["DistributionConfig"].pop("CustomErrorResponses")),
     "origin errors are never cached"),
    ("the origin is plain HTTP",
     edge_on(lambda t: props(t, "EdgeDistribution")["DistributionConfig"]["Origins"][0]["CustomOriginConfig"].update(
         OriginProtocolPolicy="match-viewer")),
     "HTTPS only"),
    ("no output gives the edge's domain",
     edge_on(lambda t: t.doc["Outputs"].pop("EdgeDistributionDomainName")),
     "domain name"),
    # ---- the origin secret (EdgeProtection=on)
    ("the HTTP API origin sends no x-origin-verify header",
     edge_on(lambda t: distribution_config(t)["Origins"][0].pop("OriginCustomHeaders")),
     "x-origin-verify"),
    ("x-origin-verify is a literal in the template, not the secret",
     edge_on(lambda t: distribution_config(t)["Origins"][0]["OriginCustomHeaders"][0].update(HeaderValue="letmein")),
     "x-origin-verify"),
    ("the admin function may not read the origin secret",
     edge_on(lambda t: without_statement(t, "AdminFunction", "ReadEdgeOriginSecret")),
     "AdminFunction: EDGE_ORIGIN_SECRET_ARN"),
    ("a scheduled function is handed the origin secret",
     edge_on(lambda t: props(t, "PreheatFunction")["Environment"]["Variables"].update(
         EDGE_ORIGIN_SECRET_ARN={"Ref": "EdgeOriginSecret"})),
     "PreheatFunction: no EDGE_ORIGIN_SECRET_ARN"),
    ("the execute-api URL is an output with the edge on",
     edge_on(lambda t: t.doc["Outputs"]["ApiUrl"].pop("Condition")),
     "execute-api URL"),
    # ---- TLS and the custom domain
    ("viewers may use TLS 1.0",
     edge_on(lambda t: distribution_config(t)["ViewerCertificate"].update(MinimumProtocolVersion="TLSv1")),
     "TLS >= 1.2"),
    ("the distribution uses CloudFront's default certificate",
     edge_on(lambda t: distribution_config(t).update(ViewerCertificate={"CloudFrontDefaultCertificate": True})),
     "TLS >= 1.2"),
    ("EdgeProtection=on is accepted without a domain or certificate",
     lambda t: t.doc["Rules"].pop("EdgeNeedsDomainAndCertificate"),
     "Rules: EdgeProtection=on is refused without"),
    ("a certificate outside us-east-1 is accepted",
     lambda t: t.doc["Parameters"]["EdgeCertificateArn"].update(
         AllowedPattern="^$|^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/[0-9a-f-]{36}$"),
     "EdgeCertificateArn"),
    # ---- security headers and logs
    ("a behaviour answers without the security headers",
     edge_on(lambda t: behaviour(t, "/orders/*").pop("ResponseHeadersPolicyId")),
     "response headers policy"),
    ("HSTS lasts five minutes",
     edge_on(lambda t: props(t, "EdgeResponseHeadersPolicy")["ResponseHeadersPolicyConfig"]["SecurityHeadersConfig"]
             ["StrictTransportSecurity"].update(AccessControlMaxAgeSec=300)),
     "security headers"),
    ("the CSP lets inline scripts run",
     edge_on(lambda t: props(t, "EdgeResponseHeadersPolicy")["ResponseHeadersPolicyConfig"]["SecurityHeadersConfig"]
             ["ContentSecurityPolicy"].update(ContentSecurityPolicy="default-src 'self'; img-src 'self' data:; "
             "style-src 'self'; script-src 'self' 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")),
     "security headers"),
    ("the CSP with payments on lets scripts come from any https origin",
     edge_on(lambda t: props(t, "EdgeResponseHeadersPolicy")["ResponseHeadersPolicyConfig"]["SecurityHeadersConfig"]
             ["ContentSecurityPolicy"]["ContentSecurityPolicy"]["Fn::If"].__setitem__(1, "default-src 'self'; "
             "img-src 'self' data:; style-src 'self'; script-src 'self' https:; connect-src 'self' https://api.stripe.com; "
             "frame-src https://js.stripe.com https://hooks.stripe.com; frame-ancestors 'none'")),
     "security headers"),
    ("CloudFront writes no access log",
     edge_on(lambda t: distribution_config(t).pop("Logging")),
     "standard access logging"),
    ("the access-log bucket keeps logs forever",
     edge_on(lambda t: props(t, "EdgeLogBucket").pop("LifecycleConfiguration")),
     "access-log bucket"),
    ("the access-log bucket disables the ACLs CloudFront's log delivery needs",
     edge_on(lambda t: props(t, "EdgeLogBucket").update(
         OwnershipControls={"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]})),
     "access-log bucket"),
    ("WAF logs the Authorization header",
     edge_on(lambda t: props(t, "EdgeWafLogging").pop("RedactedFields")),
     "redact the authorization header"),
    ("WAF logs to a group without the aws-waf-logs- prefix",
     edge_on(lambda t: props(t, "EdgeWafLogGroup").update(LogGroupName={"Fn::Sub": "/aws/waf/${AWS::StackName}"})),
     "aws-waf-logs-"),
    # ---- cheap refusals at the WAF
    ("the public-view rate rule also counts purchases and my-order",
     edge_on(lambda t: acl_rule(t, "public-view-rate-per-ip")["Statement"]["RateBasedStatement"]["ScopeDownStatement"]
             ["AndStatement"]["Statements"].pop()),
     "on the public view only"),
    ("the bearer JWT rule answers 403",
     edge_on(lambda t: acl_rule(t, "purchase-needs-bearer-jwt")["Action"]["Block"]["CustomResponse"].update(ResponseCode=403)),
     "bearer JWT rule"),
    ("the bearer JWT rule takes any Bearer string",
     edge_on(lambda t: acl_rule(t, "purchase-needs-bearer-jwt")["Statement"]["AndStatement"]["Statements"][2]
             ["NotStatement"]["Statement"]["RegexMatchStatement"].update(RegexString="^Bearer ")),
     "bearer JWT rule"),
    ("a rule regex has a capturing group WAF refuses",
     edge_on(lambda t: acl_rule(t, "purchase-rate-per-token")["Statement"]["RateBasedStatement"]["ScopeDownStatement"]
             ["AndStatement"]["Statements"][1]["RegexMatchStatement"].update(RegexString="^/+activities/+([^/]+)/+orders/*$")),
     "RegexString is one AWS WAF accepts"),
    ("the common rule set runs before the rate rules",
     edge_on(lambda t: set_priority(t, "aws-common", -1)),
     "cheapest first"),
    # ---- GET /health/deep behind IAM
    ("GET /health/deep takes no credentials",
     lambda t: events_of(t, "SeckillEntryFunction")["DeepHealth"]["Properties"]["Auth"].update(Authorizer="NONE"),
     "GET /health/deep:"),
    ("the monitoring policy may invoke every route",
     lambda t: props(t, "DeepHealthInvokePolicy")["PolicyDocument"]["Statement"][0].update(
         Resource={"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${HttpApi}/*"}),
     "DeepHealthInvokePolicy"),
    ("the edge forwards GET /health/deep to the origin",
     edge_on(lambda t: drop_behaviour(t, "/health/deep*")),
     "GET /health/deep (default)"),
    # ---- the token issuer and the opt-in user pool (identity.py; its checks run both modes)
    ("JwtIssuer defaults to a placeholder pool again",
     lambda t: t.doc["Parameters"]["JwtIssuer"].update(Default="https://cognito-idp.us-east-1.amazonaws.com/us-east-1_EXAMPLE"),
     "JwtIssuer"),
    ("a deploy that names no issuer is accepted",
     lambda t: t.doc["Rules"].pop("JwtIssuerOrUserPool"),
     "a deploy naming neither is refused"),
    ("with the pool on, the authorizer trusts a literal pool's issuer",
     lambda t: jwt_configuration(t)["issuer"]["Fn::If"].__setitem__(1, "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_AbCdEf123"),
     "issuer"),
    ("with the pool on, the authorizer's audience is JwtAudience, not the pool's clients",
     lambda t: jwt_configuration(t).update(audience={"Ref": "JwtAudience"}),
     "JwtAuthorizer (UserPool=on)"),
    ("UserPool=off still creates the pool",
     lambda t: t.resources["ApiUserPool"].pop("Condition"),
     "UserPool=off creates no Cognito"),
    ("anyone may sign up to the pool",
     lambda t: props(t, "ApiUserPool")["AdminCreateUserConfig"].update(AllowAdminCreateUserOnly=False),
     "no self sign-up"),
    ("the resource server lacks the admin scope",
     lambda t: props(t, "UserPoolResourceServer")["Scopes"].pop(),
     "resource server"),
    ("the buyer's client may administer too",
     lambda t: props(t, "UserPoolBuyerClient")["AllowedOAuthScopes"].append({"Fn::Sub": "${UserPoolResourceServer}/${AdminScope}"}),
     "exactly one client (the operator's)"),
    ("the scope trigger is V2_0 (client_credentials tokens keep only the prefixed scopes)",
     lambda t: props(t, "ApiUserPool")["LambdaConfig"]["PreTokenGenerationConfig"].update(LambdaVersion="V2_0"),
     "pre-token-generation trigger V3_0"),
    ("the scope trigger adds the admin scope to every token",
     lambda t: props(t, "UserPoolScopeTrigger")["Code"].update(ZipFile=ADMIN_FOR_EVERYONE),
     "UserPoolScopeTrigger: its code"),
    ("no output gives the token endpoint",
     lambda t: t.doc["Outputs"].pop("UserPoolTokenUrl"),
     "token endpoint"),
    ("an output gives the operator client's secret",
     lambda t: t.doc["Outputs"].update(UserPoolAdminClientSecret={
         "Condition": "UserPoolOn", "Value": {"Fn::GetAtt": ["UserPoolAdminClient", "ClientSecret"]}}),
     "no secret in Outputs"),
    # ---- scopes and the webhook
    ("a user route takes any token (no UserScope)",
     lambda t: events_of(t, "SeckillEntryFunction")["CancelOrder"]["Properties"].pop("Auth"),
     "POST /orders/{orderId}/cancel:"),
    ("the webhook wants a user token",
     lambda t: events_of(t, "SeckillEntryFunction")["PaymentWebhook"]["Properties"].update(
         Auth={"Authorizer": "JwtAuthorizer", "AuthorizationScopes": [{"Ref": "UserScope"}]}),
     "POST /payments/webhook:"),
    ("/payments/* is cached at the edge",
     edge_on(lambda t: behaviour(t, "/payments/*").update(CachePolicyId={"Ref": "EdgePublicViewCachePolicy"})),
     "/payments/*"),
    # ---- the dashboard
    ("the dashboard has no dead-letter queue widget",
     edit_dashboard(drop_dlq_widget),
     "dead-letter queue"),
    ("the dashboard names a metric the code never emits",
     edit_dashboard(name_unknown_metric),
     "RejectedByMoonPhase"),
    # ---- the storefront (EdgeProtection=on, Storefront=true)
    ("Storefront=true is accepted with the edge off",
     lambda t: t.doc["Rules"].pop("StorefrontNeedsEdge"),
     "Storefront=true is refused"),
    ("the storefront bucket allows public bucket policies",
     storefront_on(lambda t: props(t, "StorefrontBucket")["PublicAccessBlockConfiguration"].update(BlockPublicPolicy=False)),
     "the storefront bucket is private"),
    ("the storefront origin reads the bucket without Origin Access Control",
     storefront_on(lambda t: storefront_origin(t).pop("OriginAccessControlId")),
     "Origin Access Control"),
    ("the storefront bucket policy lets anyone read",
     storefront_on(lambda t: props(t, "StorefrontBucketPolicy")["PolicyDocument"]["Statement"][0].update(Principal="*")),
     "its policy lets only CloudFront"),
    ("with the storefront on, GET /health goes to the bucket",
     storefront_on(lambda t: drop_behaviour(t, "/health")),
     "GET /health (default)"),
    # ---- time budgets and the roles' connection limits
    # Both the time budgets and the shape the dev server and the tests run it by.
    ("the entry's Timeout is 5 s again",
     lambda t: props(t, "SeckillEntryFunction").update(Timeout=5),
     "SeckillEntryFunction: "),
    ("the entry waits the default 3 s for its pooled connection",
     lambda t: props(t, "SeckillEntryFunction")["Environment"]["Variables"].pop("DB_ACQUIRE_TIMEOUT_MS"),
     "SeckillEntryFunction: time budget"),
    ("the consumer waits the default 3 s for a pooled connection",
     lambda t: props(t, "OrderConsumerFunction")["Environment"]["Variables"].pop("DB_ACQUIRE_TIMEOUT_MS"),
     "OrderConsumerFunction: time budget"),
    ("RDS Proxy makes a statement wait 5 s for a connection",
     lambda t: props(t, "DatabaseProxyTargetGroup")["ConnectionPoolConfigurationInfo"].update(ConnectionBorrowTimeout=5),
     ": time budget of "),
    # Both the role's connection limit and the shape the dev server and the tests run it by.
    ("preheat's pool outgrows its role's connection limit",
     lambda t: props(t, "PreheatFunction")["Environment"]["Variables"].update(DB_MAX_CONNECTIONS="4"),
     "PreheatFunction: "),
]


def self_test() -> int:
    path = REPO / "template.yaml"
    problems = []
    # What the unbroken template already fails: reported, and not counted against a breakage.
    known: set[str] = set()
    for label, params in EDGE_MODES:
        with contextlib.redirect_stdout(io.StringIO()):
            baseline = run_checks(Template(path, use_samconfig=False, overrides=params))
        print(f"{'FAIL' if baseline else 'ok  '} unbroken, {label} -> {baseline or 'all checks pass'}")
        if baseline:
            problems.append(f"the unbroken template fails with {label}: {baseline}")
        known |= set(baseline)
    for what, breaks, phrase in BREAKAGES:
        t = Template(path, use_samconfig=False)
        breaks(t)
        with contextlib.redirect_stdout(io.StringIO()):
            failed = [f for f in run_checks(t) if f not in known]
        caught = bool(failed) and all(phrase in f for f in failed)
        print(f"{'ok  ' if caught else 'FAIL'} broken: {what} -> {failed or 'nothing failed'}")
        if not caught:
            problems.append(what)
    failures.clear()
    if problems:
        print(f"check-template --self-test: {len(problems)} problem(s): {problems}", file=sys.stderr)
        return 1
    print(f"check-template --self-test: each of {len(BREAKAGES)} breakages caught by its check")
    return 0
