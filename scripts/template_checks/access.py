"""What the functions may do and hold: the entry's IAM policy, no wildcard grants, which
secrets a function reads, and no secret value in any environment variable."""

from __future__ import annotations

from .model import Template, as_list, strings_in, target_of
from .report import check


# SendMessage for purchases and entries (it also authorizes SendMessageBatch, which a crowd's entries share);
# GetQueueAttributes for the deep health check. Both on the order queue only.
ENTRY_SQS_ACTIONS = {"sqs:SendMessage", "sqs:GetQueueAttributes"}
ENTRY_ACTIONS = ENTRY_SQS_ACTIONS | {"secretsmanager:GetSecretValue"}

# A secret value in an environment variable: a dynamic reference that resolves one, or a name
# that says it holds one.
SECRET_MARKERS = ("{{resolve:secretsmanager", "{{resolve:ssm-secure")
SECRET_NAME_WORDS = ("PASSWORD", "TOKEN", "SECRET", "PASSWD", "API_KEY")

# The shortest password a generated stack secret may have (the database and Redis logins, the
# origin secret).
MIN_PASSWORD_LENGTH = 32


def statements(fn: dict):
    """Inline statements of a function's Policies; anything else (managed policy names, SAM
    policy templates) is returned as an opaque item so callers can refuse it."""
    for pol in as_list(fn.get("Properties", {}).get("Policies") or []):
        if isinstance(pol, dict) and "Statement" in pol:
            for st in as_list(pol["Statement"]):
                yield st
        else:
            yield {"__opaque__": pol}


def secret_reads(fn: dict) -> set[str]:
    return {target_of(r) for st in statements(fn) if "__opaque__" not in st and st.get("Effect") == "Allow"
            and "secretsmanager:GetSecretValue" in as_list(st.get("Action")) for r in as_list(st.get("Resource"))}


def check_entry_policy(t: Template) -> None:
    entry = [(n, f) for n, f in t.functions() if t.binary(f) == "seckill-entry"]
    check(len(entry) == 1, "exactly one function builds seckill-entry")
    if not entry:
        return
    name, fn = entry[0][0], t.evaluate(entry[0][1])
    order_queues = {target_of(ev.get("Properties", {}).get("Queue"))
                    for _, f in t.functions()
                    for ev in (f.get("Properties", {}).get("Events") or {}).values() if ev.get("Type") == "SQS"}
    secrets = {n for n, r in t.resources.items() if r.get("Type") == "AWS::SecretsManager::Secret"}
    problems = []
    sends = 0
    for st in statements(fn):
        if "__opaque__" in st:
            problems.append(f"non-inline policy {st['__opaque__']!r}")
            continue
        if st.get("Effect") != "Allow":
            continue
        actions = set(as_list(st.get("Action")))
        resources = as_list(st.get("Resource"))
        if not actions <= ENTRY_ACTIONS:
            problems.append(f"actions {sorted(actions - ENTRY_ACTIONS)}")
        if actions & ENTRY_SQS_ACTIONS:
            sends += "sqs:SendMessage" in actions
            if not actions <= ENTRY_SQS_ACTIONS or {target_of(r) for r in resources} - order_queues:
                problems.append(f"sqs actions beyond the order queue: {resources}")
        if "secretsmanager:GetSecretValue" in actions and {target_of(r) for r in resources} - secrets:
            problems.append(f"secret read beyond the stack's secrets: {resources}")
    check(not problems and sends == 1,
          f"{name}: grants only sqs:SendMessage and sqs:GetQueueAttributes on the order queue (+ GetSecretValue on its secrets)"
          + (f" -- {problems}" if problems else ""))
    for other, f in t.functions():
        wild = [st for st in statements(t.evaluate(f)) if "__opaque__" not in st
                and ("*" in as_list(st.get("Action")) or "*" in as_list(st.get("Resource"))
                     or any(str(a).endswith(":*") for a in as_list(st.get("Action"))))]
        check(not wild, f"{other}: no wildcard action or resource in its inline policies")


def check_env_secrets(t: Template) -> None:
    sources = [("Globals", t.globals.get("Environment", {}).get("Variables", {}) or {})]
    sources += [(n, f.get("Properties", {}).get("Environment", {}).get("Variables", {}) or {}) for n, f in t.functions()]
    problems = []
    for where, variables in sources:
        for key, value in variables.items():
            if any(m in s for s in strings_in(value) for m in SECRET_MARKERS):
                problems.append(f"{where}.{key} resolves a secret into plain text")
            if target_of(value) in t.no_echo:
                problems.append(f"{where}.{key} holds NoEcho parameter {target_of(value)}")
            if any(w in key.upper() for w in SECRET_NAME_WORDS) and not key.upper().endswith(("_ARN", "_ARNS")):
                problems.append(f"{where}.{key} looks like a secret value (pass an ARN instead)")
    check(not problems, "no secret value in any environment variable (ARNs only)"
          + (f" -- {problems}" if problems else ""))
