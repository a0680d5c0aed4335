"""One line per check, and the failures of the current run.

`check` prints `ok  ` or `FAIL` and the check's text; `failures` holds the texts that failed since
the caller last cleared it (run.run_checks clears it per mode)."""

from __future__ import annotations


failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)
