"""ElastiCache: cluster mode, noeviction and TLS, and one ACL user per function whose access
string is scripts/redis_acl.py's for it."""

from __future__ import annotations

import json
import re

import redis_acl  # scripts/redis_acl.py: the functions' Redis ACL users

from .access import MIN_PASSWORD_LENGTH, secret_reads
from .model import Template, as_list, props_of, sub_text, target_of
from .report import check


def check_data_stores(t: Template) -> None:
    for name, r in t.resources.items():
        props = r.get("Properties", {})
        if r.get("Type") == "AWS::ElastiCache::ParameterGroup":
            p = props.get("Properties", {})
            check(p.get("maxmemory-policy") == "noeviction" and p.get("cluster-enabled") == "yes",
                  f"{name}: cluster-enabled yes, maxmemory-policy noeviction")
        if r.get("Type") == "AWS::ElastiCache::ReplicationGroup":
            check(props.get("TransitEncryptionEnabled") is True and bool(props.get("UserGroupIds")),
                  f"{name}: TLS in transit and a user group (each client logs in)")


def check_redis_users(t: Template) -> None:
    """Each function logs in to ElastiCache as its own user, whose access string is
    scripts/redis_acl.py's for it; no cluster-wide AUTH token; the group's default user is off."""
    users = {props_of(u).get("UserName"): (name, props_of(u)) for name, u in t.of_type("AWS::ElastiCache::User")}
    for name, group in t.of_type("AWS::ElastiCache::ReplicationGroup"):
        p = props_of(group)
        check("AuthToken" not in p, f"{name}: no AuthToken (one password for every function); each logs in as its own user")
        groups = [target_of(g) for g in as_list(p.get("UserGroupIds"))]
        check(len(groups) == 1 and t.resources.get(groups[0], {}).get("Type") == "AWS::ElastiCache::UserGroup",
              f"{name}: UserGroupIds names the functions' user group (got {groups})")
        members = {target_of(u) for g in groups for u in as_list(props_of(t.resources.get(g, {})).get("UserIds"))}
        default = users.get("default")
        check(default is not None and default[0] in members
              and str(default[1].get("AccessString", "")).split()[:1] == ["off"],
              f"{name}: the group's required default user is off (AccessString starts with 'off')")
        wanted = {users[spec["user"]][0] for spec in redis_acl.USERS.values() if spec["user"] in users}
        wanted |= {users[redis_acl.LOADER["user"]][0]} if redis_acl.LOADER["user"] in users else set()
        check(members == wanted | ({default[0]} if default else set()),
              f"{name}: the group holds the default user, one user per function and the script loader, nothing else "
              f"(got {sorted(members)})")
    genv = t.globals.get("Environment", {}).get("Variables", {}) or {}
    check("REDIS_AUTH_SECRET_ARN" not in genv, "Globals: no REDIS_AUTH_SECRET_ARN (each function names its own Redis login)")
    logins = {}
    for name, fn in t.functions():
        binary = t.binary(fn)
        secret = target_of(t.env(fn).get("REDIS_AUTH_SECRET_ARN"))
        if binary not in redis_acl.USERS:
            check(secret is None, f"{name}: {binary} uses no Redis and gets no Redis login (got {secret})")
            continue
        user = redis_acl.USERS[binary]["user"]
        gen = props_of(t.resources.get(secret, {})).get("GenerateSecretString") or {}
        try:
            secret_user_name = json.loads(str(gen.get("SecretStringTemplate"))).get("username")
        except (ValueError, AttributeError):
            secret_user_name = None
        check(secret_user_name == user and gen.get("GenerateStringKey") == "token"
              and (t.number(gen.get("PasswordLength")) or 0) >= MIN_PASSWORD_LENGTH,
              f"{name}: REDIS_AUTH_SECRET_ARN is a generated login of {user} (got {secret}: username "
              f"{secret_user_name}, key {gen.get('GenerateStringKey')}, length {gen.get('PasswordLength')})")
        logins[name] = secret
        entry = users.get(user)
        check(entry is not None, f"{name}: an ElastiCache user named {user}")
        if entry is None:
            continue
        access = str(entry[1].get("AccessString", ""))
        check(access == redis_acl.access(binary),
              f"{entry[0]}: AccessString is scripts/redis_acl.py's for {binary} (got {access!r}, want "
              f"{redis_acl.access(binary)!r})")
        mode = entry[1].get("AuthenticationMode") or {}
        passwords = [sub_text(pw) for pw in as_list(mode.get("Passwords"))]
        check(mode.get("Type") == "password" and len(passwords) == 1
              and passwords[0] == "{{resolve:secretsmanager:${" + str(secret) + "}:SecretString:token}}",
              f"{entry[0]}: its password is the token of {secret}, the secret {name} reads (got {passwords})")
    for name, fn in t.functions():
        others = set(logins.values()) - {logins.get(name)}
        reads = secret_reads(t.evaluate(fn))
        check(not reads & others, f"{name}: reads no other function's Redis login (got {sorted(reads & others)})")
    check_script_loader(t, users)


# The functions that load the scripts into Redis as the loader (`Function::loads_scripts`):
# preheat at each run, seckill-migrate after migrating. No other may (it could run any text).
SCRIPT_LOADERS = {"preheat", "seckill-migrate"}


def check_script_loader(t: Template, users: dict) -> None:
    """The loader user has scripts/redis_acl.py's access string (SCRIPT LOAD, no key) and the
    token of its own generated secret as password; only the functions that load get that
    secret, and only they may read it."""
    entry = users.get(redis_acl.LOADER["user"])
    check(entry is not None, f"an ElastiCache user named {redis_acl.LOADER['user']} (the script loader)")
    if entry is None:
        return
    access = str(entry[1].get("AccessString", ""))
    check(access == redis_acl.LOADER["access"],
          f"{entry[0]}: AccessString is scripts/redis_acl.py's loader's (got {access!r}, want "
          f"{redis_acl.LOADER['access']!r})")
    passwords = [sub_text(pw) for pw in as_list((entry[1].get("AuthenticationMode") or {}).get("Passwords"))]
    secrets = {m.group(1) for pw in passwords for m in [re.match(r"^\{\{resolve:secretsmanager:\$\{(\w+)\}:SecretString:token\}\}$", pw)] if m}
    secret = next(iter(secrets)) if len(secrets) == 1 and len(passwords) == 1 else None
    gen = props_of(t.resources.get(secret, {})).get("GenerateSecretString") or {}
    try:
        secret_user = json.loads(str(gen.get("SecretStringTemplate"))).get("username")
    except (ValueError, AttributeError):
        secret_user = None
    check(secret is not None and secret_user == redis_acl.LOADER["user"]
          and (t.number(gen.get("PasswordLength")) or 0) >= MIN_PASSWORD_LENGTH,
          f"{entry[0]}: its password is the token of a generated secret of its own (got {passwords})")
    for name, fn in t.functions():
        given = target_of(t.env(fn).get("REDIS_LOADER_SECRET_ARN"))
        loads = t.binary(fn) in SCRIPT_LOADERS
        reads = secret in secret_reads(t.evaluate(fn))
        check((given == secret and reads) if loads else (given is None and not reads),
              f"{name}: {'gets and reads' if loads else 'neither gets nor reads'} the script loader's login "
              f"(REDIS_LOADER_SECRET_ARN {given}, reads it: {reads})")
