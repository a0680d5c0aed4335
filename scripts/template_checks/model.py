"""template.yaml as it deploys: parameters resolved, conditions decided, and the helpers that read values.

Parameters resolve to their defaults, overridden by `parameter_overrides` in samconfig.toml
([default.deploy.parameters]) when asked; the edge modes are the parameter sets every check runs
under."""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path

from cfnlint.decode import cfn_yaml


# The checkout (this package is scripts/template_checks/).
REPO = Path(__file__).resolve().parents[2]

FUNCTION = "AWS::Serverless::Function"

NO_VALUE = {"Ref": "AWS::NoValue"}
# The region `sam validate` and cfn-lint assume here; conditions on AWS::Region evaluate with it.
REGION = "us-east-1"
# The edge needs a domain and an ACM certificate in us-east-1 (TLS 1.2 cannot be enforced on
# CloudFront's default certificate): samples for the "on" modes and the lint copy.
SAMPLE_DOMAIN = "api.example.com"
SAMPLE_CERTIFICATE = "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"
EDGE_ON = {"EdgeProtection": "on", "EdgeDomainName": SAMPLE_DOMAIN, "EdgeCertificateArn": SAMPLE_CERTIFICATE}
# The template has no default issuer (its Rules refuse a deploy without JwtIssuer + JwtAudience
# or UserPool=on): a sample issuer for the checks that need the other Rules alone to decide.
SAMPLE_ISSUER = "https://issuer.example.com/"
IDENTITY_GIVEN = {"JwtIssuer": SAMPLE_ISSUER, "JwtAudience": "seckill-client"}
# Who issues tokens: your provider, or the stack's own user pool (identity.py checks both).
IDENTITY_MODES = (("UserPool=off, JwtIssuer given", {"UserPool": "off", **IDENTITY_GIVEN}),
                  ("UserPool=on", {"UserPool": "on", "JwtIssuer": "", "JwtAudience": ""}))
# Every check runs in each mode; the lint copy turns every switch on at once.
EDGE_MODES = (("EdgeProtection=off", {"EdgeProtection": "off"}),
              ("EdgeProtection=on", EDGE_ON),
              ("EdgeProtection=on, Storefront=true", {**EDGE_ON, "Storefront": "true"}))


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


def props_of(resource: dict) -> dict:
    return resource.get("Properties", {}) or {}
