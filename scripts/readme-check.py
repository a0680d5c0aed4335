#!/usr/bin/env python3
"""Runs the commands of README.md, so that the README cannot rot (`make test` runs this last).

Every command line of a ```sh block in README.md must be known here: either this script runs
it, exactly as written (under a few environment variables that make it fast: the debug build
instead of the release one, a smaller crowd, fewer chaos seeds), or it names where CI runs it
(`make test` is CI's command itself; CI runs on a fresh `git clone`), or why it cannot run here
(a deploy needs an AWS account). A command the README gains without an entry here fails the
check. Relative links of the README must name files that exist.

What runs, in order: `make tools-lambda && ...`, `make demo` (a small crowd, checked by its own
exit status: 0 only when nothing was oversold, no user bought twice and every unit is accounted
for), `make chaos` (one seed), `make serve` in the background, then the "Run the API" walk
through as one shell script, whose answers are checked (202 pending, then confirmed, then the
payment), and `make clean-stack` followed by `make stack` to bring the stack back.

Usage: .tools/venv/bin/python scripts/readme-check.py    (after `make stack`)
"""

from __future__ import annotations

import json
import os
import re
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

# Commands CI runs elsewhere, or that cannot run here, with where or why.
ELSEWHERE = {
    "make test": "CI's own command (.ci/run); this check is its last step",
    "git clone https://github.com/<you>/seckill.git && cd seckill":
        "CI runs `make test` on a fresh clone of the repository",
    "sam build && sam deploy --guided":
        "needs an AWS account; the template it deploys passes cfn-lint, `sam validate --lint` and "
        "scripts/check-template.py (and its self-test) in `make test`",
}


def log(msg: str) -> None:
    print(f"[readme-check] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    log(f"ERROR: {msg}")
    sys.exit(1)


def sh_blocks(text: str) -> list[list[str]]:
    """Each ```sh block as its command lines (continuations joined, comments dropped)."""
    blocks = []
    for body in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
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


def check_links(text: str) -> None:
    missing = [t for t in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text) if not (REPO / t).exists()]
    if missing:
        die(f"README links to files that do not exist: {missing}")
    log("every relative link of the README names a file that exists")


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
        self.proc = subprocess.Popen(["bash", "-c", cmd.rstrip("& ").strip()], cwd=REPO,
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
    out = run(script, timeout=300, quiet=True)
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
    text = README.read_text()
    check_links(text)
    blocks = sh_blocks(text)
    # Each distinct command once (the first screen repeats the Quick start's `make demo`).
    everything = list(dict.fromkeys(c for b in blocks for c in b))
    walk = next((b for b in blocks if b and b[0].startswith("make serve")), None)
    if walk is None:
        die("the README has no ```sh block that starts with `make serve` (the API walk through)")
    ran: set[str] = set()

    for cmd in everything:
        if cmd.startswith("make tools-lambda"):
            run(cmd)
            ran.add(cmd)
    for cmd in everything:
        if cmd.startswith("make demo"):
            run(cmd, DEMO_FAST, timeout=1200)
            ran.add(cmd)
        elif cmd.startswith("make chaos"):
            run("make chaos SEEDS=1 MINUTES=1", FAST, timeout=900)
            ran.add(cmd)

    serve = Serve(walk[0])
    try:
        walk_through(walk[1:])
    finally:
        serve.stop()
    ran.update(walk)

    for cmd in everything:
        if cmd == "make clean-stack":
            run(cmd)
            run("make stack")
            ran.add(cmd)

    unknown = [c for c in everything if c not in ran and c not in ELSEWHERE]
    if unknown:
        die(f"README commands nobody runs (run them here, or say in ELSEWHERE where CI does): {unknown}")
    for cmd, where in ELSEWHERE.items():
        if cmd not in everything:
            die(f"ELSEWHERE names a command the README no longer has: {cmd!r}")
        log(f"not run here: `{cmd}`: {where}")
    log(f"all {len(everything)} README commands accounted for ({len(ran)} run here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
