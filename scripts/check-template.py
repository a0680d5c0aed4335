#!/usr/bin/env python3
"""Checks template.yaml for what cfn-lint does not catch (see /TOOLCHAIN.md "Lambda tooling").

Run with the project venv's python (it has cfn-lint, whose YAML loader understands !Ref/!GetAtt):

    .tools/venv/bin/python scripts/check-template.py [template.yaml] [--no-samconfig] [--no-lint]
    .tools/venv/bin/python scripts/check-template.py --self-test
    .tools/venv/bin/python scripts/check-template.py --budget   (docs/capacity.md's time budgets)

Parameters resolve to their defaults, overridden by `parameter_overrides` in samconfig.toml
([default.deploy.parameters]) when that file sets any, so what gets deployed is what is checked.
Every check runs in three modes: EdgeProtection=off, =on (CloudFront + WAF, with a sample
EdgeDomainName and EdgeCertificateArn, which the edge requires) and =on with Storefront=true;
a copy of the template with the edge, Bot Control and the storefront defaulting to on goes
through cfn-lint and `sam validate --lint` (the Makefile lints the file as it is, the "off"
mode); --no-lint skips that copy. Prints one line per check; exits 1 if any fails.

--self-test proves the checks can fail: it breaks template.yaml in memory one way at a time
(a budget over the account, a reservation below SQS's concurrency, an unthrottled public
route, a cached per-user route, a missing WAF rule, open egress, a function holding the master
secret, an origin without the origin secret, TLS 1.0 at the edge, a user route without its
scope, a dashboard naming a metric no code emits, a public storefront bucket, the entry's
Timeout below its time budget, a role's connection limit below its function's pool, ...) and
exits 1 unless each broken copy fails exactly the check meant to catch it and
the unbroken template passes in every mode. A check the unbroken template already fails (say a
dashboard metric the Rust code does not emit yet) is reported and fails the self-test, but does
not hide what each breakage adds.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import unquote

try:
    from cfnlint.decode import cfn_yaml
except ImportError:  # pragma: no cover - run with the wrong python
    sys.exit("check-template: needs cfn-lint; run it with .tools/venv/bin/python (make stack installs it)")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import redis_acl  # noqa: E402  (scripts/redis_acl.py: the functions' Redis ACL users)
FUNCTION = "AWS::Serverless::Function"
# shared::Config's default when DB_MAX_CONNECTIONS is unset (`--help` on any function shows it).
DEFAULT_DB_MAX_CONNECTIONS = 4
# SendMessage for purchases; GetQueueAttributes for the deep health check. Both on the order queue only.
ENTRY_SQS_ACTIONS = {"sqs:SendMessage", "sqs:GetQueueAttributes"}
ENTRY_ACTIONS = ENTRY_SQS_ACTIONS | {"secretsmanager:GetSecretValue"}
# AWS keeps this much of an account's Lambda concurrency unreserved: reservations beyond
# AccountConcurrency - 100 fail the deploy.
UNRESERVED_MINIMUM = 100
SECRET_MARKERS = ("{{resolve:secretsmanager", "{{resolve:ssm-secure")
SECRET_NAME_WORDS = ("PASSWORD", "TOKEN", "SECRET", "PASSWD", "API_KEY")

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


NO_VALUE = {"Ref": "AWS::NoValue"}
# The region `sam validate` and cfn-lint assume here; conditions on AWS::Region evaluate with it.
REGION = "us-east-1"
# The edge needs a domain and an ACM certificate in us-east-1 (TLS 1.2 cannot be enforced on
# CloudFront's default certificate): samples for the "on" modes and the lint copy.
SAMPLE_DOMAIN = "api.example.com"
SAMPLE_CERTIFICATE = "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"
EDGE_ON = {"EdgeProtection": "on", "EdgeDomainName": SAMPLE_DOMAIN, "EdgeCertificateArn": SAMPLE_CERTIFICATE}
# Every check runs in each mode; the lint copy turns every switch on at once.
EDGE_MODES = (("EdgeProtection=off", {"EdgeProtection": "off"}),
              ("EdgeProtection=on", EDGE_ON),
              ("EdgeProtection=on, Storefront=true", {**EDGE_ON, "Storefront": "true"}))
LINT_DEFAULTS = {"EdgeProtection": '"on"', "EdgeBotControl": '"on"', "Storefront": '"true"',
                 "EdgeDomainName": SAMPLE_DOMAIN, "EdgeCertificateArn": SAMPLE_CERTIFICATE}


class Template:
    def __init__(self, path: Path, use_samconfig: bool, overrides: dict | None = None):
        self.doc = cfn_yaml.load(str(path))
        self.resources = self.doc.get("Resources", {})
        self.params = {k: v.get("Default") for k, v in self.doc.get("Parameters", {}).items()}
        self.no_echo = {k for k, v in self.doc.get("Parameters", {}).items() if str(v.get("NoEcho")).lower() == "true"}
        self.overrides: dict[str, str] = {}
        samconfig = path.parent / "samconfig.toml"
        if use_samconfig and samconfig.exists():
            conf = tomllib.loads(samconfig.read_text())
            raw = conf.get("default", {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides")
            items = raw if isinstance(raw, list) else shlex.split(raw or "")
            for item in items:
                key, _, value = item.partition("=")
                self.overrides[key] = value
            self.params.update(self.overrides)
        self.params.update(overrides or {})
        self.param_types = {k: v.get("Type") for k, v in self.doc.get("Parameters", {}).items()}
        self.conditions = self.doc.get("Conditions", {})
        self.globals = self.doc.get("Globals", {}).get("Function", {})

    def with_params(self, **params) -> "Template":
        """The same template with some parameters set otherwise (a shallow copy)."""
        other = copy.copy(self)
        other.params = {**self.params, **params}
        return other

    def value(self, v):
        """A literal, a parameter's value (lists for CommaDelimitedList), AWS::Region, or a Join."""
        if isinstance(v, dict) and set(v) == {"Ref"}:
            name = v["Ref"]
            if name == "AWS::Region":
                return REGION
            if name not in self.params:
                raise ValueError(f"cannot evaluate Ref {name}")
            val = self.params[name]
            if self.param_types.get(name) == "CommaDelimitedList":
                return val if isinstance(val, list) else str(val if val is not None else "").split(",")
            return val
        if isinstance(v, dict) and set(v) == {"Fn::Join"}:
            sep, items = v["Fn::Join"]
            items = self.value(items)
            return sep.join(str(self.value(i)) for i in as_list(items))
        return v

    def condition(self, name: str) -> bool:
        c = self.conditions[name]
        return self._truth(c)

    def _truth(self, c) -> bool:
        (fn, args), = c.items()
        if fn == "Fn::Equals":
            a, b = (self.value(x) for x in args)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not self._truth(args[0])
        if fn == "Fn::And":
            return all(self._truth(x) for x in args)
        if fn == "Fn::Or":
            return any(self._truth(x) for x in args)
        if fn == "Condition":
            return self.condition(args)
        raise ValueError(f"cannot evaluate condition {c!r}")

    def rule_truth(self, c) -> bool:
        """A Rules condition or assertion (the functions Rules allow that this template uses)."""
        (fn, args), = c.items()
        if fn == "Fn::Equals":
            a, b = (self.value(x) for x in args)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not self.rule_truth(args[0])
        if fn == "Fn::And":
            return all(self.rule_truth(x) for x in args)
        if fn == "Fn::Or":
            return any(self.rule_truth(x) for x in args)
        if fn == "Fn::EachMemberEquals":
            items, want = self.value(args[0]), self.value(args[1])
            return all(str(i) == str(want) for i in as_list(items))
        if fn == "Fn::Contains":
            items, want = self.value(args[0]), self.value(args[1])
            return str(want) in [str(i) for i in as_list(items)]
        raise ValueError(f"cannot evaluate rule function {c!r}")

    def refusals(self, **params) -> list[str]:
        """The Rules whose assertions refuse the template's defaults with these parameters set."""
        m = copy.copy(self)
        m.params = {**{k: v.get("Default") for k, v in self.doc.get("Parameters", {}).items()}, **params}
        refused = []
        for name, rule in (self.doc.get("Rules") or {}).items():
            if "RuleCondition" in rule and not m.rule_truth(rule["RuleCondition"]):
                continue
            if not all(m.rule_truth(a["Assert"]) for a in rule.get("Assertions") or []):
                refused.append(name)
        return refused

    def active(self, resource: dict) -> bool:
        """Whether a resource (or output) is created with the current parameters."""
        cond = resource.get("Condition")
        return cond is None or self.condition(cond)

    def evaluate(self, v):
        """v with every Fn::If decided and every AWS::NoValue dropped; other intrinsics stay."""
        if isinstance(v, dict):
            if set(v) == {"Fn::If"}:
                cond, yes, no = v["Fn::If"]
                return self.evaluate(yes if self.condition(cond) else no)
            out = {}
            for k, x in v.items():
                x = self.evaluate(x)
                if x != NO_VALUE:
                    out[k] = x
            return out
        if isinstance(v, list):
            return [x for x in (self.evaluate(i) for i in v) if x != NO_VALUE]
        return v

    def of_type(self, type_: str) -> list[tuple[str, dict]]:
        """The resources of a type that exist with the current parameters."""
        return [(n, r) for n, r in self.resources.items() if r.get("Type") == type_ and self.active(r)]

    def resolve(self, value):
        """A literal, or a Ref to a parameter (its default / override); None when unknowable."""
        if isinstance(value, dict) and set(value) == {"Ref"}:
            name = value["Ref"]
            return self.params.get(name) if name in self.params else None
        if isinstance(value, dict) and set(value) == {"Fn::If"}:
            # Both branches must pass; callers handle lists. Return the first non-NoValue branch.
            for branch in value["Fn::If"][1:]:
                if branch != {"Ref": "AWS::NoValue"}:
                    return self.resolve(branch)
            return None
        return value

    def number(self, value) -> float | None:
        v = self.resolve(value)
        try:
            return float(v)
        except (TypeError, ValueError):
            return None

    def prop(self, fn: dict, name: str):
        props = fn.get("Properties", {})
        return props[name] if name in props else self.globals.get(name)

    def env(self, fn: dict) -> dict:
        merged = dict(self.globals.get("Environment", {}).get("Variables", {}) or {})
        merged.update(fn.get("Properties", {}).get("Environment", {}).get("Variables", {}) or {})
        return merged

    def functions(self):
        return [(n, r) for n, r in self.resources.items() if r.get("Type") == FUNCTION]

    def reserved(self, fn: dict) -> float | None:
        """A function's ReservedConcurrentExecutions (with ReserveConcurrency=true), or None."""
        props = fn.get("Properties", {})
        if "ReservedConcurrentExecutions" not in props:
            return None
        return self.number(props["ReservedConcurrentExecutions"])

    @staticmethod
    def binary(fn: dict) -> str | None:
        return fn.get("Metadata", {}).get("BuildProperties", {}).get("Binary")


def target_of(ref) -> str | None:
    """The logical id a Ref / GetAtt points at."""
    if isinstance(ref, dict):
        if "Ref" in ref:
            return ref["Ref"]
        if "Fn::GetAtt" in ref:
            att = ref["Fn::GetAtt"]
            return att[0] if isinstance(att, list) else str(att).split(".")[0]
    return None


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def num(v: float | None) -> str:
    return "none" if v is None else f"{v:g}"


def as_list(v):
    return v if isinstance(v, list) else [v]


# Never walked for manifests: build output and tools, where a cargo build running meanwhile
# creates and deletes directories (a glob over them fails with FileNotFoundError).
SKIPPED_DIRS = {"target", ".tools", ".git"}


def cargo_manifests() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        if "Cargo.toml" in files:
            found.append(Path(root) / "Cargo.toml")
    return sorted(found)


def workspace_binaries(only_default_members: bool = False) -> set[str]:
    """Package names (default bin) and [[bin]] names of every Cargo.toml in the workspace, or
    only of its default members (what `sam build`'s `cargo lambda build --bin X` at the root
    selects)."""
    names = set()
    cargos = cargo_manifests()
    if only_default_members:
        root = tomllib.loads((REPO / "Cargo.toml").read_text())
        cargos = [REPO / m / "Cargo.toml" for m in root.get("workspace", {}).get("default-members", [])]
    for cargo in cargos:
        if SKIPPED_DIRS & set(cargo.relative_to(REPO).parts):
            continue
        try:
            doc = tomllib.loads(cargo.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        pkg = doc.get("package", {}).get("name")
        if pkg and (cargo.parent / "src" / "main.rs").exists():
            names.add(pkg)
        for b in doc.get("bin", []):
            if "name" in b:
                names.add(b["name"])
        bin_dir = cargo.parent / "src" / "bin"
        if bin_dir.is_dir():
            names.update(p.stem for p in bin_dir.glob("*.rs"))
            names.update(p.name for p in bin_dir.iterdir() if (p / "main.rs").exists())
    return names


# What shared::Config requires of every function (DATABASE_URL may come from its secret).
REQUIRED_ENV = (("REDIS_URL",), ("ORDER_QUEUE_URL",), ("DATABASE_URL", "DATABASE_SECRET_ARN"))


def check_functions(t: Template) -> None:
    bins = workspace_binaries()
    deployed = workspace_binaries(only_default_members=True)
    for name, fn in t.functions():
        runtime = t.prop(fn, "Runtime")
        arch = t.prop(fn, "Architectures")
        method = fn.get("Metadata", {}).get("BuildMethod")
        binary = t.binary(fn)
        check(
            runtime == "provided.al2023" and arch == ["arm64"] and method == "rust-cargolambda" and bool(binary),
            f"{name}: provided.al2023, arm64, rust-cargolambda, Binary={binary} "
            f"(got {runtime}, {arch}, {method})",
        )
        check(binary in bins, f"{name}: binary {binary} is a bin of the workspace")
        check(binary in deployed,
              f"{name}: binary {binary} is built by a default member (no test features unified in)")
        env = t.env(fn)
        missing = [" or ".join(alts) for alts in REQUIRED_ENV if not any(a in env for a in alts)]
        check(not missing, f"{name}: sets every variable Config requires (missing: {missing})")


def check_queue_and_consumer(t: Template) -> None:
    consumers = []
    for name, fn in t.functions():
        for ev_name, ev in (fn.get("Properties", {}).get("Events") or {}).items():
            if ev.get("Type") == "SQS":
                consumers.append((name, fn, ev_name, ev.get("Properties", {})))
    check(len(consumers) >= 1, f"an SQS-triggered consumer exists ({[c[0] for c in consumers]})")
    for name, fn, ev_name, ev in consumers:
        timeout = t.number(t.prop(fn, "Timeout")) or 3.0
        queue_id = target_of(ev.get("Queue"))
        queue = t.resources.get(queue_id, {}).get("Properties", {})
        vis = t.number(queue.get("VisibilityTimeout", 30))
        check(
            vis is not None and vis >= 6 * timeout,
            f"{queue_id}.VisibilityTimeout {vis:g} >= 6 x {name}.Timeout {timeout:g} = {6 * timeout:g}",
        )
        redrive = queue.get("RedrivePolicy") or {}
        mrc = t.number(redrive.get("maxReceiveCount"))
        check(mrc is not None and mrc >= 5, f"{queue_id} has a DLQ with maxReceiveCount {mrc} >= 5")

        batch = t.number(ev.get("BatchSize", 10))
        window = t.number(ev.get("MaximumBatchingWindowInSeconds", 0)) or 0
        check(batch is not None and batch <= 100, f"{name}.{ev_name} BatchSize {batch:g} <= 100")
        check(
            batch is not None and (batch <= 10 or window > 0),
            f"{name}.{ev_name} BatchSize {batch:g} > 10 only with a batching window (window {window:g} s)",
        )
        check(
            "ReportBatchItemFailures" in (ev.get("FunctionResponseTypes") or []),
            f"{name}.{ev_name} FunctionResponseTypes has ReportBatchItemFailures",
        )

        max_conc = t.number((ev.get("ScalingConfig") or {}).get("MaximumConcurrency"))
        check(max_conc is not None and max_conc >= 2, f"{name}.{ev_name} ScalingConfig.MaximumConcurrency {max_conc} >= 2")
        reserved = t.reserved(fn)
        if reserved is not None and max_conc is not None:
            check(
                reserved >= max_conc,
                f"{name}: ReservedConcurrentExecutions {reserved:g} >= {ev_name} MaximumConcurrency {max_conc:g}"
                " (else SQS's invocations are throttled)",
            )
        # The most instances that can hold connections at once: the reservation caps the
        # function; without one, SQS's MaximumConcurrency does.
        instances, bound = (reserved, "ReservedConcurrentExecutions") if reserved is not None \
            else (max_conc, "MaximumConcurrency")
        db_conns = t.number(t.env(fn).get("DB_MAX_CONNECTIONS")) or DEFAULT_DB_MAX_CONNECTIONS
        budget = t.number({"Ref": "DbConnectionBudget"})
        check(budget is not None, f"parameter DbConnectionBudget exists (value {budget})")
        if instances is not None and budget is not None:
            check(
                instances * db_conns <= budget,
                f"{name}: {bound} {instances:g} x DB_MAX_CONNECTIONS {db_conns:g} = {instances * db_conns:g}"
                f" <= DbConnectionBudget {budget:g}",
            )


def statements(fn: dict):
    """Inline statements of a function's Policies; anything else (managed policy names, SAM
    policy templates) is returned as an opaque item so callers can refuse it."""
    for pol in as_list(fn.get("Properties", {}).get("Policies") or []):
        if isinstance(pol, dict) and "Statement" in pol:
            for st in as_list(pol["Statement"]):
                yield st
        else:
            yield {"__opaque__": pol}


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


LOCAL_ENV = REPO / "events" / "env.json"
# The local stack's addresses: scripts/env.sh is the one place that names them.
LOCAL_STACK_VARIABLES = ("DATABASE_URL", "REDIS_URL", "ORDER_QUEUE_URL", "AWS_ENDPOINT_URL_SQS")


def env_sh_defaults() -> dict[str, str]:
    """The `: "${NAME:=value}"` defaults of scripts/env.sh."""
    text = (REPO / "scripts" / "env.sh").read_text()
    return dict(re.findall(r'^: "\$\{([A-Z0-9_]+):=([^}]*)\}"', text, flags=re.M))


def check_local_invoke(t: Template) -> None:
    """`sam local invoke` (samconfig's local_invoke) runs each function on the local stack:
    events/env.json may only override variables the template declares (SAM ignores the rest),
    points the stack's addresses where scripts/env.sh does, and blanks every secret ARN so
    nothing is read from AWS; every HTTP route has its event under events/."""
    local = json.loads(LOCAL_ENV.read_text())
    samconfig = tomllib.loads((REPO / "samconfig.toml").read_text())
    local_invoke = samconfig.get("default", {}).get("local_invoke", {}).get("parameters", {})
    check(local_invoke.get("env_vars") == "events/env.json",
          f"samconfig.toml's local_invoke reads events/env.json (got {local_invoke.get('env_vars')!r})")
    shared = local.get("Parameters", {})
    defaults = env_sh_defaults()
    check(all(shared.get(v) == defaults.get(v) for v in LOCAL_STACK_VARIABLES),
          "events/env.json points the functions where scripts/env.sh points the local stack "
          f"({[v for v in LOCAL_STACK_VARIABLES if shared.get(v) != defaults.get(v)]} differ)")
    for name, fn in t.functions():
        declared = {k for k, v in t.env(fn).items() if t.evaluate(v) != NO_VALUE}
        mine = {**shared, **local.get(name, {})}
        needed = set(local.get(name, {})) | (set(LOCAL_STACK_VARIABLES) & set(shared))
        undeclared = sorted(needed - declared)
        secrets = sorted(k for k in declared if k.endswith(("_ARN", "_ARNS")) and mine.get(k) != "")
        check(not undeclared and not secrets,
              f"{name}: sam local invoke with events/env.json points it at the local stack and blanks every "
              f"secret ARN (not declared, so SAM would ignore them: {undeclared}; ARNs not blanked: {secrets})")
    missing = sorted({f"{str(ev.get('Method')).upper()} {ev.get('Path')}" for _, _, ev in http_api_events(t)}
                     - event_route_keys(t))
    check(not missing, f"every HTTP route has its event under events/ (missing: {missing})")


def event_route_keys(t: Template) -> set[str]:
    """The route keys of the API Gateway events under events/ (a breakage may stand in its own)."""
    if "event_route_keys" in t.__dict__:
        return t.__dict__["event_route_keys"]
    return {json.loads(f.read_text()).get("routeKey") for f in (REPO / "events").glob("*.json")}


def check_concurrency(t: Template) -> None:
    """The entry is capped, the consumer has a share a purchase flood cannot take, and every
    reservation together leaves AWS its unreserved minimum."""
    for binary, why in (("seckill-entry", "its cap under a purchase flood"),
                        ("order-consumer", "so an entry flood cannot starve it")):
        fns = [(n, f) for n, f in t.functions() if t.binary(f) == binary]
        for name, fn in fns:
            r = t.reserved(fn)
            check(r is not None and r >= 1, f"{name}: ReservedConcurrentExecutions {num(r)} set ({why})")
    reserved = {name: t.reserved(fn) for name, fn in t.functions() if t.reserved(fn) is not None}
    account = t.number({"Ref": "AccountConcurrency"})
    check(account is not None, f"parameter AccountConcurrency exists (value {num(account)})")
    if account is not None:
        total = sum(reserved.values())
        parts = " + ".join(f"{n.removesuffix('Function')} {v:g}" for n, v in reserved.items())
        check(
            total <= account - UNRESERVED_MINIMUM,
            f"reserved concurrency {parts} = {total:g} <= AccountConcurrency {account:g}"
            f" - {UNRESERVED_MINIMUM} unreserved = {account - UNRESERVED_MINIMUM:g}",
        )


def http_api_events(t: Template):
    for name, fn in t.functions():
        for ev_name, ev in (fn.get("Properties", {}).get("Events") or {}).items():
            if ev.get("Type") == "HttpApi":
                yield name, ev_name, ev.get("Properties", {})


def auth_of(t: Template, ev: dict) -> str:
    """The authorizer a route's event ends up with: its own, else its API's default."""
    own = (ev.get("Auth") or {}).get("Authorizer")
    if own:
        return own
    api = t.resources.get(target_of(ev.get("ApiId")), {}).get("Properties", {})
    return (api.get("Auth") or {}).get("DefaultAuthorizer") or "NONE"


JWT_AUTHORIZER = "JwtAuthorizer"


def check_route_throttles(t: Template) -> None:
    """Every route that needs no token (no auth, or IAM) has a throttle of its own, at most the stage's."""
    apis = {n: r for n, r in t.resources.items() if r.get("Type") == "AWS::Serverless::HttpApi"}
    for fn_name, ev_name, ev in http_api_events(t):
        auth = auth_of(t, ev)
        if auth == JWT_AUTHORIZER:
            continue
        route = f"{ev.get('Method', '').upper()} {ev.get('Path')}"
        api = apis.get(target_of(ev.get("ApiId")), {}).get("Properties", {})
        stage = api.get("DefaultRouteSettings") or {}
        own = ev.get("RouteSettings") or (api.get("RouteSettings") or {}).get(route) or {}
        for limit in ("ThrottlingRateLimit", "ThrottlingBurstLimit"):
            mine, default = t.number(own.get(limit)), t.number(stage.get(limit))
            check(
                mine is not None and default is not None and mine <= default,
                f"{route} ({'no token' if auth == 'NONE' else auth}, {fn_name}.{ev_name}): {limit} {num(mine)}"
                f" <= the stage's {num(default)}",
            )


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


# ---------------------------------------------------------------- stage and logs


def sub_text(v) -> str:
    """A literal string, or the template string of a Fn::Sub."""
    if isinstance(v, dict) and "Fn::Sub" in v:
        v = v["Fn::Sub"]
        v = v[0] if isinstance(v, list) else v
    return v if isinstance(v, str) else ""


def param_ref(t: Template, v) -> str | None:
    """The parameter a value is a plain Ref to, or None."""
    name = target_of(v) if isinstance(v, dict) and set(v) == {"Ref"} else None
    return name if name in t.params else None


# The access log must carry these (key -> the context variable).
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "routeKey": "$context.routeKey",
    "status": "$context.status",
    "latency": "$context.responseLatency",
}


def check_stage(t: Template) -> None:
    for name, api in t.of_type("AWS::Serverless::HttpApi"):
        props = api.get("Properties", {})
        stage = props.get("DefaultRouteSettings") or {}
        refs = {k: param_ref(t, stage.get(k)) for k in ("ThrottlingRateLimit", "ThrottlingBurstLimit")}
        values = {k: t.number(stage.get(k)) for k in refs}
        check(all(refs.values()) and all(v is not None and v >= 1 for v in values.values()),
              f"{name}: stage throttling (DefaultRouteSettings rate and burst) from parameters {refs}, values {values}")
        logs = props.get("AccessLogSettings") or {}
        dest = target_of(logs.get("DestinationArn"))
        problems = []
        if t.resources.get(dest, {}).get("Type") != "AWS::Logs::LogGroup":
            problems.append(f"DestinationArn is not a log group of the stack ({logs.get('DestinationArn')!r})")
        try:
            fmt = json.loads(str(logs.get("Format")))
        except ValueError:
            fmt = None
            problems.append("Format is not one JSON object")
        if isinstance(fmt, dict):
            problems += [f"{k} is not {v}" for k, v in ACCESS_LOG_FIELDS.items() if fmt.get(k) != v]
            leaks = [k for k, v in fmt.items() if re.search(r"authorization|\$request\.header", f"{k} {v}", re.I)]
            if leaks:
                problems.append(f"logs request headers / Authorization: {leaks}")
        check(not problems, f"{name}: JSON access log to a stack log group with {sorted(ACCESS_LOG_FIELDS)}, "
              "no Authorization header" + (f" -- {problems}" if problems else ""))


def check_log_groups(t: Template) -> None:
    retention = "LogRetentionDays"
    check(retention in t.params, f"parameter {retention} exists")
    for name, group in t.of_type("AWS::Logs::LogGroup"):
        days = group.get("Properties", {}).get("RetentionInDays")
        check(param_ref(t, days) == retention,
              f"{name}: log group retention RetentionInDays from {retention} (got {days!r})")
    seen: dict[str, str] = {}
    for name, fn in t.functions():
        config = {**(t.globals.get("LoggingConfig") or {}), **(fn.get("Properties", {}).get("LoggingConfig") or {})}
        group_id = target_of(config.get("LogGroup"))
        group = t.resources.get(group_id, {})
        group_name = sub_text(group.get("Properties", {}).get("LogGroupName"))
        ok = (group.get("Type") == "AWS::Logs::LogGroup" and t.active(group)
              and group_name.startswith("/aws/lambda/") and group_id not in seen and config.get("LogFormat") == "JSON")
        check(ok, f"{name}: writes JSON to its own log group /aws/lambda/... (LoggingConfig.LogGroup {group_id}"
              f" {group_name!r}{', shared with ' + seen[group_id] if group_id in seen else ''})")
        if group_id:
            seen.setdefault(group_id, name)
        level = config.get("ApplicationLogLevel")
        check(param_ref(t, level) == "LogLevel",
              f"{name}: logs at Lambda's ApplicationLogLevel from LogLevel, which the function reads as "
              f"AWS_LAMBDA_LOG_LEVEL (got {level!r})")


# ---------------------------------------------------------------- network


# The network modes the template supports: its own VPC, or given subnets.
NETWORK_MODES = (("created VPC", {"VpcId": "", "PrivateSubnetIds": ""}),
                 ("given VPC", {"VpcId": "vpc-0given", "PrivateSubnetIds": "subnet-0a,subnet-0b"}))


def egress_rules(t: Template, sg: str) -> list[dict]:
    rules = [dict(r, _inline=True) for r in t.evaluate(t.resources[sg].get("Properties", {}).get("SecurityGroupEgress") or [])]
    for _, r in t.of_type("AWS::EC2::SecurityGroupEgress"):
        props = t.evaluate(r.get("Properties", {}))
        if target_of(props.get("GroupId")) == sg:
            rules.append(props)
    return rules


def check_egress(t: Template) -> None:
    """The functions' security group lets out PostgreSQL to the proxy, Redis, and HTTPS only."""
    for mode, params in NETWORK_MODES:
        m = t.with_params(**params)
        sgs = {target_of(g) for g in as_list((m.globals.get("VpcConfig") or {}).get("SecurityGroupIds") or [])}
        for _, fn in m.functions():
            sgs |= {target_of(g) for g in as_list((fn.get("Properties", {}).get("VpcConfig") or {}).get("SecurityGroupIds") or [])}
        proxy_sgs = {target_of(g) for _, r in m.of_type("AWS::RDS::DBProxy")
                     for g in as_list(r["Properties"].get("VpcSecurityGroupIds") or [])}
        redis_sgs = {target_of(g) for _, r in m.of_type("AWS::ElastiCache::ReplicationGroup")
                     for g in as_list(r["Properties"].get("SecurityGroupIds") or [])}
        endpoint_sgs = {target_of(g) for _, r in m.of_type("AWS::EC2::VPCEndpoint")
                        for g in as_list(r["Properties"].get("SecurityGroupIds") or [])}
        for sg in sorted(s for s in sgs if s):
            rules = egress_rules(m, sg)
            problems, reaches = [], set()
            if not any(r.get("_inline") for r in rules):
                problems.append("no inline egress rule, so EC2's default allow-all stays")
            for r in rules:
                proto, lo, hi = str(r.get("IpProtocol")), r.get("FromPort"), r.get("ToPort")
                dest = target_of(r.get("DestinationSecurityGroupId"))
                cidr = r.get("CidrIp") or r.get("CidrIpv6")
                if proto == "-1" and cidr == "127.0.0.1/32" and r.get("_inline"):
                    continue  # the placeholder that removes the default rule
                if proto != "tcp" or lo != hi:
                    problems.append(f"{proto} {lo}-{hi} to {dest or cidr}")
                elif lo == 5432 and dest in proxy_sgs:
                    reaches.add("proxy")
                elif lo == 6379 and dest in redis_sgs:
                    reaches.add("redis")
                elif lo == 443 and (dest in endpoint_sgs or (not endpoint_sgs and cidr == "0.0.0.0/0")):
                    reaches.add("https")
                else:
                    problems.append(f"tcp {lo} to {dest or cidr}")
            missing = {"proxy", "redis", "https"} - reaches
            if missing:
                problems.append(f"cannot reach {sorted(missing)}")
            check(not problems, f"{sg} ({mode}): egress only 5432 to RDS Proxy, 6379 to Redis, 443 to "
                  f"{'the endpoints' if endpoint_sgs else 'HTTPS'}" + (f" -- {problems}" if problems else ""))


# ---------------------------------------------------------------- database


def check_database(t: Template) -> None:
    for name, db in t.of_type("AWS::RDS::DBCluster"):
        prop = db.get("Properties", {}).get("DeletionProtection")
        param = param_ref(t, prop)
        default = str(t.doc.get("Parameters", {}).get(param, {}).get("Default")).lower() if param else None
        check(param is not None and default == "true",
              f"{name}: DeletionProtection from a parameter defaulting to true (got {prop!r}, default {default})")
        check(db.get("DeletionPolicy") == "Snapshot" and db.get("UpdateReplacePolicy") == "Snapshot",
              f"{name}: DeletionPolicy and UpdateReplacePolicy Snapshot")


# The PostgreSQL login role each function's binary uses (the roles' migration creates them);
# the migrate binary alone logs in as the master and sets the roles' passwords.
DB_ROLE_OF_BINARY = {
    "seckill-entry": "seckill_entry",
    "order-consumer": "seckill_consumer",
    "preheat": "seckill_preheat",
    "reconcile": "seckill_reconcile",
    "admin": "seckill_admin",
}
MIGRATE_BINARY = "seckill-migrate"
MIN_PASSWORD_LENGTH = 32


def refs_in(value) -> set[str]:
    """Every logical id a value names (Ref, GetAtt, ${X} in Sub)."""
    found = set()
    if isinstance(value, dict):
        t = target_of(value)
        if t:
            found.add(t)
        for k, v in value.items():
            if k == "Fn::Sub":
                found |= set(re.findall(r"\$\{([A-Za-z0-9]+)[.}]", "".join(strings_in(v))))
            found |= refs_in(v)
    elif isinstance(value, list):
        for v in value:
            found |= refs_in(v)
    return found


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


def secret_reads(fn: dict) -> set[str]:
    return {target_of(r) for st in statements(fn) if "__opaque__" not in st and st.get("Effect") == "Allow"
            and "secretsmanager:GetSecretValue" in as_list(st.get("Action")) for r in as_list(st.get("Resource"))}


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
        uses_redis = {target_of(v) for k, v in t.env(fn).items() if k == "REDIS_AUTH_SECRET_ARN"} or redis
        if binary == MIGRATE_BINARY:
            joined = own_env.get("DATABASE_ROLE_SECRET_ARNS")
            parts = joined.get("Fn::Join") if isinstance(joined, dict) else None
            listed = {target_of(x) for x in as_list(parts[1])} if parts and parts[0] == "," else set()
            check(secret == master, f"{name}: DATABASE_SECRET_ARN is the master secret {master} (got {secret})")
            check(listed == set(roles.values()) and len(as_list(parts[1])) == len(roles),
                  f"{name}: DATABASE_ROLE_SECRET_ARNS joins every role's secret with ',' (got {sorted(listed)})")
            check(reads == {master} | set(roles.values()),
                  f"{name}: reads the master and every role secret, nothing else (got {sorted(reads)})")
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
        check(members == wanted | ({default[0]} if default else set()),
              f"{name}: the group holds the default user and one user per function, nothing else (got {sorted(members)})")
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


def props_of(resource: dict) -> dict:
    return resource.get("Properties", {}) or {}


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


# ---------------------------------------------------------------- time budgets
# Every step on a function's path has a bound; in sequence they must end, with margin, before
# the function's Timeout: an invocation Lambda kills mid-path leaves its protocol half done and
# its caller with the gateway's error instead of ours. The bounds come from where they are set:
# shared::Config's defaults (its clap `default_value`s) overridden by the function's
# environment in the template, the constants in the Rust sources, RDS Proxy's borrow timeout in
# the template, and the roles' statement timeouts in migrations/. docs/capacity.md, "Time
# budgets", is `--budget`'s output.

CONFIG_RS = REPO / "shared" / "src" / "infra" / "config.rs"
# The least margin a path leaves before its function's Timeout: the runtime's own work, and
# the answer's way out.
MIN_MARGIN_SECS = 1.0
MIN_MARGIN_FRACTION = 0.05
# What each role's CONNECTION LIMIT adds to its function's reservation x pool size (the
# migration's header says what for).
ROLE_CONNECTION_HEADROOM = 10


def config_defaults() -> dict[str, str]:
    """shared::Config's default of each variable: the `default_value` of every `#[arg(...)]`
    that reads an `env` (what `--help` shows)."""
    defaults = {}
    for block in re.findall(r"#\[arg\((.*?)\)\]", CONFIG_RS.read_text(), re.S):
        env = re.search(r'\benv\s*=\s*"([A-Z0-9_]+)"', block)
        default = re.search(r'\bdefault_value\s*=\s*"([^"]*)"', block)
        if env and default:
            defaults[env.group(1)] = default.group(1)
    return defaults


def rust_const(path: str, name: str) -> float:
    """A Rust constant of the sources: a Duration (`from_millis` / `from_secs`) in seconds, or a
    number."""
    text = (REPO / path).read_text()
    m = re.search(rf"const {name}: [\w:]*Duration\s*=\s*[\w:]*Duration::from_(millis|secs)\((\d[\d_]*)\)", text)
    if m:
        value = float(m.group(2).replace("_", ""))
        return value / 1000 if m.group(1) == "millis" else value
    m = re.search(rf"const {name}: \w+\s*=\s*(\d[\d_]*)\s*;", text)
    if not m:
        raise ValueError(f"no constant {name} in {path}")
    return float(m.group(1).replace("_", ""))


def role_bounds() -> dict[str, dict[str, float]]:
    """Each role's statement timeout and idle-in-transaction timeout (s) and connection limit,
    as the last migration that sets them says (rows `('role', 'Nms', 'Nms', limit)`)."""
    bounds = {}
    row = re.compile(r"\('(seckill_[a-z]+)',\s*'(\d+)ms',\s*'(\d+)ms',\s*(\d+)\)")
    for sql in sorted((REPO / "migrations").glob("*.sql")):
        for role, statement, idle, limit in row.findall(sql.read_text()):
            bounds[role] = {"statement": int(statement) / 1000, "idle": int(idle) / 1000,
                            "limit": int(limit)}
    return bounds


def proxy_borrow_timeout(t: Template) -> float | None:
    """RDS Proxy's ConnectionBorrowTimeout (s): how long a statement may wait for the proxy to
    lend it a database connection (0 means forever; AWS's default is 120)."""
    for _, group in t.of_type("AWS::RDS::DBProxyTargetGroup"):
        info = group.get("Properties", {}).get("ConnectionPoolConfigurationInfo") or {}
        value = t.number(info.get("ConnectionBorrowTimeout", 120))
        return float("inf") if value == 0 else value
    return None


def setting(t: Template, fn: dict, defaults: dict[str, str], name: str) -> float | None:
    """A shared::Config setting of a function: its environment in the template, else the default."""
    value = t.env(fn).get(name, defaults.get(name))
    return t.number(value)


def budget_paths(t: Template, name: str, fn: dict) -> list[tuple[str, list[tuple[str, float]]]]:
    """The worst paths of a function (the entry, the consumer), each as its steps in sequence with
    their bounds (s); [] for the others. A database step is a pool wait (DB_ACQUIRE_TIMEOUT_MS),
    RDS Proxy lending a connection (ConnectionBorrowTimeout) and its statements (each at most the
    role's statement_timeout)."""
    binary = t.binary(fn)
    if binary not in ("seckill-entry", "order-consumer"):
        return []
    defaults = config_defaults()
    role = role_bounds().get(DB_ROLE_OF_BINARY[binary], {})
    redis, sqs, acquire = (setting(t, fn, defaults, v) for v in
                           ("REDIS_TIMEOUT_MS", "SQS_TIMEOUT_MS", "DB_ACQUIRE_TIMEOUT_MS"))
    borrow, statement = proxy_borrow_timeout(t), role.get("statement")
    if None in (redis, sqs, acquire, borrow, statement):
        raise ValueError(f"{name}: a bound is missing (redis {redis}, sqs {sqs}, acquire {acquire}, "
                         f"proxy borrow {borrow}, statement {statement})")
    redis, sqs, acquire = redis / 1000, sqs / 1000, acquire / 1000

    def db(what: str, statements: int = 1) -> tuple[str, float]:
        return (f"db: {what}" + (f" ({statements} statements)" if statements > 1 else ""),
                acquire + borrow + statements * statement)

    if binary == "order-consumer":
        batch = next((t.number(ev.get("Properties", {}).get("BatchSize", 10))
                      for ev in (fn.get("Properties", {}).get("Events") or {}).values() if ev.get("Type") == "SQS"), 10)
        buckets = min(batch, rust_const("shared/src/domain/settings.rs", "MAX_BUCKETS"))
        stop = rust_const("functions/order-consumer/src/lib.rs", "STOP_BEFORE_DEADLINE")
        fast = [(f"redis: the ledger, one HMGET per home bucket (x{buckets:g})", buckets * redis),
                db("the batch transaction: begin, insert, stock, commit", 4),
                ("redis: drop the ledger entries", redis)]
        slowest = [db("the request's row"),
                   ("redis: its ledger entry", redis),
                   db("the order transaction: begin, insert, stock, epoch, rollback", 5),
                   db("claim: insert the failed row"),
                   db("claim: read the row it met"),
                   ("redis: give the units back", redis)]
        return [("an SQS batch: the slowest batch write, then the slowest message, then the stop",
                 [(f"batch write: {w}", v) for w, v in fast]
                 + [(f"message: {w}", v) for w, v in slowest]
                 + [("STOP_BEFORE_DEADLINE: the batch answers this long before the deadline", stop)])]

    provider = rust_const("shared/src/infra/payments.rs", "PROVIDER_TIMEOUT")
    other_cancel = rust_const("shared/src/protocol/cancel.rs", "OTHER_ATTEMPT_WAIT")
    deep = rust_const("functions/seckill-entry/src/health.rs", "DEEP_CHECK_TIMEOUT")
    claim = [db("claim: insert the failed row"), db("claim: read the row it met")]
    return [
        ("POST /activities/{id}/orders, the send failed",
         [("redis: the purchase script", redis), ("sqs: the order message", sqs), *claim,
          ("redis: give the units back", redis)]),
        ("POST /activities/{id}/orders, the script unanswered",
         [("redis: the purchase script", redis), *claim,
          ("redis: give the units back, first try (half REDIS_TIMEOUT_MS)", redis / 2)]),
        ("POST /activities/{id}/orders, a sale Redis does not hold",
         [("redis: the purchase script", redis), ("redis: the user's database rate", redis), db("the highest sale id"),
          db("the sale")]),
        ("POST /orders/{id}/pay",
         [("redis: the user's database rate", redis), db("the order"), db("its payment"), db("the sale"),
          ("provider: start the payment (PROVIDER_TIMEOUT)", provider),
          db("record the payment"), db("read it back")]),
        ("POST /orders/{id}/cancel, another cancel of it in flight",
         [("redis: the user's database rate", redis), db("the order"), ("redis: announce the cancel", redis), db("the order again"),
          ("redis: the ledger entry", redis),
          ("wait for the other cancel (OTHER_ATTEMPT_WAIT)", other_cancel), db("the order, last look")]),
        ("POST /orders/{id}/cancel, a sale Redis does not hold",
         [("redis: the user's database rate", redis), db("the order"), ("redis: announce the cancel", redis), db("the sale"),
          db("the cancel's database function"), db("the order again")]),
        ("POST /payments/webhook, a concurrent delivery decided first",
         [db("the event"), db("the transaction: begin, payment, order, paid, succeeded, event, "
                              "rollback", 7), db("the event again")]),
        ("GET /activities/{id}/orders/me",
         [("redis: the bucket count", redis), ("redis: the ledger entry", redis),
          ("redis: the draw pool entry", redis), ("redis: the user's database rate", redis), db("the latest order")]),
        ("GET /activities/{id}, Redis out of reach",
         [("redis: the view", redis), db("the highest sale id"), db("the sale")]),
        ("GET /health/deep (the three asked at once)",
         [("redis, database and queue at once (DEEP_CHECK_TIMEOUT)", deep)]),
    ]


def budget_margin(timeout: float) -> float:
    return max(MIN_MARGIN_SECS, MIN_MARGIN_FRACTION * timeout)


def check_time_budgets(t: Template) -> None:
    """The worst path of the entry and of the consumer ends, with margin, before its Timeout."""
    for name, fn in t.functions():
        timeout = t.number(t.prop(fn, "Timeout")) or 3.0
        try:
            paths = budget_paths(t, name, fn)
        except ValueError as e:
            check(False, f"{name}: time budget -- {e}")
            continue
        for path, steps in paths:
            total = sum(v for _, v in steps)
            margin = timeout - total
            check(margin >= budget_margin(timeout),
                  f"{name}: time budget of {path}: {total:g} s + margin {margin:g} s (at least "
                  f"{budget_margin(timeout):g}) <= Timeout {timeout:g} s")


def check_role_connection_limits(t: Template) -> None:
    """Each function's role may open what the function's reserved executions can hold
    (reservation x DB_MAX_CONNECTIONS), plus ROLE_CONNECTION_HEADROOM, and not much more. The
    reservations are the parameters' defaults, which the migration was written for: a
    deployment that overrides them carries a migration of its own for the limits (the roles are
    the database's, not the stack's)."""
    defaults = config_defaults()
    bounds = role_bounds()
    t = t.with_params(**{k: v.get("Default") for k, v in t.doc.get("Parameters", {}).items()})
    for name, fn in t.functions():
        role = DB_ROLE_OF_BINARY.get(t.binary(fn))
        reserved = t.reserved(fn)
        if role is None or reserved is None:
            continue
        pool = setting(t, fn, defaults, "DB_MAX_CONNECTIONS")
        need = reserved * (pool or 0)
        limit = bounds.get(role, {}).get("limit")
        check(limit is not None and need + ROLE_CONNECTION_HEADROOM <= limit <= need + 2 * ROLE_CONNECTION_HEADROOM,
              f"{name}: {role}'s connection limit {limit} is reservation {reserved:g} x DB_MAX_CONNECTIONS "
              f"{num(pool)} = {need:g} + {ROLE_CONNECTION_HEADROOM}..{2 * ROLE_CONNECTION_HEADROOM}")


def step_kind(what: str) -> str:
    """A step's kind: the word before its first colon (redis, sqs, db, provider), or itself."""
    return what.split(":")[0].split(" (")[0] if ":" in what else what.split(" (")[0]


def print_budgets(t: Template) -> None:
    """The time budgets as docs/capacity.md's tables: every path in one line each, then each
    path's steps."""
    rows, details = [], []
    for name, fn in t.functions():
        timeout = t.number(t.prop(fn, "Timeout")) or 3.0
        for path, steps in budget_paths(t, name, fn):
            total = sum(v for _, v in steps)
            groups: dict[tuple[str, float], int] = {}
            for what, v in steps:
                key = (step_kind(what.removeprefix("batch write: ").removeprefix("message: ")), v)
                groups[key] = groups.get(key, 0) + 1
            formula = " + ".join(f"{n} × {kind} {v:g}" if n > 1 else f"{kind} {v:g}"
                                 for (kind, v), n in groups.items())
            rows.append(f"| `{t.binary(fn)}` | {path} | {formula} | {total:g} | {timeout:g} | {timeout - total:g} |")
            details.append(f"\n**`{t.binary(fn)}`: {path}**\n\n| step | bound (s) |\n|---|---:|")
            details += [f"| {what} | {v:g} |" for what, v in steps]
            details.append(f"| **sum** / Timeout / margin | **{total:g}** / {timeout:g} / {timeout - total:g} |")
    print("| function | path | steps (s) | sum (s) | Timeout (s) | margin (s) |\n|---|---|---|---:|---:|---:|")
    print("\n".join(rows))
    print("\n".join(details))


# ---------------------------------------------------------------- admin routes


def router_routes(src: Path) -> set[tuple[str, str]]:
    """(METHOD, path) of every #[utoipa::path(method, path = "...")] handler under src."""
    found = set()
    for rs in sorted(src.glob("**/*.rs")):
        for m in re.finditer(r"#\[utoipa::path\(\s*(get|post|put|patch|delete)\s*,\s*path\s*=\s*\"([^\"]+)\"", rs.read_text()):
            found.add((m.group(1).upper(), m.group(2)))
    return found


def shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def check_admin_routes(t: Template) -> None:
    admins = [(n, f) for n, f in t.functions() if t.binary(f) == "admin"]
    check(len(admins) == 1, "exactly one function builds admin")
    if not admins:
        return
    name, fn = admins[0]
    routes = router_routes(REPO / "functions" / "admin" / "src")
    check(bool(routes), f"functions/admin/src declares its routes with #[utoipa::path] ({len(routes)} found)")
    events = {}
    for ev_name, ev in (fn.get("Properties", {}).get("Events") or {}).items():
        if ev.get("Type") == "HttpApi":
            props = ev.get("Properties", {})
            events[(str(props.get("Method")).upper(), shape(str(props.get("Path"))))] = props
    for method, path in sorted(routes):
        ev = events.get((method, shape(path)))
        auth = (ev or {}).get("Auth") or {}
        scopes = [target_of(s) or s for s in as_list(auth.get("AuthorizationScopes") or [])]
        check(ev is not None and auth.get("Authorizer") == "JwtAuthorizer" and scopes == ["AdminScope"],
              f"admin route {method} {path}: an event of {name} with the JwtAuthorizer and AdminScope"
              + ("" if ev else " (missing)") + (f" (scopes {scopes})" if ev and scopes != ["AdminScope"] else ""))
    stale = sorted(set(events) - {(m, shape(p)) for m, p in routes})
    check(not stale, f"{name}: every HttpApi event is a route of functions/admin's router (not: {stale})")


# ---------------------------------------------------------------- who may call each route


ENTRY_BINARY = "seckill-entry"
# Every route of the entry function and what it takes (the admin routes are checked against
# functions/admin's router above): user routes a token with UserScope, the public view, the
# liveness check and the provider's webhook nothing, the deep health check an IAM signature.
ENTRY_ROUTE_AUTH = {
    ("POST", "/activities/{activityId}/orders"): (JWT_AUTHORIZER, ["UserScope"]),
    ("GET", "/activities/{activityId}/orders/me"): (JWT_AUTHORIZER, ["UserScope"]),
    ("POST", "/orders/{orderId}/pay"): (JWT_AUTHORIZER, ["UserScope"]),
    ("POST", "/orders/{orderId}/cancel"): (JWT_AUTHORIZER, ["UserScope"]),
    ("GET", "/activities/{activityId}"): ("NONE", []),
    ("GET", "/health"): ("NONE", []),
    ("POST", "/payments/webhook"): ("NONE", []),
    ("GET", "/health/deep"): ("AWS_IAM", []),
}
USER_SCOPE = ("UserScope", "seckill:user")


def describe_auth(auth: str, scopes: list) -> str:
    if auth == JWT_AUTHORIZER:
        return f"the JwtAuthorizer with {scopes or 'no scope'}"
    return {"NONE": "no token (Authorizer NONE)", "AWS_IAM": "IAM only (AWS_IAM, SigV4)"}.get(auth, auth)


def check_route_auth(t: Template) -> None:
    name, default = USER_SCOPE
    param = t.doc.get("Parameters", {}).get(name, {})
    check(str(param.get("Default")) == default, f"parameter {name} exists and defaults to {default} (got {param.get('Default')!r})")
    entries = [(n, f) for n, f in t.functions() if t.binary(f) == ENTRY_BINARY]
    if not entries:
        return  # check_entry_policy reports it
    fn_name, fn = entries[0]
    events = {}
    for ev in (fn.get("Properties", {}).get("Events") or {}).values():
        if ev.get("Type") == "HttpApi":
            props = ev.get("Properties", {})
            events[(str(props.get("Method")).upper(), shape(str(props.get("Path"))))] = props
    for (method, path), (want, want_scopes) in ENTRY_ROUTE_AUTH.items():
        ev = events.get((method, shape(path)))
        auth = auth_of(t, ev) if ev else None
        scopes = [target_of(s) or s for s in as_list((ev or {}).get("Auth", {}).get("AuthorizationScopes") or [])]
        check(ev is not None and auth == want and scopes == want_scopes,
              f"{method} {path}: {describe_auth(want, want_scopes)}"
              + ("" if ev else f" -- not an event of {fn_name}")
              + (f" -- got {describe_auth(auth, scopes)}" if ev and (auth, scopes) != (want, want_scopes) else ""))
    unknown = sorted(set(events) - {(m, shape(p)) for m, p in ENTRY_ROUTE_AUTH})
    check(not unknown, f"{fn_name}: every HttpApi route is one whose auth is checked here (not: {unknown})")


# ---------------------------------------------------------------- GET /health/deep (IAM)


DEEP_HEALTH = ("GET", "/health/deep")


def check_deep_health(t: Template) -> None:
    """The IAM route: the API enables IAM authorization, and one managed policy (an output)
    grants execute-api:Invoke on exactly that route for a monitoring role to attach."""
    apis = [n for n, _ in t.of_type("AWS::Serverless::HttpApi")]
    for api in apis:
        auth = t.resources[api].get("Properties", {}).get("Auth") or {}
        check(auth.get("EnableIamAuthorizer") is True, f"{api}: Auth.EnableIamAuthorizer true (GET /health/deep is AWS_IAM)")
    method, path = DEEP_HEALTH
    want = {f"arn:${{AWS::Partition}}:execute-api:${{AWS::Region}}:${{AWS::AccountId}}:${{{a}}}/$default/{method}{path}" for a in apis}
    policies = [(n, r) for n, r in t.of_type("AWS::IAM::ManagedPolicy")
                if "execute-api:Invoke" in set(strings_in(r.get("Properties", {}).get("PolicyDocument")))]
    check(len(policies) == 1, f"one managed policy grants execute-api:Invoke ({[n for n, _ in policies]})")
    for name, pol in policies:
        problems = []
        for st in as_list(pol["Properties"]["PolicyDocument"].get("Statement")):
            if st.get("Effect") != "Allow":
                continue
            if as_list(st.get("Action")) != ["execute-api:Invoke"]:
                problems.append(f"actions {st.get('Action')}")
            resources = [sub_text(r) for r in as_list(st.get("Resource"))]
            if len(resources) != 1 or resources[0] not in want:
                problems.append(f"resources {resources}")
        check(not problems, f"{name}: execute-api:Invoke on exactly {method} {path} of the HTTP API, stage $default"
              + (f" -- {problems}" if problems else ""))
        outputs = [o for o, v in (t.doc.get("Outputs") or {}).items() if t.active(v) and target_of(v.get("Value")) == name]
        check(bool(outputs), f"{name}: an output gives its ARN for the monitoring role ({outputs})")


# ---------------------------------------------------------------- the origin secret


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


# ---------------------------------------------------------------- the parameter Rules


def check_rules(t: Template) -> None:
    """The Rules refuse the edge without a domain and certificate, and the storefront without the
    edge; the defaults and a complete edge pass; the certificate must come from us-east-1."""
    cert = SAMPLE_CERTIFICATE
    check(not t.refusals(), f"Rules: the default parameters pass every Rule (refused by {t.refusals()})")
    for what, params in (("EdgeDomainName", {"EdgeProtection": "on", "EdgeCertificateArn": cert}),
                         ("EdgeCertificateArn", {"EdgeProtection": "on", "EdgeDomainName": SAMPLE_DOMAIN})):
        check(bool(t.refusals(**params)), f"Rules: EdgeProtection=on is refused without {what}")
    check(not t.refusals(**EDGE_ON), f"Rules: EdgeProtection=on with a domain and a us-east-1 certificate passes "
          f"(refused by {t.refusals(**EDGE_ON)})")
    check(bool(t.refusals(Storefront="true")), "Rules: Storefront=true is refused without EdgeProtection=on")
    check(not t.refusals(Storefront="true", **EDGE_ON),
          f"Rules: Storefront=true with the edge on passes (refused by {t.refusals(Storefront='true', **EDGE_ON)})")
    pattern = str(t.doc.get("Parameters", {}).get("EdgeCertificateArn", {}).get("AllowedPattern"))
    elsewhere = cert.replace("us-east-1", "eu-west-1")
    ok = all(bool(re.fullmatch(pattern, v)) == want for v, want in (("", True), (cert, True), (elsewhere, False)))
    check(ok, f"parameter EdgeCertificateArn: AllowedPattern takes an ACM certificate in us-east-1 only (or empty) ({pattern})")


# ---------------------------------------------------------------- the operations dashboard


# What the entry function counts (EMF, namespace Seckill, dimension Function).
ENTRY_ACCEPTED = ("Accepted", "Queued", "Compensations")
ENTRY_REFUSALS = ("RejectedSoldOutCached", "RejectedUnavailable", "RejectedNotFound", "RejectedNotStarted",
                  "RejectedEnded", "RejectedQuantityExceedsLimit", "RejectedSoldOut", "RejectedAlreadyPurchased",
                  "RejectedExpired", "RejectedRateLimited", "BreakerOpens")


def seckill(function: str, *metrics: str) -> list:
    return [("Seckill", m, {"Function": function}, None) for m in metrics]


# (what the widget shows, the metrics one widget must hold: namespace, name, dimensions, stat)
DASHBOARD_WIDGETS = [
    ("purchases accepted", seckill("seckill-entry", *ENTRY_ACCEPTED)),
    ("purchases refused by reason", seckill("seckill-entry", *ENTRY_REFUSALS)),
    ("entry p99", [("AWS/Lambda", "Duration", {"FunctionName": "${SeckillEntryFunction}"}, "p99"),
                   ("AWS/ApiGateway", "Latency", {"ApiId": "${HttpApi}"}, "p99")]),
    ("order queue depth and age",
     [("AWS/SQS", "ApproximateNumberOfMessagesVisible", {"QueueName": "${OrderQueue.QueueName}"}, None),
      ("AWS/SQS", "ApproximateAgeOfOldestMessage", {"QueueName": "${OrderQueue.QueueName}"}, None)]),
    ("dead-letter queue depth",
     [("AWS/SQS", "ApproximateNumberOfMessagesVisible", {"QueueName": "${OrderDeadLetterQueue.QueueName}"}, None)]),
    ("reconcile", seckill("reconcile", "Drift", "Repairs", "ReleasedUnpaid")),
    ("order consumer", seckill("order-consumer", "Committed", "Failed", "Retried")),
]
# Where the EMF names are written: the library and every function's sources.
RUST_SOURCE_DIRS = ("shared/src", "functions/*/src")


def rust_literals() -> set[str]:
    found = set()
    for pattern in RUST_SOURCE_DIRS:
        for d in REPO.glob(pattern):
            for rs in d.glob("**/*.rs"):
                found |= set(re.findall(r'"([A-Za-z][A-Za-z0-9_-]*)"', rs.read_text()))
    return found


def dashboard_metrics(body: dict) -> list[tuple[int, str, str, dict, str | None]]:
    """(widget index, namespace, name, dimensions, stat) of every metric of every widget."""
    out = []
    for i, w in enumerate(body.get("widgets") or []):
        props = w.get("properties") or {}
        for m in props.get("metrics") or []:
            opts = m[-1] if m and isinstance(m[-1], dict) else {}
            parts = [x for x in m if not isinstance(x, dict)]
            if len(parts) < 2 or "." in parts[:2]:
                out.append((i, str(parts[0] if parts else ""), "<unreadable: use full metric arrays>", {}, None))
                continue
            dims = dict(zip(parts[2::2], parts[3::2]))
            out.append((i, parts[0], parts[1], dims, opts.get("stat") or props.get("stat")))
    return out


def check_dashboard(t: Template) -> None:
    dashboards = t.of_type("AWS::CloudWatch::Dashboard")
    check(len(dashboards) == 1, f"a CloudWatch dashboard exists ({[n for n, _ in dashboards]})")
    if not dashboards:
        return
    name, dash = dashboards[0]
    try:
        body = json.loads(sub_text(dash.get("Properties", {}).get("DashboardBody")))
    except ValueError as e:
        check(False, f"{name}: DashboardBody (a Fn::Sub) is one JSON document -- {e}")
        return
    metrics = dashboard_metrics(body)
    for what, wanted in DASHBOARD_WIDGETS:
        widgets = {i for i, *_ in metrics}
        def holds(i, ns, metric, dims, stat):
            return any(j == i and n == ns and m == metric and d == dims and (stat is None or st == stat)
                       for j, n, m, d, st in metrics)
        best = min(widgets, key=lambda i: sum(not holds(i, *w) for w in wanted), default=None)
        missing = [w[1] for w in wanted if best is None or not holds(best, *w)]
        check(not missing, f"{name}: a widget with {what} ({', '.join(w[1] for w in wanted)})"
              + (f" -- the closest lacks {missing}" if missing else ""))
    literals = rust_literals()
    named = sorted({m for _, ns, m, _, _ in metrics if ns == "Seckill"})
    for metric in named:
        check(metric in literals, f"{name}: Seckill metric {metric} is emitted by the Rust sources "
              f"(a quoted literal under {' or '.join(RUST_SOURCE_DIRS)})")
    functions = sorted({d.get("Function") for _, ns, _, d, _ in metrics if ns == "Seckill"})
    for fn in functions:
        check(fn in literals, f"{name}: Seckill dimension Function={fn} is a function name the Rust sources emit")


# ---------------------------------------------------------------- edge (CloudFront + WAF)


# Resource types only the edge creates (EdgeProtection=off must create none of them).
EDGE_TYPE_PREFIXES = ("AWS::CloudFront::", "AWS::WAFv2::", "AWS::S3::")
CACHING_DISABLED = "4135ea2d-6df8-44a3-9df3-4b5a84be39ad"
# Forwards every viewer header but Host (API Gateway answers 403 to the viewer's Host). With
# caching off it is how Authorization reaches the origin: an origin request policy cannot list
# Authorization on its own.
ALL_VIEWER_EXCEPT_HOST = "b689b0a8-53d0-40ab-baf2-68738e2966ac"
# The 4xx/5xx codes CloudFront caches (10 s by default).
CACHED_ERROR_CODES = (400, 403, 404, 405, 414, 500, 501, 502, 503, 504)
PUBLIC_VIEW = ("GET", "/activities/{}")
# Security policies that hold viewers to TLS 1.2 or later.
TLS12_POLICIES = {"TLSv1.2_2018", "TLSv1.2_2019", "TLSv1.2_2021", "TLSv1.2_2025", "TLSv1.3_2025"}
# Requests the purchase-route scope-down must match, and must not.
PURCHASES = [("POST", "/activities/1/orders"), ("POST", "/activities/42/orders/"),
             ("POST", "//activities/1//orders"), ("POST", "/activities/1/%6Frders")]
NOT_PURCHASES = [("GET", "/activities/1/orders"), ("GET", "/activities/1/orders/me"), ("GET", "/activities/1"),
                 ("POST", "/orders/1/pay"), ("POST", "/orders/1/cancel"), ("POST", "/admin/activities"),
                 ("PUT", "/activities/1/orders")]
# What the public-view rate rule must count (what the cached /activities/* behaviour serves), and not.
PUBLIC_VIEWS = [("GET", "/activities/1"), ("HEAD", "/activities/1"), ("GET", "/activities/42/"),
                ("GET", "//activities/1"), ("GET", "/activities/%31")]
NOT_PUBLIC_VIEWS = [("GET", "/activities/1/orders/me"), ("GET", "/activities/1/orders"), ("POST", "/activities/1/orders"),
                    ("GET", "/activities/1//orders/me"), ("GET", "/activities/1/%6Frders/me"), ("POST", "/activities/1"),
                    ("GET", "/orders/1/pay"), ("GET", "/health"), ("GET", "/admin/activities/1"), ("GET", "/")]
# The bearer-shape rule: refused purchases, and requests it must let through.
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl-_"
PURCHASE = ("POST", "/activities/1/orders")
BEARER_REFUSED = [(*PURCHASE, {}), (*PURCHASE, {"Authorization": "Basic dXNlcjpwYXNz"}), (*PURCHASE, {"Authorization": JWT}),
                  (*PURCHASE, {"Authorization": "Bearer abc"}), (*PURCHASE, {"Authorization": "Bearer a.b"}),
                  (*PURCHASE, {"Authorization": "Bearer a.b.c.d"}), (*PURCHASE, {"Authorization": "Bearer a.b.c x"}),
                  (*PURCHASE, {"Authorization": "Bearer  a.b.c"}), (*PURCHASE, {"Authorization": "Bearer a+/.b.c="}),
                  ("POST", "//activities/1//orders", {}), ("POST", "/activities/1/%6Frders", {})]
BEARER_PASSED = [(*PURCHASE, {"Authorization": f"Bearer {JWT}"}), (*PURCHASE, {"Authorization": "bearer a.b.c"}),
                 ("GET", "/activities/1/orders/me", {}), ("POST", "/orders/1/pay", {}), ("POST", "/payments/webhook", {}),
                 ("GET", "/activities/1", {}), ("POST", "/admin/activities", {}), ("GET", "/health", {})]
# Paths the per-user behaviours must cover beyond the template's own routes.
PER_USER_SAMPLES = [("POST", "/activities/1/orders"), ("GET", "/activities/1/orders/me"), ("POST", "/orders/1/pay"),
                    ("POST", "/orders/1/cancel"), ("GET", "/admin/activities"), ("GET", "/admin/activities/1"),
                    ("PUT", "/admin/activities/1"), ("POST", "/admin/activities")]
# The security headers every answer of the edge carries.
MIN_HSTS_SECS = 31536000
CSP = {"default-src": ["'self'"], "img-src": ["'self'", "data:"], "style-src": ["'self'"], "script-src": ["'self'"],
       "connect-src": ["'self'"], "frame-ancestors": ["'none'"]}
STOREFRONT_ORIGIN_TYPES = ("s3",)


def transform(text: str, transformations) -> str:
    for tt in sorted(as_list(transformations or []), key=lambda x: x.get("Priority", 0)):
        kind = tt.get("Type")
        if kind == "URL_DECODE":
            text = unquote(text)
        elif kind == "LOWERCASE":
            text = text.lower()
        elif kind != "NONE":
            raise ValueError(f"text transformation {kind} not modelled")
    return text


def waf_matches(stmt: dict, method: str, path: str, headers: dict | None = None) -> bool:
    """Whether a WAF statement (the subset this template uses) matches a request."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    (kind, body), = stmt.items()
    if kind == "AndStatement":
        return all(waf_matches(s, method, path, headers) for s in body["Statements"])
    if kind == "OrStatement":
        return any(waf_matches(s, method, path, headers) for s in body["Statements"])
    if kind == "NotStatement":
        return not waf_matches(body["Statement"], method, path, headers)
    field = body.get("FieldToMatch") or {}
    if set(field) == {"Method"}:
        text = method
    elif set(field) == {"UriPath"}:
        text = path
    elif set(field) == {"SingleHeader"}:
        name = str(field["SingleHeader"].get("Name", "")).lower()
        if name not in headers:
            return False  # a missing header matches no statement
        text = headers[name]
    else:
        raise ValueError(f"field {field} not modelled")
    text = transform(text, body.get("TextTransformations"))
    if kind == "RegexMatchStatement":
        return re.search(body["RegexString"], text) is not None
    if kind == "ByteMatchStatement":
        needle, how = str(body.get("SearchString")), body.get("PositionalConstraint")
        return {"EXACTLY": text == needle, "STARTS_WITH": text.startswith(needle),
                "ENDS_WITH": text.endswith(needle), "CONTAINS": needle in text}[how]
    raise ValueError(f"statement {kind} not modelled")


def scope_matches(stmt, matching: list, not_matching: list) -> tuple[bool, str]:
    """Whether a statement matches every request of one list and none of the other."""
    if not isinstance(stmt, dict) or not stmt:
        return False, "no scope-down"
    try:
        missed = [r for r in matching if not waf_matches(stmt, *r)]
        extra = [r for r in not_matching if waf_matches(stmt, *r)]
    except (ValueError, KeyError) as e:
        return False, str(e)
    return not missed and not extra, (f"misses {missed} " if missed else "") + (f"also matches {extra}" if extra else "")


def is_purchase_scope(stmt) -> tuple[bool, str]:
    return scope_matches(stmt, PURCHASES, NOT_PURCHASES)


def waf_regex_problems(regex: str) -> list[str]:
    """What AWS WAF's PCRE subset refuses ("Supported regular expression syntax in AWS WAF"):
    capturing groups and backreferences, atomic groups, possessive quantifiers, \\C \\R \\K."""
    problems = []
    try:
        re.compile(regex)
    except re.error as e:
        problems.append(f"not a regex: {e}")
    atoms = re.sub(r"\[(?:\\.|[^\]\\])*\]", "x", re.sub(r"\\[^0-9CRK]", "x", regex))
    if re.search(r"\((?!\?(?::|=|!|<=|<!))", atoms):
        problems.append("a capturing group")
    if re.search(r"\\[1-9]", atoms):
        problems.append("a backreference")
    if re.search(r"\\[CRK]", atoms):
        problems.append("\\C, \\R or \\K")
    if "(?>" in atoms:
        problems.append("an atomic group")
    if re.search(r"[*+?}]\+", atoms):
        problems.append("a possessive quantifier")
    if len(regex) > 512:
        problems.append("longer than 512 characters")
    return problems


def regexes_in(value) -> list[str]:
    if isinstance(value, dict):
        found = [value["RegexString"]] if isinstance(value.get("RegexString"), str) else []
        for v in value.values():
            found += regexes_in(v)
        return found
    if isinstance(value, list):
        return [r for v in value for r in regexes_in(v)]
    return []


def managed(rule: dict) -> str | None:
    stmt = (rule.get("Statement") or {}).get("ManagedRuleGroupStatement") or {}
    return stmt.get("Name") if stmt.get("VendorName") == "AWS" else None


def web_acl_rules(t: Template, acl: str) -> list[dict]:
    return t.evaluate(t.resources[acl].get("Properties", {}).get("Rules") or [])


def custom_block(rule: dict) -> dict:
    return ((rule.get("Action") or {}).get("Block") or {}).get("CustomResponse") or {}


def check_web_acl(t: Template, acl: str) -> None:
    props = t.evaluate(t.resources[acl].get("Properties", {}))
    check(props.get("Scope") == "CLOUDFRONT" and "Allow" in (props.get("DefaultAction") or {}),
          f"{acl}: Scope CLOUDFRONT, default action Allow")
    rules = web_acl_rules(t, acl)
    bodies = props.get("CustomResponseBodies") or {}
    rates = [(r, r["Statement"]["RateBasedStatement"]) for r in rules if "RateBasedStatement" in (r.get("Statement") or {})]
    ip = [(r, s) for r, s in rates if s.get("AggregateKeyType") == "IP" and not s.get("ScopeDownStatement")]
    check(len(ip) == 1 and "Block" in (ip[0][0].get("Action") or {}) and param_ref(t, ip[0][1].get("Limit")),
          f"{acl}: a rate-based rule per IP (AggregateKeyType IP, all requests, Block, Limit from a parameter)")
    views = [(r, s) for r, s in rates if s.get("AggregateKeyType") == "IP" and s.get("ScopeDownStatement")]
    ok, why = scope_matches(views[0][1].get("ScopeDownStatement") if views else None, PUBLIC_VIEWS, NOT_PUBLIC_VIEWS)
    check(len(views) == 1 and ok and param_ref(t, views[0][1].get("Limit")) == "EdgePublicViewIpRateLimit"
          and custom_block(views[0][0]).get("ResponseCode") == 429,
          f"{acl}: a rate-based rule per IP on the public view only (GET/HEAD /activities/* but not .../orders*), "
          f"Limit EdgePublicViewIpRateLimit, 429 {why}")
    keyed = [(r, s) for r, s in rates if s.get("AggregateKeyType") == "CUSTOM_KEYS"]
    want = [{"Header": {"Name": "authorization", "TextTransformations": [{"Priority": 0, "Type": "NONE"}]}}]
    on_auth = [(r, s) for r, s in keyed if s.get("CustomKeys") == want]
    check(len(on_auth) == 1 and "Block" in (on_auth[0][0].get("Action") or {}) and param_ref(t, on_auth[0][1].get("Limit")),
          f"{acl}: a rate-based rule per Authorization header (CUSTOM_KEYS: Header authorization, TextTransformations "
          f"NONE; Block; Limit from a parameter) (custom-key rules: {[s.get('CustomKeys') for _, s in keyed]})")
    if keyed:
        ok, why = is_purchase_scope(keyed[0][1].get("ScopeDownStatement"))
        check(ok, f"{acl}: the per-token rate rule is scoped down to the purchase route POST /activities/{{id}}/orders {why}")
    # The bearer-shape rule: 401 with the API's JSON, on purchases without a bearer JWT only.
    bearer = [r for r in rules if custom_block(r).get("ResponseCode") == 401]
    body = bodies.get(custom_block(bearer[0]).get("CustomResponseBodyKey"), {}) if bearer else {}
    try:
        shaped = json.loads(str(body.get("Content")))
        shaped = body.get("ContentType") == "APPLICATION_JSON" and shaped.get("error") == "unauthorized" and bool(shaped.get("message"))
    except (ValueError, AttributeError):
        shaped = False
    ok, why = scope_matches(bearer[0].get("Statement") if bearer else None, BEARER_REFUSED, BEARER_PASSED)
    check(len(bearer) == 1 and shaped and ok,
          f"{acl}: a bearer JWT rule answers 401 {{\"error\":\"unauthorized\",\"message\":...}} (JSON) to POST "
          f"/activities/{{id}}/orders whose Authorization is not 'Bearer <jwt>', and to nothing else {why}")
    # Cheapest first: per-IP rates, the token shape, the per-token rate, then the managed groups
    # (among the rules found here; a missing one is the other checks' to report).
    order = {r.get("Name"): r.get("Priority") for r in rules}
    prio = [r.get("Priority") for r in rules]
    ours = [r.get("Priority") for r in rules if not managed(r)]
    groups = [r.get("Priority") for r in rules if managed(r)]
    bot = [r.get("Priority") for r in rules if managed(r) == "AWSManagedRulesBotControlRuleSet"]
    stages = [[r.get("Priority") for r, _ in ip + views], [r.get("Priority") for r in bearer],
              [r.get("Priority") for r, _ in on_auth]]
    stages = [st for st in stages if st]
    ranked = (len(set(prio)) == len(prio) and max(ours, default=-1) < min(groups, default=10**6)
              and all(b == max(prio) for b in bot) and all(max(a) < min(b) for a, b in zip(stages, stages[1:])))
    check(ranked, f"{acl}: rule priorities unique and cheapest first (per-IP rates, the bearer JWT shape, the per-token "
          f"rate, then the managed groups, Bot Control last) (got {order})")
    bad = {rx: p for rx in regexes_in(rules) if (p := waf_regex_problems(rx))}
    check(not bad, f"{acl}: every RegexString is one AWS WAF accepts (PCRE without capturing groups, backreferences, "
          f"atomic groups or possessive quantifiers) (not: {bad})")
    for group in ("AWSManagedRulesCommonRuleSet", "AWSManagedRulesKnownBadInputsRuleSet"):
        found = [r for r in rules if managed(r) == group]
        check(len(found) == 1 and found[0].get("OverrideAction") == {"None": {}},
              f"{acl}: AWS managed rule group {group}, enforcing (OverrideAction None)")
    bot_group = "AWSManagedRulesBotControlRuleSet"
    param = "EdgeBotControl"
    check(str(t.doc.get("Parameters", {}).get(param, {}).get("Default")) == "off",
          f"parameter {param} exists and defaults to off (Bot Control is paid)")
    for value in ("off", "on"):
        found = [r for r in web_acl_rules(t.with_params(**{param: value}), acl) if managed(r) == bot_group]
        if value == "off":
            check(not found, f"{acl}: Bot Control ({bot_group}) absent with {param}=off")
        else:
            ok, why = is_purchase_scope((found[0]["Statement"]["ManagedRuleGroupStatement"].get("ScopeDownStatement")
                                         if found else None))
            check(len(found) == 1 and found[0].get("OverrideAction") == {"None": {}} and ok,
                  f"{acl}: Bot Control ({bot_group}) with {param}=on, enforcing, scoped down to the purchase route {why}")
    check_waf_logging(t, acl)


def check_waf_logging(t: Template, acl: str) -> None:
    """WAF logs to a stack log group named aws-waf-logs-..., the Authorization header redacted."""
    configs = [(n, t.evaluate(r.get("Properties", {}))) for n, r in t.of_type("AWS::WAFv2::LoggingConfiguration")
               if target_of(r.get("Properties", {}).get("ResourceArn")) == acl]
    check(len(configs) == 1, f"{acl}: one WAF logging configuration ({[n for n, _ in configs]})")
    if not configs:
        return
    name, conf = configs[0]
    dests = as_list(conf.get("LogDestinationConfigs") or [])
    groups = [g for d in dests for g in refs_in(d) if t.resources.get(g, {}).get("Type") == "AWS::Logs::LogGroup"]
    group_name = sub_text(t.resources.get(groups[0], {}).get("Properties", {}).get("LogGroupName")) if groups else ""
    check(len(dests) == 1 and len(groups) == 1 and group_name.startswith("aws-waf-logs-")
          and not sub_text(dests[0]).endswith(":*"),
          f"{name}: WAF logs to a stack log group named aws-waf-logs-... by its ARN (no :* suffix) (got {dests}, {group_name!r})")
    redacted = [str((f.get("SingleHeader") or {}).get("Name", "")).lower() for f in conf.get("RedactedFields") or []]
    check("authorization" in redacted, f"{name}: WAF logs redact the authorization header (RedactedFields {redacted})")


def behaviour_for(config: dict, path: str) -> tuple[str, dict]:
    """The cache behaviour CloudFront picks for a path: the first PathPattern that matches, in
    order (`*` matches any characters, `/` included), else the default."""
    for b in config.get("CacheBehaviors") or []:
        if fnmatch.fnmatchcase(path, b.get("PathPattern", "")):
            return b["PathPattern"], b
    return "default", config.get("DefaultCacheBehavior") or {}


def api_routes(t: Template) -> dict[tuple[str, str], tuple[str, str]]:
    """(METHOD, path with "1" for each parameter) -> (the route's path, its authorizer)."""
    out = {}
    for _, _, ev in http_api_events(t):
        route = str(ev.get("Path"))
        out[(str(ev.get("Method")).upper(), re.sub(r"\{[^}]+\}", "1", route))] = (route, auth_of(t, ev))
    return out


def check_public_view_behaviour(t: Template, where: str, b: dict, api_id: str) -> None:
    policy = t.resources.get(target_of(b.get("CachePolicyId")), {})
    conf = t.evaluate(policy.get("Properties", {}).get("CachePolicyConfig") or {})
    key = conf.get("ParametersInCacheKeyAndForwardedToOrigin") or {}
    headers = key.get("HeadersConfig") or {}
    problems = []
    if policy.get("Type") != "AWS::CloudFront::CachePolicy":
        problems.append(f"cache policy {b.get('CachePolicyId')!r} is not the stack's")
    if t.number(conf.get("MinTTL")) != 0 or (t.number(conf.get("MaxTTL")) or 0) > 1 or (t.number(conf.get("DefaultTTL")) or 0) > 1:
        problems.append(f"TTLs min {conf.get('MinTTL')} default {conf.get('DefaultTTL')} max {conf.get('MaxTTL')}")
    if headers.get("HeaderBehavior") != "none" and "authorization" in [str(h).lower() for h in headers.get("Headers") or []]:
        problems.append("Authorization in the cache key")
    if headers.get("HeaderBehavior") not in ("none", "whitelist"):
        problems.append(f"HeaderBehavior {headers.get('HeaderBehavior')}")
    if (key.get("CookiesConfig") or {}).get("CookieBehavior") != "none" or (key.get("QueryStringsConfig") or {}).get("QueryStringBehavior") != "none":
        problems.append("cookies or query strings in the cache key")
    if set(b.get("AllowedMethods") or ["GET", "HEAD"]) - {"GET", "HEAD", "OPTIONS"}:
        problems.append(f"allows {b.get('AllowedMethods')}")
    if b.get("OriginRequestPolicyId"):
        problems.append("forwards viewer values beyond the cache key")
    if b.get("TargetOriginId") != api_id:
        problems.append(f"goes to origin {b.get('TargetOriginId')!r}")
    check(not problems, f"GET /activities/{{activityId}} ({where}): the public view from the HTTP API, cached at most 1 s "
          "by the stack's policy, nothing of the viewer in the key" + (f" -- {problems}" if problems else ""))


def refusing_function(t: Template, b: dict) -> str | None:
    """The stack's CloudFront Function a behaviour runs on viewer requests, if it only ever
    answers itself (returns a response with a status code and never the request)."""
    for assoc in b.get("FunctionAssociations") or []:
        fn = target_of(assoc.get("FunctionARN"))
        res = t.resources.get(fn, {})
        code = str(res.get("Properties", {}).get("FunctionCode") or "")
        if (assoc.get("EventType") == "viewer-request" and res.get("Type") == "AWS::CloudFront::Function"
                and t.active(res) and "statusCode" in code and "event.request" not in code):
            return fn
    return None


def check_behaviours(t: Template, dist: str, config: dict, api_id: str, storefront: bool) -> None:
    default = config.get("DefaultCacheBehavior") or {}
    if not storefront:
        check(default.get("CachePolicyId") == CACHING_DISABLED and default.get("OriginRequestPolicyId") == ALL_VIEWER_EXCEPT_HOST
              and default.get("TargetOriginId") == api_id,
              f"{dist}: default behaviour to the HTTP API, never cached (CachingDisabled) and Authorization forwarded "
              "(AllViewerExceptHostHeader)")
    for b in [default] + list(config.get("CacheBehaviors") or []):
        writes = sorted(set(b.get("AllowedMethods") or []) & {"POST", "PUT", "PATCH", "DELETE"})
        check(not writes or b.get("CachePolicyId") == CACHING_DISABLED,
              f"{dist} {b.get('PathPattern', 'default')}: never cached where it lets writes through "
              f"(allows {writes or 'no write method'})")
    routes = {k: (route, auth) for k, (route, auth) in api_routes(t).items()}
    for method, path in PER_USER_SAMPLES:
        routes.setdefault((method, path), (path, JWT_AUTHORIZER))
    for (method, path), (route, auth) in sorted(routes.items()):
        where, b = behaviour_for(config, path)
        if (method, shape(route)) == PUBLIC_VIEW and auth == "NONE":
            check_public_view_behaviour(t, where, b, api_id)
            continue
        if auth == "AWS_IAM":
            fn = refusing_function(t, b)
            check(fn is not None, f"{method} {path} ({where}): answered at the edge by a viewer-request function of the "
                  f"stack, never forwarded to the origin (the route needs SigV4) (function {fn})")
            continue
        problems = []
        if b.get("TargetOriginId") != api_id:
            problems.append(f"origin {b.get('TargetOriginId')!r}")
        if b.get("CachePolicyId") != CACHING_DISABLED:
            problems.append(f"cache policy {b.get('CachePolicyId')!r}")
        if b.get("OriginRequestPolicyId") != ALL_VIEWER_EXCEPT_HOST:
            problems.append(f"origin request policy {b.get('OriginRequestPolicyId')!r}")
        if method not in (b.get("AllowedMethods") or ["GET", "HEAD"]):
            problems.append(f"{method} not allowed ({b.get('AllowedMethods')})")
        check(not problems, f"{method} {path} ({where}): to the HTTP API, never cached (CachingDisabled), Authorization forwarded "
              "with every other viewer header but Host (AllViewerExceptHostHeader), method allowed"
              + (f" -- {problems}" if problems else ""))
    errors = {t.number(e.get("ErrorCode")): t.number(e.get("ErrorCachingMinTTL")) for e in config.get("CustomErrorResponses") or []}
    kept = [c for c in CACHED_ERROR_CODES if errors.get(c) != 0]
    check(not kept, f"{dist}: origin errors are never cached at the edge (ErrorCachingMinTTL 0; not for {kept})")


def check_viewer_tls(t: Template, dist: str, config: dict) -> None:
    """TLS 1.2 or later for viewers: an ACM certificate of our own with SNI and a TLSv1.2 policy
    (the default *.cloudfront.net certificate is always TLSv1), on EdgeDomainName."""
    vc = config.get("ViewerCertificate") or {}
    ok = (param_ref(t, vc.get("AcmCertificateArn")) == "EdgeCertificateArn" and vc.get("SslSupportMethod") == "sni-only"
          and vc.get("MinimumProtocolVersion") in TLS12_POLICIES and vc.get("CloudFrontDefaultCertificate") is not True
          and [param_ref(t, a) for a in config.get("Aliases") or []] == ["EdgeDomainName"])
    check(ok, f"{dist}: viewers get TLS >= 1.2 (ACM certificate EdgeCertificateArn, sni-only, MinimumProtocolVersion "
          f"TLSv1.2_*; alias EdgeDomainName) (got {vc}, aliases {config.get('Aliases')})")
    plain = [b.get("PathPattern", "default") for b in [config.get("DefaultCacheBehavior") or {}] + list(config.get("CacheBehaviors") or [])
             if b.get("ViewerProtocolPolicy") not in ("https-only", "redirect-to-https")]
    check(not plain, f"{dist}: every behaviour answers viewers over TLS only (https-only or redirect-to-https; not: {plain})")


def csp_directives(text: str) -> dict[str, list[str]]:
    out = {}
    for part in str(text).split(";"):
        words = part.split()
        if words:
            out[words[0].lower()] = words[1:]
    return out


def check_security_headers(t: Template, dist: str, config: dict) -> None:
    behaviours = [config.get("DefaultCacheBehavior") or {}] + list(config.get("CacheBehaviors") or [])
    policies = {target_of(b.get("ResponseHeadersPolicyId")) for b in behaviours}
    missing = [b.get("PathPattern", "default") for b in behaviours
               if t.resources.get(target_of(b.get("ResponseHeadersPolicyId")), {}).get("Type") != "AWS::CloudFront::ResponseHeadersPolicy"]
    check(not missing and len(policies) == 1,
          f"{dist}: every behaviour has the stack's response headers policy (missing: {missing}; policies {sorted(map(str, policies))})")
    for pid in sorted(p for p in policies if p in t.resources):
        conf = t.evaluate(t.resources[pid].get("Properties", {}).get("ResponseHeadersPolicyConfig") or {})
        sec = conf.get("SecurityHeadersConfig") or {}
        hsts, nosniff = sec.get("StrictTransportSecurity") or {}, sec.get("ContentTypeOptions") or {}
        frame, referrer = sec.get("FrameOptions") or {}, sec.get("ReferrerPolicy") or {}
        csp = sec.get("ContentSecurityPolicy") or {}
        problems = []
        if not ((t.number(hsts.get("AccessControlMaxAgeSec")) or 0) >= MIN_HSTS_SECS and hsts.get("IncludeSubdomains") is True):
            problems.append(f"HSTS {hsts}")
        if frame.get("FrameOption") != "DENY":
            problems.append(f"X-Frame-Options {frame}")
        if referrer.get("ReferrerPolicy") != "strict-origin-when-cross-origin":
            problems.append(f"Referrer-Policy {referrer}")
        if csp_directives(csp.get("ContentSecurityPolicy")) != CSP:
            problems.append(f"CSP {csp.get('ContentSecurityPolicy')!r}")
        if not nosniff:
            problems.append("no X-Content-Type-Options")
        weak = [k for k, v in (("HSTS", hsts), ("nosniff", nosniff), ("frame", frame), ("referrer", referrer), ("CSP", csp))
                if v and v.get("Override") is not True]
        if weak:
            problems.append(f"not overriding the origin: {weak}")
        check(not problems, f"{pid}: security headers: HSTS >= {MIN_HSTS_SECS} s with includeSubDomains, nosniff, "
              "X-Frame-Options DENY, Referrer-Policy strict-origin-when-cross-origin, the same-origin CSP"
              + (f" -- {problems}" if problems else ""))


def bucket_problems(t: Template, bucket: str, ownership: tuple[str, ...]) -> list[str]:
    res = t.resources.get(bucket, {})
    props = t.evaluate(res.get("Properties", {}))
    problems = [] if res.get("Type") == "AWS::S3::Bucket" and t.active(res) else [f"{bucket} is not a bucket of the stack"]
    block = props.get("PublicAccessBlockConfiguration") or {}
    if not all(block.get(k) is True for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")):
        problems.append(f"public access not blocked ({block})")
    owners = [r.get("ObjectOwnership") for r in (props.get("OwnershipControls") or {}).get("Rules") or []]
    if len(owners) != 1 or owners[0] not in ownership:
        problems.append(f"ObjectOwnership {owners} (want {' or '.join(ownership)})")
    if not (props.get("BucketEncryption") or {}).get("ServerSideEncryptionConfiguration"):
        problems.append("no default encryption")
    if props.get("AccessControl") or props.get("WebsiteConfiguration"):
        problems.append("a canned ACL or a website endpoint")
    return problems


def check_access_log(t: Template, dist: str, config: dict) -> None:
    """CloudFront's standard log to a stack bucket: ACLs on (that delivery writes with them),
    nothing public, encrypted, expiring after LogRetentionDays; no cookies logged."""
    logging = config.get("Logging") or {}
    bucket = target_of(logging.get("Bucket"))
    via_domain = isinstance(logging.get("Bucket"), dict) and "DomainName" in str(logging["Bucket"].get("Fn::GetAtt"))
    check(via_domain and logging.get("IncludeCookies") is False,
          f"{dist}: standard access logging to a stack bucket's DomainName, cookies not logged (got {logging})")
    if not bucket:
        return
    problems = bucket_problems(t, bucket, ("BucketOwnerPreferred", "ObjectWriter"))
    rules = (t.evaluate(t.resources.get(bucket, {}).get("Properties", {})).get("LifecycleConfiguration") or {}).get("Rules") or []
    if not any(r.get("Status") == "Enabled" and param_ref(t, r.get("ExpirationInDays")) == "LogRetentionDays" for r in rules):
        problems.append("no enabled lifecycle rule expiring objects after LogRetentionDays")
    check(not problems, f"{bucket}: the access-log bucket keeps ACLs for CloudFront's log delivery (BucketOwnerPreferred), "
          "blocks public access, is encrypted, expires logs after LogRetentionDays" + (f" -- {problems}" if problems else ""))


def check_storefront(t: Template, dist: str, config: dict, api_id: str, storefront: bool) -> None:
    origins = [o for o in config.get("Origins") or [] if o.get("Id") != api_id]
    buckets = [n for n, r in t.of_type("AWS::S3::Bucket") if r.get("Condition") == "StorefrontOn"]
    oacs = [n for n, _ in t.of_type("AWS::CloudFront::OriginAccessControl")]
    if not storefront:
        check(not origins and not buckets and not oacs and "DefaultRootObject" not in config,
              f"Storefront=false: no storefront bucket, Origin Access Control or bucket origin "
              f"(got {[o.get('Id') for o in origins]}, {buckets}, {oacs})")
        return
    check(len(origins) == 1, f"{dist}: one origin besides the HTTP API, the storefront bucket ({[o.get('Id') for o in origins]})")
    if not origins:
        return
    origin = origins[0]
    bucket = target_of(origin.get("DomainName"))
    oac_id = target_of(origin.get("OriginAccessControlId"))
    oac = t.evaluate(t.resources.get(oac_id, {}).get("Properties", {}).get("OriginAccessControlConfig") or {})
    ok = (t.resources.get(oac_id, {}).get("Type") == "AWS::CloudFront::OriginAccessControl"
          and oac.get("OriginAccessControlOriginType") in STOREFRONT_ORIGIN_TYPES and oac.get("SigningBehavior") == "always"
          and oac.get("SigningProtocol") == "sigv4" and (origin.get("S3OriginConfig") or {}).get("OriginAccessIdentity") == ""
          and "RegionalDomainName" in str(origin.get("DomainName")))
    check(ok, f"{dist}: the storefront origin reads bucket {bucket} through Origin Access Control {oac_id} "
          f"(s3, always signed, sigv4; no origin access identity) (got {origin})")
    problems = bucket_problems(t, bucket, ("BucketOwnerEnforced",))
    check(not problems, f"{bucket}: the storefront bucket is private (public access blocked, ACLs disabled, encrypted, "
          "no website endpoint)" + (f" -- {problems}" if problems else ""))
    statements_ = [st for _, r in t.of_type("AWS::S3::BucketPolicy") if target_of(r["Properties"].get("Bucket")) == bucket
                   for st in as_list(t.evaluate(r["Properties"].get("PolicyDocument") or {}).get("Statement"))]
    allows = [st for st in statements_ if st.get("Effect") == "Allow"]
    ok = bool(allows) and all(
        st.get("Principal") == {"Service": "cloudfront.amazonaws.com"} and as_list(st.get("Action")) == ["s3:GetObject"]
        and f"distribution/${{{dist}}}" in sub_text(((st.get("Condition") or {}).get("StringEquals") or {}).get("AWS:SourceArn"))
        for st in allows)
    check(ok, f"{bucket}: its policy lets only CloudFront, for this distribution (AWS:SourceArn), read objects (got {allows})")
    served = [("default", config.get("DefaultCacheBehavior") or {})] + [
        (b.get("PathPattern"), b) for b in config.get("CacheBehaviors") or [] if b.get("PathPattern") == "/assets/*"]
    bad = [w for w, b in served if b.get("TargetOriginId") != origin.get("Id") or b.get("CachePolicyId") in (None, CACHING_DISABLED)
           or set(b.get("AllowedMethods") or []) - {"GET", "HEAD"} or b.get("OriginRequestPolicyId")]
    check(config.get("DefaultRootObject") == "index.html" and len(served) == 2 and not bad,
          f"{dist}: / (DefaultRootObject index.html) and /assets/* served from the storefront bucket, cached, GET/HEAD, "
          f"nothing of the viewer forwarded (not: {bad}, root {config.get('DefaultRootObject')!r})")
    outputs = [n for n, o in (t.doc.get("Outputs") or {}).items() if t.active(o) and target_of(o.get("Value")) == bucket]
    check(bool(outputs), f"an output gives the storefront bucket's name ({outputs})")


def check_edge(t: Template) -> None:
    param = t.doc.get("Parameters", {}).get("EdgeProtection", {})
    check(set(param.get("AllowedValues") or []) == {"off", "on"} and str(param.get("Default")) == "off",
          "parameter EdgeProtection: off (default) or on")
    on = str(t.params.get("EdgeProtection")) == "on"
    storefront = on and str(t.params.get("Storefront")) == "true"
    edge = [n for n, r in t.resources.items() if t.active(r) and str(r.get("Type")).startswith(EDGE_TYPE_PREFIXES)]
    if not on:
        check(not edge, f"EdgeProtection=off creates no CloudFront, WAF or S3 resource (created: {edge})")
        return
    rules = t.doc.get("Rules", {})
    check(any("EdgeProtection" in refs_in(r.get("RuleCondition")) | set(strings_in(r.get("RuleCondition")))
              and "us-east-1" in set(strings_in(r.get("Assertions"))) for r in rules.values()),
          "a Rule refuses to create the CLOUDFRONT web ACL outside us-east-1")
    dists = t.of_type("AWS::CloudFront::Distribution")
    check(len(dists) == 1, f"EdgeProtection=on creates one CloudFront distribution ({[d for d, _ in dists]})")
    if not dists:
        return
    dist, res = dists[0]
    config = t.evaluate(res["Properties"]["DistributionConfig"])
    origin = api_origin(t, config)
    check(origin is not None and (origin.get("CustomOriginConfig") or {}).get("OriginProtocolPolicy") == "https-only",
          f"{dist}: one origin is the HTTP API's execute-api domain, HTTPS only")
    api_id = (origin or {}).get("Id")
    acl = target_of(config.get("WebACLId"))
    acl_ok = t.resources.get(acl, {}).get("Type") == "AWS::WAFv2::WebACL" and t.active(t.resources[acl])
    check(acl_ok or param_ref(t, config.get("WebACLId")) == "EdgeWebAclArn",
          f"{dist}: WebACLId is the stack's web ACL (or EdgeWebAclArn) (got {config.get('WebACLId')!r})")
    if acl_ok:
        check_web_acl(t, acl)
    check_viewer_tls(t, dist, config)
    check_behaviours(t, dist, config, api_id, storefront)
    check_security_headers(t, dist, config)
    check_access_log(t, dist, config)
    check_storefront(t, dist, config, api_id, storefront)
    outputs = [n for n, o in (t.doc.get("Outputs") or {}).items() if t.active(o) and dist in refs_in(o.get("Value"))
               and "DomainName" in "".join(strings_in(o.get("Value")))]
    check(bool(outputs), f"an output gives {dist}'s domain name ({outputs})")


def run_checks(t: Template) -> list[str]:
    failures.clear()
    check_functions(t)
    check_queue_and_consumer(t)
    check_concurrency(t)
    check_route_throttles(t)
    check_entry_policy(t)
    check_env_secrets(t)
    check_local_invoke(t)
    check_data_stores(t)
    check_stage(t)
    check_log_groups(t)
    check_egress(t)
    check_database(t)
    check_db_logins(t)
    check_redis_users(t)
    check_proxy(t)
    check_time_budgets(t)
    check_role_connection_limits(t)
    check_admin_routes(t)
    check_route_auth(t)
    check_deep_health(t)
    check_rules(t)
    check_origin_secret(t)
    check_edge(t)
    check_dashboard(t)
    return list(failures)


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


def bot_control_always(t: Template) -> None:
    rules = props(t, "EdgeWebAcl")["Rules"]
    i = next(i for i, r in enumerate(rules) if "Fn::If" in r)
    rules[i] = rules[i]["Fn::If"][1]


# (what is broken, how, a phrase every failing check of the broken copy must contain)
BREAKAGES = [
    ("a function's Redis user may run every command",
     lambda t: props(t, "RedisConsumerUser").update(AccessString="on ~* +@all"),
     "RedisConsumerUser: AccessString"),
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
    ("the entry's Timeout is 5 s again",
     lambda t: props(t, "SeckillEntryFunction").update(Timeout=5),
     "SeckillEntryFunction: time budget"),
    ("the entry waits the default 3 s for its pooled connection",
     lambda t: props(t, "SeckillEntryFunction")["Environment"]["Variables"].pop("DB_ACQUIRE_TIMEOUT_MS"),
     "SeckillEntryFunction: time budget"),
    ("the consumer waits the default 3 s for a pooled connection",
     lambda t: props(t, "OrderConsumerFunction")["Environment"]["Variables"].pop("DB_ACQUIRE_TIMEOUT_MS"),
     "OrderConsumerFunction: time budget"),
    ("RDS Proxy makes a statement wait 5 s for a connection",
     lambda t: props(t, "DatabaseProxyTargetGroup")["ConnectionPoolConfigurationInfo"].update(ConnectionBorrowTimeout=5),
     ": time budget of "),
    ("preheat's pool outgrows its role's connection limit",
     lambda t: props(t, "PreheatFunction")["Environment"]["Variables"].update(DB_MAX_CONNECTIONS="4"),
     "PreheatFunction: seckill_preheat's connection limit"),
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


def edge_on_copy(path: Path, dest: Path) -> None:
    """template.yaml with the edge, Bot Control and the storefront on by default (and a sample
    domain and certificate, which the edge requires), for the linters."""
    text = path.read_text()
    for name, value in LINT_DEFAULTS.items():
        text, n = re.subn(rf'(\n  {name}:\n(?:    .*\n)*?    Default: ).*\n', lambda m: f"{m.group(1)}{value}\n", text)
        if n != 1:
            raise ValueError(f"no `Default:` under parameter {name}")
    dest.write_text(text)


def lint_edge_on(path: Path) -> None:
    """cfn-lint and `sam validate --lint` on the edge-on copy (the Makefile lints the file itself)."""
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
            check(ok, f"{what} passes on a copy with the edge, Bot Control and the storefront on"
                  + ("" if ok else f" -- {out[-3000:]}"))


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
        print(f"check-template: cfn-lint and sam validate on {path.name} with the edge on")
        lint_edge_on(path)
        failed += failures
    if failed:
        print(f"check-template: {len(failed)} check(s) failed", file=sys.stderr)
        return 1
    print(f"check-template: all checks passed in every mode ({', '.join(label for label, _ in EDGE_MODES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
