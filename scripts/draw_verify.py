#!/usr/bin/env python3
"""Checks a draw sale's draw from what its public view publishes (Python's standard library only).

A draw sale's entrant gets a ticket: the first 52 bits (13 hex digits) of
HMAC-SHA1(secret, user id), the secret being 32 random bytes the sale was created with. The
draw takes the lowest tickets first. Before the draw the public view shows only the secret's
SHA-256 (`draw.commitment`); once the draw is done it shows the secret (`draw.secret`) and the
last ticket the draw looked at (`draw.cutoff`). This script checks that the secret is the one
committed to, and recomputes each given user's ticket:

    python3 scripts/draw_verify.py --view http://127.0.0.1:3000/activities/7 alice bob
    python3 scripts/draw_verify.py --secret HEX --commitment HEX --cutoff N alice
    python3 scripts/draw_verify.py --secret HEX --json alice bob    (tickets as JSON)

A ticket above the cutoff lost. A ticket at or below it was looked at by the draw: it won
unless the stock left at its turn was smaller than its quantity, or the user held an order
already (with a per-order limit of 1, at or below the cutoff is a win). What this proves and
what it does not is in docs/invariants.md ("Draw admission", "What the tickets prove").

Exits 1 when the secret does not match the commitment.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sys
import urllib.request


def ticket(secret_hex: str, user: str) -> int:
    """The user's ticket: HMAC-SHA1(secret, user id), its first 52 bits."""
    digest = hmac.new(bytes.fromhex(secret_hex), user.encode(), hashlib.sha1).hexdigest()
    return int(digest[:13], 16)


def commitment(secret_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(secret_hex)).hexdigest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("users", nargs="*", help="user ids (the `sub` of their tokens)")
    parser.add_argument("--view", help="the sale's public view URL: reads the draw from it")
    parser.add_argument("--secret", help="the revealed secret, hex")
    parser.add_argument("--commitment", help="the SHA-256 the view showed before the draw, hex")
    parser.add_argument("--cutoff", type=int, help="the last ticket the draw looked at")
    parser.add_argument("--json", action="store_true", help="print {user: ticket} as JSON")
    args = parser.parse_args(argv)

    secret, committed, cutoff = args.secret, args.commitment, args.cutoff
    if args.view:
        with urllib.request.urlopen(args.view, timeout=10) as answer:
            draw = json.load(answer).get("draw") or {}
        if not draw:
            print(f"{args.view}: not a draw sale", file=sys.stderr)
            return 2
        committed = committed or draw.get("commitment")
        secret = secret or draw.get("secret")
        cutoff = cutoff if cutoff is not None else draw.get("cutoff")
    if not secret:
        print("no secret: the draw is not done yet (or pass --secret)", file=sys.stderr)
        return 2
    if committed is not None:
        if commitment(secret) != committed.lower():
            print(f"MISMATCH: SHA-256 of the secret is {commitment(secret)}, the commitment {committed}")
            return 1
        if not args.json:
            print(f"ok: the secret's SHA-256 is the commitment {committed}")
    tickets = {user: ticket(secret, user) for user in args.users}
    if args.json:
        print(json.dumps(tickets))
        return 0
    for user, t in tickets.items():
        verdict = ""
        if cutoff is not None:
            verdict = " lost (above the cutoff)" if t > cutoff else " looked at by the draw (at or below the cutoff)"
        print(f"{user}: ticket {t}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
