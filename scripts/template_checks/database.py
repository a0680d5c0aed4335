"""Aurora and RDS Proxy: deletion protection, one login role per function (its own generated
secret; the master secret only for migrate), and a proxy that accepts every login."""

from __future__ import annotations

import json

from .access import MIN_PASSWORD_LENGTH, secret_reads
from .model import Template, as_list, param_ref, refs_in, target_of
from .origin_secret import origin_secrets
from .report import check
from .shape import DB_ROLE_OF_BINARY


def check_database(t: Template) -> None:
    for name, db in t.of_type("AWS::RDS::DBCluster"):
        prop = db.get("Properties", {}).get("DeletionProtection")
        param = param_ref(t, prop)
        default = str(t.doc.get("Parameters", {}).get(param, {}).get("Default")).lower() if param else None
        check(param is not None and default == "true",
              f"{name}: DeletionProtection from a parameter defaulting to true (got {prop!r}, default {default})")
        check(db.get("DeletionPolicy") == "Snapshot" and db.get("UpdateReplacePolicy") == "Snapshot",
              f"{name}: DeletionPolicy and UpdateReplacePolicy Snapshot")


MIGRATE_BINARY = "seckill-migrate"


def master_secret(t: Template) -> str | None:
    for _, db in t.of_type("AWS::RDS::DBCluster"):
        ids = refs_in(db.get("Properties", {}).get("MasterUserPassword"))
        secrets = [i for i in ids if t.resources.get(i, {}).get("Type") == "AWS::SecretsManager::Secret"]
        if secrets:
            return secrets[0]
    return None


def secret_user(t: Template, secret: str | None) -> tuple[str | None, list[str]]:
    """A generated secret's username and what is wrong with its password settings."""
    gen = t.resources.get(secret, {}).get("Properties", {}).get("GenerateSecretString") or {}
    try:
        user = json.loads(str(gen.get("SecretStringTemplate"))).get("username")
    except (ValueError, AttributeError):
        user = None
    weak = []
    if gen.get("GenerateStringKey") != "password":
        weak.append("GenerateStringKey is not password")
    if gen.get("ExcludePunctuation") is not True:
        weak.append("punctuation allowed")
    if (t.number(gen.get("PasswordLength")) or 32) < MIN_PASSWORD_LENGTH:
        weak.append(f"PasswordLength {gen.get('PasswordLength')} < {MIN_PASSWORD_LENGTH}")
    return user, weak


def role_secrets(t: Template) -> dict[str, str]:
    """Role name -> the secret logical id whose username it is."""
    out = {}
    for name, _ in t.of_type("AWS::SecretsManager::Secret"):
        user, _ = secret_user(t, name)
        if user in DB_ROLE_OF_BINARY.values():
            out[user] = name
    return out


def check_db_logins(t: Template) -> None:
    master = master_secret(t)
    roles = role_secrets(t)
    check(master is not None, f"the cluster's master password comes from a stack secret ({master})")
    check(set(roles) == set(DB_ROLE_OF_BINARY.values()),
          f"one secret per database role {sorted(DB_ROLE_OF_BINARY.values())} (found {roles})")
    genv = t.globals.get("Environment", {}).get("Variables", {}) or {}
    check("DATABASE_SECRET_ARN" not in genv and master not in refs_in(t.globals),
          "Globals: no DATABASE_SECRET_ARN and no master-secret reference (each function names its own secret)")
    redis = {target_of(v) for k, v in genv.items() if k == "REDIS_AUTH_SECRET_ARN"}
    origin = origin_secrets(t)
    for name, fn in t.functions():
        binary = t.binary(fn)
        fn = t.evaluate(fn)
        own_env = fn.get("Properties", {}).get("Environment", {}).get("Variables", {}) or {}
        secret = target_of(own_env.get("DATABASE_SECRET_ARN"))
        reads = secret_reads(fn)
        uses_redis = {target_of(v) for k, v in t.env(fn).items()
                      if k in ("REDIS_AUTH_SECRET_ARN", "REDIS_LOADER_SECRET_ARN")} or redis
        if binary == MIGRATE_BINARY:
            joined = own_env.get("DATABASE_ROLE_SECRET_ARNS")
            parts = joined.get("Fn::Join") if isinstance(joined, dict) else None
            listed = {target_of(x) for x in as_list(parts[1])} if parts and parts[0] == "," else set()
            check(secret == master, f"{name}: DATABASE_SECRET_ARN is the master secret {master} (got {secret})")
            check(listed == set(roles.values()) and len(as_list(parts[1])) == len(roles),
                  f"{name}: DATABASE_ROLE_SECRET_ARNS joins every role's secret with ',' (got {sorted(listed)})")
            loader = {target_of(own_env.get("REDIS_LOADER_SECRET_ARN"))} - {None}
            check(reads == {master} | set(roles.values()) | loader,
                  f"{name}: reads the master and every role secret (+ the script loader's Redis login), nothing "
                  f"else (got {sorted(reads)})")
            continue
        role = DB_ROLE_OF_BINARY.get(binary)
        user, weak = secret_user(t, secret)
        check(role is not None and user == role and not weak,
              f"{name}: DATABASE_SECRET_ARN is its own role's secret ({binary} -> {role}; got {secret} with "
              f"username {user}, password >= {MIN_PASSWORD_LENGTH} chars, no punctuation{': ' + str(weak) if weak else ''})")
        check(master not in refs_in(fn.get("Properties", {})),
              f"{name}: does not reference the master secret {master} (only {MIGRATE_BINARY} does)")
        # The origin secret: who may read it is check_origin_secret's to say.
        allowed = {secret} | uses_redis | origin
        check(secret in reads and reads <= allowed,
              f"{name}: reads only its own database secret (+ its Redis login) (got {sorted(reads)})")


def check_proxy(t: Template) -> None:
    logins = {master_secret(t)} | set(role_secrets(t).values())
    for name, proxy in t.of_type("AWS::RDS::DBProxy"):
        props = proxy.get("Properties", {})
        auth = {target_of(a.get("SecretArn")) for a in props.get("Auth") or [] if a.get("AuthScheme") == "SECRETS"}
        check(logins <= auth, f"{name}: the proxy's Auth lists every login secret {sorted(logins)} (missing {sorted(logins - auth)})")
        role = t.resources.get(target_of(props.get("RoleArn")), {})
        reads = {target_of(r) for pol in role.get("Properties", {}).get("Policies") or []
                 for st in as_list(pol.get("PolicyDocument", {}).get("Statement")) if st.get("Effect") == "Allow"
                 and "secretsmanager:GetSecretValue" in as_list(st.get("Action")) for r in as_list(st.get("Resource"))}
        check(logins <= reads, f"{name}: the proxy's role may read every login secret (missing {sorted(logins - reads)})")
