"""Fixtures of the browser suite: Debian's Chromium driven by Playwright, the dev server's API.

scripts/browser-tests.sh starts a dev server of its own and passes its address as SECKILL_URL,
and a second one that takes payments with Stripe against localstripe as SECKILL_STRIPE_URL
(localstripe's address and the API key that server uses: LOCALSTRIPE_URL, LOCALSTRIPE_KEY);
screenshots go to BROWSER_OUT (target/browser). Sales are created through the admin API with an
admin token from POST /dev/token, as the operator page gets one.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import count
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

BASE = os.environ.get("SECKILL_URL", "http://127.0.0.1:3000").rstrip("/")
STRIPE_BASE = os.environ.get("SECKILL_STRIPE_URL", "").rstrip("/")
LOCALSTRIPE = os.environ.get("LOCALSTRIPE_URL", "http://127.0.0.1:8420").rstrip("/")
LOCALSTRIPE_KEY = os.environ.get("LOCALSTRIPE_KEY", "sk_test_browser")
OUT = Path(os.environ.get("BROWSER_OUT", "target/browser"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# The machine's network is closed: without the background-networking flags Chromium keeps
# trying Google's hosts and floods refused connections.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

expect.set_options(timeout=10_000)

_names = count(1)


def unique(prefix: str) -> str:
    """A user name no other test of this run signs in as."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


def rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Answer:
    status: int
    body: dict
    headers: dict


class Api:
    """The dev server's HTTP API, as a test needs it (stdlib only)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.admin = self.token("browser-ops", admin=True)

    def call(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                return Answer(res.status, json.loads(res.read() or b"null"), {k.lower(): v for k, v in res.headers.items()})
        except urllib.error.HTTPError as e:
            return Answer(e.code, json.loads(e.read() or b"null"), {k.lower(): v for k, v in e.headers.items()})

    def token(self, user: str, admin: bool = False) -> str:
        a = self.call("POST", "/dev/token", {"user": user, "admin": admin})
        assert a.status == 200, a
        return a.body["token"]

    def server_now(self) -> datetime:
        a = self.call("GET", "/health")
        assert a.status == 200 and a.headers.get("cache-control") == "no-store", a
        return datetime.fromisoformat(a.body["serverTime"].replace("Z", "+00:00"))

    def create_sale(self, title: str, stock: int, starts_in: float, lasts: float = 3600, **extra) -> dict:
        """A published sale starting `starts_in` seconds from now on the server's clock."""
        start = self.server_now() + timedelta(seconds=starts_in)
        body = {
            "title": title,
            "totalStock": stock,
            "perOrderLimit": extra.pop("perOrderLimit", 1),
            "priceMinor": extra.pop("priceMinor", 1999),
            "currency": extra.pop("currency", "usd"),
            "startAt": rfc3339(start),
            "endAt": rfc3339(start + timedelta(seconds=lasts)),
            **extra,
        }
        a = self.call("POST", "/admin/activities", body, self.admin)
        assert a.status == 201, a
        return a.body

    def purchase(self, token: str, sale_id: int, quantity: int = 1) -> Answer:
        return self.call("POST", f"/activities/{sale_id}/orders", {"quantity": quantity}, token)

    def my_order(self, token: str, sale_id: int) -> dict:
        a = self.call("GET", f"/activities/{sale_id}/orders/me", token=token)
        assert a.status == 200, a
        return a.body


@pytest.fixture(scope="session")
def api() -> Api:
    return Api(BASE)


@pytest.fixture(scope="session")
def stripe_api() -> Api:
    """The dev server that takes payments with Stripe (localstripe), which browser-tests.sh starts."""
    if not STRIPE_BASE:
        pytest.skip("SECKILL_STRIPE_URL is not set: run the suite with scripts/browser-tests.sh")
    return Api(STRIPE_BASE)


class Localstripe:
    """localstripe's API, as Stripe's servers and a buyer's card would drive it (stdlib only)."""

    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.key = key

    def post(self, path: str, form: dict[str, str]) -> dict:
        req = urllib.request.Request(self.base + path, data=urllib.parse.urlencode(form).encode(), method="POST")
        req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                return json.loads(res.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"localstripe {path}: {e.code} {e.read()!r}") from None

    def intent(self, payment_id: str) -> dict:
        req = urllib.request.Request(f"{self.base}/v1/payment_intents/{payment_id}")
        req.add_header("Authorization", f"Bearer {self.key}")
        with urllib.request.urlopen(req, timeout=10) as res:
            return json.loads(res.read())

    def attach_card(self, payment_id: str, card: dict[str, str]) -> dict:
        """The card made a PaymentMethod, attached to the intent, and the intent confirmed with it:
        what Stripe's servers do when Stripe.js's confirmCardPayment sends the card."""
        pm = self.post("/v1/payment_methods", {"type": "card", **{f"card[{k}]": v for k, v in card.items()}})
        self.post(f"/v1/payment_intents/{payment_id}", {"payment_method": pm["id"]})
        return self.post(f"/v1/payment_intents/{payment_id}/confirm", {})


@pytest.fixture(scope="session")
def localstripe() -> Localstripe:
    return Localstripe(LOCALSTRIPE, LOCALSTRIPE_KEY)


@pytest.fixture(scope="session")
def browser() -> Browser:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def context(browser: Browser) -> BrowserContext:
    ctx = browser.new_context(
        base_url=BASE, viewport={"width": 1100, "height": 860}, locale="en-GB", timezone_id="UTC"
    )
    yield ctx
    # A route handler still answering the pages' polls must not outlive the test (its
    # error would surface in the next one).
    for page in ctx.pages:
        page.unroute_all(behavior="ignoreErrors")
    ctx.unroute_all(behavior="ignoreErrors")
    ctx.close()


@pytest.fixture
def shot():
    """shot(page, name): a full-page screenshot, target/browser/<name>.png."""

    def take(page: Page, name: str) -> None:
        page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)

    return take


def sign_in(page: Page, user: str) -> None:
    """The storefront's (or operator page's) dev sign-in form."""
    page.fill("#user", user)
    page.click("#sign-in-button")
    expect(page.locator("#whoami")).to_be_visible()
    expect(page.locator("#who")).to_have_text(user)
