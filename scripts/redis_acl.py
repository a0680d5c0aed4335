#!/usr/bin/env python3
"""The Redis ACL user of each function: the one place that says what each may run.

A function's user may run its Lua scripts (EVALSHA only: it cannot load a script, so it runs no
text but the project's), the commands those scripts call (read from lua/*.lua,
with the functions of lua/prelude.lua each one calls, so a script that starts calling a new
command widens only the users that run it), the commands
the function sends itself, and what the client sends on every connection. Every key it may
touch starts with `seckill:` (the functions' SECKILL_KEY_PREFIX default); no other key, no
channel, no other command.

The scripts are loaded by one more user, the loader (`seckill-loader`): SCRIPT LOAD and nothing
else, no key. Preheat loads every script on every node at each run, and seckill-migrate after
each migration (`shared/src/store/scripts.rs`, `load_all`), logged in as the loader; no function
may load a script as itself.

    python3 scripts/redis_acl.py access FUNCTION    the access string of FUNCTION's user
    python3 scripts/redis_acl.py json               every user: name, access string, scripts
    python3 scripts/redis_acl.py prelude SCRIPT     the prelude's functions SCRIPT runs with
    python3 scripts/redis_acl.py loader             the loader's name and access string
    python3 scripts/redis_acl.py apply HOST:PORT... ACL SETUSER every user, with its local
                                                    password, on each server (scripts/stack.sh)
    python3 scripts/redis_acl.py template           rewrite template.yaml's AccessString of each
                                                    function's ElastiCache user to match

The same access strings are the template's AWS::ElastiCache::User AccessString values
(scripts/check-template.py compares them). Locally each user's password is
`local-<user name>` (scripts/env.sh's REDIS_ACL_PASSWORD_PREFIX), for tests only; in AWS each
user's password is its own generated secret.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

LUA = Path(__file__).resolve().parent.parent / "lua"

# Every key of the functions starts with the key prefix and a colon.
KEY_PATTERN = "seckill:*"

# What every user's connection sends besides its own commands: the script calls, the health
# check, and the cluster client's slot map. Not SCRIPT LOAD: a user that may load may run any
# text it likes (a `while true do end` stops a shard, and no user may kill it). Not CLIENT
# SETINFO: Redis 7.0/7.1 (ElastiCache's redis7) do not know it, and redis-rs ignores its refusal.
BASE = ("EVALSHA", "PING", "CLUSTER|SLOTS")

# The loader: loads the scripts (SCRIPT LOAD goes to every node of a cluster, replicas too, so a
# failover finds them), touches no key, runs nothing.
LOADER = {
    "user": "seckill-loader",
    "access": "on -@all +script|load +ping +cluster|slots",
}

# Per function (its binary's name): the scripts it runs, and the commands it sends itself; its
# user's name is functions/shape.toml's `redis_user`. The binaries test
# (tests/tests/binaries.rs) checks that no built binary carries a script its user does not list.
USERS: dict[str, dict] = {
    "seckill-entry": {
        "scripts": [
            "purchase.lua", "borrow.lua", "credit.lua", "give_back.lua", "settle.lua",
            "cancel_begin.lua", "mark_lost.lua", "restore_user.lua", "pool_leave.lua",
            "pool_restore.lua", "user_rate.lua",
        ],
        # The public view, a user's ledger entry and pool entry and a draw's state, the
        # buckets' stock. (A draw is reconcile's alone: its steps, its record and its orders.)
        "commands": ["HGET", "HMGET", "HGETALL"],
    },
    "order-consumer": {
        "scripts": ["give_back.lua", "settle.lua", "pool_restore.lua"],
        # The home buckets' stock of a batch's sales.
        "commands": ["HMGET"],
    },
    "preheat": {
        "scripts": [
            "preheat.lua", "rebuild_users.lua", "unload.lua", "pool_restore.lua",
            "lock_acquire.lua", "lock_renew.lua", "lock_release.lua", "lock_stamp.lua",
        ],
        "commands": ["HGET", "HMGET", "HEXISTS"],
    },
    "reconcile": {
        "scripts": [
            "snapshot.lua", "fix_stock.lua", "drop_user.lua", "mark_users.lua", "mark_lost.lua",
            "restore_user.lua", "give_back.lua", "settle.lua", "cancel_begin.lua", "credit.lua", "draw.lua", "draw_settle.lua",
            "pool_leave.lua", "preheat.lua", "rebuild_users.lua", "unload.lua",
            "pool_restore.lua",
            "lock_acquire.lua", "lock_renew.lua", "lock_release.lua", "lock_stamp.lua",
        ],
        # The orphan check's walk of a ledger, the stock of the buckets, pool entries.
        "commands": ["HGET", "HMGET", "HEXISTS", "HGETALL", "HKEYS", "HSCAN"],
    },
    "admin": {
        "scripts": [
            "adjust.lua", "preheat.lua", "rebuild_users.lua", "unload.lua", "snapshot.lua",
            "pool_restore.lua", "lock_acquire.lua", "lock_renew.lua", "lock_release.lua", "lock_stamp.lua",
        ],
        # The sale's detail: a bucket's ledger walked by HSCAN once it is too large to read in
        # one step.
        "commands": ["HGET", "HMGET", "HEXISTS", "HSCAN"],
    },
}

SHAPE = LUA.parent / "functions" / "shape.toml"
for _function, _spec in USERS.items():
    _spec["user"] = tomllib.loads(SHAPE.read_text())[_function]["redis_user"]

CALL = re.compile(r"""redis\.p?call\(\s*['"]([A-Za-z]+)['"]""")

# lua/prelude.lua's functions, each from `local function <name>(` at a line's start to the
# `end` alone on a line that closes it. The loader (shared/src/store/scripts.rs) puts before a
# script the ones it calls, and those they call; the same rule picks them here.
PRELUDE_FUNCTION = re.compile(r"^local function ([A-Za-z_]\w*)\(.*?^end$", re.M | re.S)


def code_of(text: str) -> str:
    """Lua text without its `--` comments (no script has `--` inside a string)."""
    return "\n".join(line.split("--")[0] for line in text.splitlines())


def calls(code: str, name: str) -> bool:
    """Whether `code` calls `name`: the name on its own (not a field), then `(`."""
    return re.search(r"(?<![\w.:])" + re.escape(name) + r"[ \t]*\(", code) is not None


def prelude_for(text: str) -> list[tuple[str, str]]:
    """The prelude's functions (name, text) a script calls, and those they call, in the
    prelude's order (a function calls only those above it)."""
    functions = [(m.group(1), m.group(0)) for m in PRELUDE_FUNCTION.finditer((LUA / "prelude.lua").read_text())]
    callers, taken = [code_of(text)], []
    for name, body in reversed(functions):
        if any(calls(code, name) for code in callers):
            callers.append(code_of(body))
            taken.append((name, body))
    return taken[::-1]


def script_commands(script: str) -> set[str]:
    """The commands one Lua script calls, itself or through the prelude's functions it calls
    (every call names its command as a literal)."""
    text = "\n".join([body for _, body in prelude_for((LUA / script).read_text())]
                     + [(LUA / script).read_text()])
    commands = {c.upper() for c in CALL.findall(text)}
    dynamic = re.search(r"""redis\.p?call\(\s*[^'"\s]""", text)
    if dynamic:
        raise SystemExit(f"{script}: a redis.call whose command is not a literal cannot be checked")
    return commands


def commands(function: str) -> list[str]:
    spec = USERS[function]
    found = set(spec["commands"])
    for script in spec["scripts"]:
        found |= script_commands(script)
    return sorted(found)


def access(function: str) -> str:
    """The ACL rules of FUNCTION's user, without a password and without `reset` (ElastiCache
    takes neither in an access string)."""
    allowed = list(BASE) + commands(function)
    return " ".join(["on", f"~{KEY_PATTERN}", "-@all"] + [f"+{c.lower()}" for c in allowed])


def local_password(user: str) -> str:
    return f"local-{user}"


def every_user() -> dict[str, dict]:
    return {
        function: {
            "user": spec["user"],
            "access": access(function),
            "scripts": sorted(spec["scripts"]),
        }
        for function, spec in USERS.items()
    }


def apply(servers: list[str]) -> None:
    logins = [(spec["user"], access(function)) for function, spec in USERS.items()]
    logins.append((LOADER["user"], LOADER["access"]))
    for server in servers:
        host, port = server.rsplit(":", 1)
        for user, rules_text in logins:
            rules = ["reset", f">{local_password(user)}"] + rules_text.split()
            out = subprocess.run(
                ["redis-cli", "-h", host, "-p", port, "ACL", "SETUSER", user, *rules],
                capture_output=True, text=True, check=False,
            )
            if out.returncode != 0 or out.stdout.strip() != "OK":
                raise SystemExit(f"ACL SETUSER {user} on {server}: {out.stdout}{out.stderr}".strip())


def rewrite_template(path: Path) -> None:
    """Sets the AccessString that follows each user's `UserName:` line in the template."""
    text = path.read_text()
    wanted = [(spec["user"], access(function)) for function, spec in USERS.items()]
    wanted.append((LOADER["user"], LOADER["access"]))
    for user, rules in wanted:
        pattern = re.compile(r'(UserName: ' + re.escape(user) + r'\n\s+AccessString: )"[^"]*"')
        text, n = pattern.subn(lambda m, rules=rules: m.group(1) + '"' + rules + '"', text)
        if n != 1:
            raise SystemExit(f"{path}: no AccessString after UserName: {user}")
    path.write_text(text)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "access" and argv[1] in USERS:
        print(access(argv[1]))
    elif len(argv) == 2 and argv[0] == "prelude" and (LUA / argv[1]).is_file():
        print(" ".join(name for name, _ in prelude_for((LUA / argv[1]).read_text())))
    elif argv == ["json"]:
        print(json.dumps(every_user(), indent=2))
    elif argv == ["loader"]:
        print(json.dumps(LOADER, indent=2))
    elif len(argv) >= 2 and argv[0] == "apply":
        apply(argv[1:])
    elif argv == ["template"]:
        rewrite_template(LUA.parent / "template.yaml")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
