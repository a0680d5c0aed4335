"""The checks of scripts/check-template.py: what cfn-lint does not catch in template.yaml.

# Layout

- `model`: the template as it deploys (`Template`: parameters, conditions, Fn::If) and the
  helpers that read its values; the edge modes every check runs in.
- `report`: `check`, one printed line per check, and the failures of the current run.
- `functions`: each function's binary, runtime and required variables; the SQS consumer; the
  reserved concurrency.
- `access`: the entry's IAM policy, no wildcard grants, no secret value in the environment.
- `local_invoke`: events/env.json for `sam local invoke` on the local stack.
- `route_scopes`: each route's authorizer and scopes as functions/routes.toml (the dev server's
  table) names them.
- `routes`: throttles of the routes without a token, the admin routes, who may call each entry
  route, GET /health/deep behind IAM.
- `identity`: who issues the tokens: no placeholder issuer, the Rules that make a deploy name
  one, the JWT authorizer's issuer and audience, the opt-in Cognito user pool (UserPool=on),
  no secret in the outputs.
- `stage`: the HTTP API's stage throttling and access log, the log groups.
- `network`: the functions' egress.
- `database`: Aurora's deletion protection, one login role per function, RDS Proxy.
- `elasticache`: the Redis cluster's settings and each function's ACL user.
- `budgets`: the time budgets of the entry's and the consumer's paths (`--budget` prints them),
  the roles' connection limits.
- `origin_secret`: the secret CloudFront sends the HTTP API, and who may read it.
- `dashboard`: the operations dashboard against the metrics the Rust code emits.
- `waf`: the edge's web ACL, its statements matched against sample requests.
- `edge`: the parameter Rules, the CloudFront distribution and the storefront bucket.
- `run`: every check in the order it prints, and the linters on the edge-on copy.
- `self_test`: `--self-test`, each breakage and the check that must catch it.
"""
