#!/usr/bin/env python3
"""Checks template.yaml for what cfn-lint does not catch.

cfn-lint passes, for one, an SQS MaximumConcurrency below 2, a huge BatchSize and a queue
visibility timeout shorter than its consumer's Timeout.

Run with the project venv's python (it has cfn-lint, whose YAML loader understands !Ref/!GetAtt):

    .tools/venv/bin/python scripts/check-template.py [template.yaml] [--no-samconfig] [--no-lint]
    .tools/venv/bin/python scripts/check-template.py --self-test
    .tools/venv/bin/python scripts/check-template.py --budget   (docs/capacity.md's time budgets)

Parameters resolve to their defaults, overridden by `parameter_overrides` in samconfig.toml
([default.deploy.parameters]) when that file sets any, so what gets deployed is what is checked.
Every check runs in three modes: EdgeProtection=off, =on (CloudFront + WAF, with a sample
EdgeDomainName and EdgeCertificateArn, which the edge requires) and =on with Storefront=true;
the token issuer's checks (template_checks/identity.py) run each with JwtIssuer given and with
UserPool=on; a copy of the template with the edge, Bot Control, the storefront and the user
pool defaulting to on goes through cfn-lint and `sam validate --lint` (the Makefile lints the
file as it is, the "off" mode); --no-lint skips that copy. Prints one line per check; exits 1 if
any fails.

--self-test proves the checks can fail: it breaks template.yaml in memory one way at a time
(a budget over the account, a reservation below SQS's concurrency, an unthrottled public
route, a cached per-user route, a missing WAF rule, open egress, a function holding the master
secret, an origin without the origin secret, TLS 1.0 at the edge, a user route without its
scope, a dashboard naming a metric no code emits, a public storefront bucket, the entry's
Timeout below its time budget, a role's connection limit below its function's pool, a
placeholder issuer, a buyer's app client allowed the admin scope, a client secret in the outputs, ...) and
exits 1 unless each broken copy fails exactly the check meant to catch it and
the unbroken template passes in every mode. A check the unbroken template already fails (say a
dashboard metric the Rust code does not emit yet) is reported and fails the self-test, but does
not hide what each breakage adds.

The checks live in scripts/template_checks/, one module per concern (its `__init__` lists them).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import cfnlint.decode  # noqa: F401  (template_checks.model reads template.yaml with its YAML loader)
except ImportError:  # pragma: no cover - run with the wrong python
    sys.exit("check-template: needs cfn-lint; run it with .tools/venv/bin/python (make stack installs it)")

# scripts/: the template_checks package and redis_acl.py.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from template_checks.budgets import print_budgets  # noqa: E402
from template_checks.model import EDGE_MODES, REPO, Template  # noqa: E402
from template_checks.report import failures  # noqa: E402
from template_checks.run import lint_edge_on, run_checks  # noqa: E402
from template_checks.self_test import self_test  # noqa: E402


def main(argv: list[str]) -> int:
    if "--self-test" in argv:
        return self_test()
    if "--budget" in argv:
        print_budgets(Template(REPO / "template.yaml", use_samconfig="--no-samconfig" not in argv))
        return 0
    args = [a for a in argv if not a.startswith("--")]
    path = Path(args[0]) if args else REPO / "template.yaml"
    failed = []
    for label, params in EDGE_MODES:
        t = Template(path, use_samconfig="--no-samconfig" not in argv, overrides=params)
        print(f"check-template: {path}, {label}"
              + (f" (samconfig overrides: {t.overrides})" if t.overrides else ""))
        failed += run_checks(t)
    if "--no-lint" not in argv:
        failures.clear()
        print(f"check-template: cfn-lint and sam validate on {path.name} with the edge and the user pool on")
        lint_edge_on(path)
        failed += failures
    if failed:
        print(f"check-template: {len(failed)} check(s) failed", file=sys.stderr)
        return 1
    print(f"check-template: all checks passed in every mode ({', '.join(label for label, _ in EDGE_MODES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
