"""Running the checks: every check on one template in the order they print, and cfn-lint and
`sam validate --lint` on a copy with the edge and the user pool on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .access import check_entry_policy, check_env_secrets
from .budgets import check_role_connection_limits, check_time_budgets
from .dashboard import check_dashboard
from .database import check_database, check_db_logins, check_proxy
from .edge import check_edge, check_rules
from .elasticache import check_data_stores, check_redis_users
from .functions import check_concurrency, check_functions, check_queue_and_consumer
from .identity import (
    check_authorizer,
    check_issuer_parameters,
    check_issuer_rules,
    check_outputs_no_secret,
    check_user_pool,
    check_user_pool_off,
)
from .local_invoke import check_local_invoke
from .model import REGION, SAMPLE_CERTIFICATE, SAMPLE_DOMAIN, Template
from .network import check_egress
from .origin_secret import check_origin_secret
from .report import check, failures
from .shape import check_shape
from .route_scopes import check_route_scopes
from .routes import check_admin_routes, check_deep_health, check_route_auth, check_route_throttles
from .stage import check_log_groups, check_log_protection, check_stage


def run_checks(t: Template) -> list[str]:
    failures.clear()
    check_functions(t)
    check_shape(t)
    check_queue_and_consumer(t)
    check_concurrency(t)
    check_route_throttles(t)
    check_entry_policy(t)
    check_env_secrets(t)
    check_local_invoke(t)
    check_data_stores(t)
    check_stage(t)
    check_log_groups(t)
    check_log_protection(t)
    check_egress(t)
    check_database(t)
    check_db_logins(t)
    check_redis_users(t)
    check_proxy(t)
    check_time_budgets(t)
    check_role_connection_limits(t)
    check_admin_routes(t)
    check_route_auth(t)
    check_route_scopes(t)
    check_deep_health(t)
    check_issuer_parameters(t)
    check_issuer_rules(t)
    check_authorizer(t)
    check_user_pool_off(t)
    check_user_pool(t)
    check_outputs_no_secret(t)
    check_rules(t)
    check_origin_secret(t)
    check_edge(t)
    check_dashboard(t)
    return list(failures)


LINT_DEFAULTS = {"EdgeProtection": '"on"', "EdgeBotControl": '"on"', "Storefront": '"true"',
                 "EdgeDomainName": SAMPLE_DOMAIN, "EdgeCertificateArn": SAMPLE_CERTIFICATE, "UserPool": '"on"'}


def edge_on_copy(path: Path, dest: Path) -> None:
    """template.yaml with the edge, Bot Control, the storefront and the user pool on by default
    (and a sample domain and certificate, which the edge requires), for the linters."""
    text = path.read_text()
    for name, value in LINT_DEFAULTS.items():
        text, n = re.subn(rf'(\n  {name}:\n(?:    .*\n)*?    Default: ).*\n', lambda m: f"{m.group(1)}{value}\n", text)
        if n != 1:
            raise ValueError(f"no `Default:` under parameter {name}")
    dest.write_text(text)


def lint_edge_on(path: Path) -> None:
    """cfn-lint and `sam validate --lint` on the every-switch-on copy (the Makefile lints the file itself)."""
    tools = Path(sys.executable).parent
    env = {**os.environ, "AWS_DEFAULT_REGION": REGION, "SAM_CLI_TELEMETRY": "0"}
    with tempfile.TemporaryDirectory(prefix="check-template-edge-on-") as tmp:
        copy_path = Path(tmp) / "template.yaml"
        try:
            edge_on_copy(path, copy_path)
        except ValueError as e:
            check(False, f"a copy with {', '.join(LINT_DEFAULTS)} set -- {e}")
            return
        for what, cmd in (("cfn-lint", [tools / "cfn-lint", copy_path]),
                          ("sam validate --lint", [tools / "sam", "validate", "--lint", "-t", copy_path])):
            try:
                run = subprocess.run([str(c) for c in cmd], cwd=tmp, env=env, capture_output=True, text=True)
                ok, out = run.returncode == 0, (run.stdout + run.stderr).strip()
            except OSError as e:
                ok, out = False, str(e)
            check(ok, f"{what} passes on a copy with the edge, Bot Control, the storefront and the user pool on"
                  + ("" if ok else f" -- {out[-3000:]}"))
