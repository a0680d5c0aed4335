"""The functions themselves: what they are built from and how many of them may run.

Each function is a Rust binary of the workspace's default members, on provided.al2023 arm64,
with every variable shared::Config requires; the SQS consumer's queue, batch and concurrency fit
its timeout and the database budget; the reservations leave AWS its unreserved minimum."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from .model import REPO, Template, num, target_of
from .report import check


# shared::Config's default when DB_MAX_CONNECTIONS is unset (`--help` on any function shows it).
DEFAULT_DB_MAX_CONNECTIONS = 4

# AWS keeps this much of an account's Lambda concurrency unreserved: reservations beyond
# AccountConcurrency - 100 fail the deploy.
UNRESERVED_MINIMUM = 100

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
        # Every SQS mapping of the function may run its MaximumConcurrency at once.
        mappings = [(n, t.number((e.get("Properties", {}).get("ScalingConfig") or {}).get("MaximumConcurrency")))
                    for n, e in (fn.get("Properties", {}).get("Events") or {}).items() if e.get("Type") == "SQS"]
        reserved = t.reserved(fn)
        if reserved is not None and all(m is not None for _, m in mappings):
            total = sum(m for _, m in mappings)
            each = " + ".join(f"{n} MaximumConcurrency {m:g}" for n, m in mappings)
            check(
                reserved >= total,
                f"{name}: ReservedConcurrentExecutions {reserved:g} >= {each} = {total:g}"
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
