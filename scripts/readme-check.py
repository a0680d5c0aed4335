#!/usr/bin/env python3
"""Runs the commands of README.md, so that the README cannot rot (`make test` runs this last).

Every command line of a ```sh block in README.md (one indented in a list item included) must be
known here: either this script runs it, exactly as written (under a few environment variables
that make it fast: the debug build instead of the release one, a smaller crowd, fewer chaos
seeds), or ELSEWHERE names where CI runs it (`make test` is CI's command itself) or why it
cannot run here (a deploy needs an AWS account). A command the README gains without an entry
here fails the check. Every command of docs/*.md is accounted for by a rule of DOCS_RULES (none
of them runs here). Every relative link of the README and of docs/*.md must name a file that
exists, and its #anchor, if any, a heading of that file.

What runs, in order: `sudo bash scripts/prerequisites.sh` (root runs it without sudo where there
is none), `make tools-lambda && ...`, `make demo` (a small crowd, checked by its own exit status:
0 only when nothing was oversold, no user bought twice and every unit is accounted for), `make
chaos` (one seed) if the README has it, then "Run the API": the block that is `make serve` alone
(the first terminal) in the background until GET /health answers, and the block that starts by
waiting for it (the second terminal) as one shell script, whose answers are checked (202
pending, then confirmed, then paid); last `make clean-stack`, followed by `make stack` to bring
the stack back.

Usage: .tools/venv/bin/python scripts/readme-check.py            (after `make stack`)
       .tools/venv/bin/python scripts/readme-check.py --static   (runs nothing: checks the links
                                                                  and that every command is known)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
WORK = REPO / "target" / "readme-check"
SERVE_URL = "http://127.0.0.1:3000"

# Runs of the README's commands use the debug binaries `make test` built, not a release build.
FAST = {"PROFILE": "dev"}
DEMO_FAST = {**FAST, "DEMO_ARGS": "--stock 50 --users 400 --requests 2000 --concurrency 32 --opens-in-secs 3"}

# The one command that needs root: idempotent, and quick when everything is there. Run as
# written where sudo exists; where it does not (a root container, CI) root runs it without.
PREREQUISITES = "sudo bash scripts/prerequisites.sh"
# "Run the API": `make serve` alone in one block (the first terminal), and a block (the second
# terminal) that starts by waiting for it to answer.
SERVE = "make serve"
WALK_START = "until curl -sf localhost:3000/health; do sleep 1; done"

# Commands CI runs elsewhere, or that cannot run here, with where or why.
ELSEWHERE = {
    "make test": "CI's own command (.ci/run); this check is its last step",
    "sam build && sam deploy --parameter-overrides UserPool=on":
        "needs an AWS account; the template it deploys passes cfn-lint, `sam validate --lint` and "
        "scripts/check-template.py (and its self-test) in `make test`",
}

# The commands of docs/*.md: none runs here, each is accounted for by the first rule that
# matches it (a regular expression over the command, continuations joined), with where CI runs
# the same thing or why it cannot run here. A docs command no rule covers fails the check.
NEEDS_AWS = "needs a deployed stack and an AWS account; the template passes every check of `make test`"
DOCS_RULES: list[tuple[str, str]] = [
    (r"^make (tools-lambda|stack)\b", "`make test` runs `make stack`, which installs the same tools"),
    (r"^(source scripts/env\.sh|source \.tools/venv/bin/activate)\b", "every Makefile recipe sources env.sh"),
    (r"^rustup target add aarch64-unknown-linux-gnu$", "rust-toolchain.toml lists the target; rustup installs it"),
    (r"^bash scripts/check-build-tools\.sh$", "`make test` runs it"),
    (r"^make lint-template$", "`make test` runs the same checks"),
    (r"^make sqlx-prepare$", "rewrites .sqlx/; `make test` builds offline from the committed .sqlx/"),
    (r"^git add \.sqlx$", "a commit, not a check"),
    (r"^make chaos\b", "`make test` runs the chaos binary (three seeds in each of its four runs); "
     "`make chaos` is the same binary over many seeds, run before a change lands"),
    (r"^make (wrk-check|draw-check)\b",
     "load checks of minutes each (wrk at 256 connections, a draw of 120,000 entrants); run by hand "
     "before a release, each fails on its own findings"),
    (r"^(until curl -sf localhost:3000/health|ADMIN=\$\(make -s token|curl -s -XPOST localhost:3000/admin/activities"
     r"|source scripts/env\.sh && target/local/seckill-token|wrk )",
     "docs/development.md's load test by hand: `make wrk-check` scripts the same server, tokens and wrk run"),
    (r"^(cargo lambda (watch|invoke)|until curl -s -o /dev/null 127\.0\.0\.1:9000)",
     "tests/tests/lambda_invoke.rs runs the functions under `cargo lambda watch` and invokes them"),
    (r"^sam (local|build && sam local) invoke\b", "needs Docker, which CI's machine does not run"),
    (r"^curl -s -XPOST localhost:3000/", "by hand against `make serve`; the router tests (tests/tests/http.rs) "
     "make the same requests"),
    (r"^cat > /tmp/alias\.json <<EOF", NEEDS_AWS),
    (r"^(sam (build|deploy|delete)|aws |out\(\)|secret\(\)|token\(\)|POOL=|USER_TOKEN=|ADMIN_TOKEN=|API=|API_ID="
     r"|REGION=|BUCKET=|DIST=|CLUSTER=|B=|for kind in|jq -R|curl -s (-X POST )?\"\$API|curl -s --aws-sigv4)",
     NEEDS_AWS),
]

# How this script runs each command it runs (None: the walk through's, or not at all).
STEPS = ("prerequisites", "tools", "demo", "chaos", "serve", "clean-stack")


def step_of(cmd: str) -> str | None:
    if cmd == PREREQUISITES:
        return "prerequisites"
    if cmd.startswith("make tools-lambda"):
        return "tools"
    if cmd.startswith("make demo"):
        return "demo"
    if cmd.startswith("make chaos"):
        return "chaos"
    if cmd == SERVE:
        return "serve"
    if cmd == "make clean-stack":
        return "clean-stack"
    return None


def log(msg: str) -> None:
    print(f"[readme-check] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    log(f"ERROR: {msg}")
    sys.exit(1)


FENCED = re.compile(r"^[ \t]*```.*?^[ \t]*```", flags=re.S | re.M)


def sh_blocks(text: str, keep_lines: bool = False) -> list[list[str]]:
    """Each ```sh block as its command lines (continuations joined, comments dropped), indented
    ones (in a list item) included; with keep_lines, each line as written (for whole_commands)."""
    blocks = []
    for body in re.findall(r"^[ \t]*```sh\n(.*?)^[ \t]*```", text, flags=re.S | re.M):
        if keep_lines:
            blocks.append([raw for raw in body.splitlines() if raw.strip() and not raw.strip().startswith("#")])
            continue
        lines, pending = [], ""
        for raw in body.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
        blocks.append(lines)
    return blocks


def anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives the headings of a Markdown file (a repeated one gets -1, -2)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t]*$", FENCED.sub("", path.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def check_links(files: list[Path]) -> None:
    """Every relative link outside code blocks names a file that exists, and its #anchor, if
    any, a heading of that Markdown file."""
    broken = []
    for path in files:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCED.sub("", path.read_text())):
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto:, ...
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(REPO)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(REPO)}")
    if broken:
        die("broken links:\n  " + "\n  ".join(broken))
    log(f"every relative link of README.md and docs/*.md ({len(files)} files) resolves")


def plan(blocks: list[list[str]]) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """The README's distinct commands, the walk through's lines, and which commands each step
    runs; dies on a command nobody runs or accounts for, or an ELSEWHERE entry the README lost."""
    # Each distinct command once (the first screen repeats the Quick start's `make demo`).
    everything = list(dict.fromkeys(c for b in blocks for c in b))
    if [SERVE] not in blocks:
        die(f"the README has no ```sh block that is `{SERVE}` alone (the first terminal of Run the API)")
    walk = next((b for b in blocks if b and b[0] == WALK_START), None)
    if walk is None:
        die(f"the README has no ```sh block that starts with `{WALK_START}` (the API walk through)")
    steps: dict[str, list[str]] = {s: [c for c in everything if step_of(c) == s] for s in STEPS}
    unknown = [c for c in everything if step_of(c) is None and c not in walk and c not in ELSEWHERE]
    if unknown:
        die(f"README commands nobody runs (run them here, or say in ELSEWHERE where CI does): {unknown}")
    for cmd in ELSEWHERE:
        if cmd not in everything:
            die(f"ELSEWHERE names a command the README no longer has: {cmd!r}")
    return everything, walk, steps


def open_quote(text: str) -> bool:
    """Whether text ends inside a quoted string (single or double, backslash escapes outside
    single quotes)."""
    quote, i = "", 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        i += 1
    return bool(quote)


def whole_commands(lines: list[str]) -> list[str]:
    """A block's lines grouped into whole commands: a line ending in a backslash, a quoted string
    over several lines, a here-document and a loop to its `done` are one command each."""
    commands, pending, until = [], [], None
    for raw in lines:
        line = raw.strip()
        pending.append(line)
        if until is not None:
            if line == until or (until == "done" and line.startswith("done")):
                until = None
            else:
                continue
        else:
            heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
            if heredoc and len(pending) == 1:
                until = heredoc.group(1)
                continue
            if re.match(r"(for|while|until)\b", pending[0]) and not re.search(r"\bdone\b", " ".join(pending)):
                until = "done"
                continue
        text = "\n".join(pending)
        if text.endswith("\\") or open_quote(re.sub(r"\s+#\s.*$", "", text, flags=re.M)):
            continue
        commands.append(text)
        pending = []
    if pending:
        commands.append("\n".join(pending))
    return commands


def check_docs_commands() -> None:
    """Every command of a ```sh block in docs/*.md is covered by a rule of DOCS_RULES."""
    uncovered, covered = [], 0
    for path in sorted((REPO / "docs").glob("*.md")):
        for cmd in (c for block in sh_blocks(path.read_text(), keep_lines=True) for c in whole_commands(block)):
            if any(re.search(rule, re.sub(r"\s+#\s.*$", "", cmd, flags=re.M)) for rule, _ in DOCS_RULES):
                covered += 1
            else:
                uncovered.append(f"{path.relative_to(REPO)}: {cmd}")
    if uncovered:
        die("docs commands no rule of DOCS_RULES accounts for (add one, with where CI runs it or why "
            "it cannot run):\n  " + "\n  ".join(uncovered))
    log(f"all {covered} commands of docs/*.md accounted for (DOCS_RULES)")


def prerequisites() -> None:
    if shutil.which("sudo"):
        run(PREREQUISITES)
    elif os.geteuid() == 0:
        log(f"no sudo here and we are root: `{PREREQUISITES}` runs without sudo")
        run("bash scripts/prerequisites.sh")
    else:
        die(f"`{PREREQUISITES}` needs root, and there is no sudo here")


def run(cmd: str, env: dict[str, str] | None = None, timeout: int = 900, quiet: bool = False) -> str:
    if not quiet:
        log(f"$ {cmd}" + (f"   ({' '.join(f'{k}={v}' for k, v in env.items())})" if env else ""))
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", cmd], cwd=REPO, env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if proc.returncode != 0:
        print(proc.stdout[-6000:], file=sys.stderr)
        die(f"`{cmd}` exited {proc.returncode}")
    log(f"  ok in {time.monotonic() - started:.0f} s")
    return proc.stdout


def get(path: str, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(SERVE_URL + path, headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Serve:
    """`make serve` in the background, in its own process group."""

    def __init__(self, cmd: str):
        WORK.mkdir(parents=True, exist_ok=True)
        self.log_path = WORK / "serve.log"
        log(f"$ {cmd}   (in the background, PROFILE=dev, log {self.log_path})")
        self.proc = subprocess.Popen(["bash", "-c", cmd], cwd=REPO,
                                     env={**os.environ, **FAST}, stdout=self.log_path.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                print(self.log_path.read_text()[-4000:], file=sys.stderr)
                die("`make serve` exited")
            try:
                if get("/health")[0] == 200:
                    log("  the API answers on 127.0.0.1:3000")
                    return
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        die("`make serve` did not answer GET /health within 10 minutes")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def walk_through(lines: list[str]) -> None:
    """The "Run the API" commands as one script, then what they must have done."""
    # Each command's answer on a line of its own (curl prints none after the body).
    script = "set -euo pipefail\nsource scripts/env.sh\n" + "".join(f"{line}\necho\n" for line in lines)
    script += 'echo "SALE=$SALE ORDER=${ORDER:-}"\necho "ALICE=$ALICE"\n'
    log(f"the walk through of the API: {len(lines)} commands")
    # PROFILE=dev, as the server's: `make token` then finds the binaries `make serve` built.
    out = run(script, FAST, timeout=300, quiet=True)
    sale = re.search(r"^SALE=(\d+) ORDER=(\S*)$", out, flags=re.M)
    alice = re.search(r"^ALICE=(\S+)$", out, flags=re.M)
    if not sale or not alice:
        die(f"the walk through named no sale or token:\n{out[-3000:]}")
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for answer in answers:
        log(f"  {json.dumps(answer)[:160]}")
    purchase = next((a for a in answers if "requestId" in a and a.get("status") in ("pending", "queued")), None)
    if purchase is None:
        die(f"no 202 pending answer among the walk through's answers: {answers}")
    status, me = get(f"/activities/{sale.group(1)}/orders/me", alice.group(1))
    if status != 200 or me.get("status") != "paid" or str(me.get("orderId")) != sale.group(2):
        die(f"alice's order after the walk through: {status} {me}")
    log(f"  sale {sale.group(1)}: alice's order {me.get('orderId')} is {me.get('status')}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Runs or accounts for every command of README.md; checks the links of the README and docs/*.md.")
    parser.add_argument("--static", action="store_true",
                        help="run nothing: check the links and that every command is run here or named in ELSEWHERE")
    args = parser.parse_args()

    check_links([README, *sorted((REPO / "docs").glob("*.md"))])
    everything, walk, steps = plan(sh_blocks(README.read_text()))
    check_docs_commands()
    if args.static:
        for step in STEPS:
            for cmd in steps[step]:
                log(f"runs ({step}): `{cmd}`")
        log(f"runs (the walk through, after `{SERVE}` answers): {len(walk)} commands")
        for cmd, where in ELSEWHERE.items():
            log(f"not run here: `{cmd}`: {where}")
        log(f"all {len(everything)} README commands accounted for (--static: none run)")
        return 0

    ran: set[str] = set()
    if steps["prerequisites"]:
        prerequisites()
        ran.update(steps["prerequisites"])
    for cmd in steps["tools"]:
        run(cmd)
        ran.add(cmd)
    for cmd in steps["demo"]:
        run(cmd, DEMO_FAST, timeout=1200)
        ran.add(cmd)
    for cmd in steps["chaos"]:
        run("make chaos SEEDS=1 MINUTES=1", FAST, timeout=900)
        ran.add(cmd)

    serve = Serve(SERVE)
    try:
        walk_through(walk)
    finally:
        serve.stop()
    ran.add(SERVE)
    ran.update(walk)

    for cmd in steps["clean-stack"]:
        run(cmd)
        run("make stack")
        ran.add(cmd)

    for cmd, where in ELSEWHERE.items():
        log(f"not run here: `{cmd}`: {where}")
    missed = [c for c in everything if c not in ran and c not in ELSEWHERE]
    if missed:
        die(f"README commands this run skipped: {missed}")
    log(f"all {len(everything)} README commands accounted for ({len(ran)} run here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
