"""The storefront (web/index.html) in Chromium against a dev server: the countdown on the
server's clock, buying at the opening with the button grey while the request is out, a second
tab of the same buyer, a draw sale, a sold-out sale, cancel, pay with the local provider, pay
by card with Stripe.js against localstripe, and the buyer's own purchase, cancel and payment
shown at once (not at the next poll), an older answer never over a newer one."""

from __future__ import annotations

import hashlib
import re
import time
from datetime import datetime, timedelta, timezone

import pytest
from conftest import LOCALSTRIPE, Api, Localstripe, sign_in, unique
from playwright.sync_api import APIResponse, BrowserContext, Page, Route, expect


def open_sale(context: BrowserContext, sale_id: int, user: str) -> Page:
    page = context.new_page()
    page.goto(f"/?sale={sale_id}")
    sign_in(page, user)
    return page


def order_status(page: Page):
    return page.locator("#order")


def test_countdown_on_the_server_clock_then_buy_at_the_opening(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Opening sale", stock=5, starts_in=7)
    # The browser's clock is an hour behind: a countdown on it would read about 1:00:07.
    context.clock.install(time=datetime.now(timezone.utc) - timedelta(hours=1))
    user = unique("buyer")
    page = open_sale(context, sale["id"], user)
    # The same buyer in a second tab, waiting for the same opening.
    tab2 = open_sale(context, sale["id"], user)

    buy = page.locator("#buy")
    expect(page.locator("#title")).to_have_text("Opening sale")
    expect(page.locator("#countdown-label")).to_have_text("Starts in")
    expect(page.locator("#countdown")).to_have_text(re.compile(r"^0:0[1-7]$"))
    remaining = int(page.locator("#countdown").get_attribute("data-remaining-ms"))
    assert 0 < remaining < 8_000, remaining
    expect(buy).to_be_disabled()
    expect(page.locator("#buy-hint")).to_have_text("Opens at the start.")
    # The page measured the hour: its offset from the server is about +3,600,000 ms.
    expect(page.locator("#clock")).to_contain_text("round trip")
    offset = int(re.search(r"offset (-?\d+) ms", page.locator("#clock").inner_text()).group(1))
    assert abs(offset - 3_600_000) < 2_000, offset
    shot(page, "storefront-countdown")

    # Hold the purchase at the network so its in-flight window can be seen.
    held: list[Route] = []

    def hold(route: Route) -> None:
        if route.request.method == "POST":
            held.append(route)
        else:
            route.continue_()

    page.route("**/activities/*/orders", hold)
    expect(buy).to_be_enabled(timeout=15_000)
    opened_at = api.server_now()
    buy.click()
    # Grey from the click until the answer: the request has not even been let through yet.
    expect(buy).to_be_disabled()
    expect(buy).to_have_text("Sending…")
    deadline = time.monotonic() + 5
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert len(held) == 1, "the click sent one purchase"
    assert held[0].request.post_data_json == {"quantity": 1}
    page.wait_for_timeout(300)
    expect(buy).to_be_disabled()
    shot(page, "storefront-in-flight")
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/orders")) as answer:
        held[0].continue_()
    assert answer.value.status == 202, answer.value.text()
    assert answer.value.json()["status"] == "pending"
    page.unroute("**/activities/*/orders")
    start = datetime.fromisoformat(sale["startAt"].replace("Z", "+00:00"))
    assert opened_at - start < timedelta(seconds=2), "bought at the opening"

    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)
    expect(page.locator("#order-status")).to_contain_text("Confirmed: Order #")
    expect(page.locator("#pay")).to_be_visible()
    expect(page.locator("#cancel")).to_be_enabled()
    expect(buy).to_be_disabled()
    shot(page, "storefront-confirmed")

    # The second tab's buyer already holds that order.
    tab2.locator("#buy").click()
    expect(tab2.locator("#message")).to_have_attribute("data-code", "already_purchased")
    expect(tab2.locator("#message")).to_contain_text("already have an order")
    expect(order_status(tab2)).to_have_attribute("data-status", "confirmed")
    shot(tab2, "storefront-already-purchased")


def test_pay_a_confirmed_order(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Pay sale", stock=3, starts_in=-1)
    page = open_sale(context, sale["id"], unique("payer"))
    page.locator("#buy").click()
    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)

    with page.expect_response(lambda r: re.search(r"/orders/\d+/pay$", r.url) is not None) as paid:
        with page.expect_request(lambda r: "/complete" in r.url and r.method == "POST") as completed:
            page.locator("#pay").click()
    payment = paid.value.json()
    assert paid.value.status == 200, payment
    assert payment["provider"] == "local" and payment["status"] in ("requires_payment", "succeeded")
    assert payment["completeUrl"] and completed.value.url.endswith(payment["completeUrl"])
    # Paid only once the provider's event reached the server; the page waits for orders/me.
    expect(order_status(page)).to_have_attribute("data-status", "paid", timeout=15_000)
    expect(page.locator("#order-status")).to_contain_text("Paid:")
    expect(page.locator("#pay")).to_be_hidden()
    shot(page, "storefront-paid")


# A 3-D Secure test card (Stripe's, and localstripe's list of cards that need authentication),
# as the buyer types it into the card Element; exp_year is two digits there.
THREE_D_SECURE_CARD = {"number": "4000002500003155", "exp_month": "12", "exp_year": "40", "cvc": "123",
                       "postal_code": "10115"}


def test_pay_by_card_with_stripe_js(context: BrowserContext, stripe_api: Api, localstripe: Localstripe, shot):
    """The page confirms the PaymentIntent with Stripe.js (localstripe's mock, from its origin,
    which the page's CSP allows), and reads `paid` once localstripe's own signed webhook paid it.

    localstripe's Stripe.js takes no card itself: its confirmCardPayment only completes the 3-D
    Secure step of an intent Stripe's servers already confirmed with a card (it asks "Complete
    authentication" or "Fail authentication" in a box of its own, then answers the intent). So
    the test plays Stripe's servers for the card the buyer typed: that card attached and the
    intent confirmed, `requires_action`. From there only the page's confirmCardPayment carries
    the intent on to `succeeded`, and only localstripe's webhook carries the order to `paid`."""
    sale = stripe_api.create_sale("Card sale", stock=2, starts_in=-1)
    page = context.new_page()
    # Chromium reports each thing the CSP refused on the console.
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))

    def refused() -> list[str]:
        return [m for m in console if "Content Security Policy" in m or m.startswith("pageerror")]

    served = page.goto(f"{stripe_api.base}/?sale={sale['id']}")
    csp = served.headers["content-security-policy"]
    assert f"script-src 'self' {LOCALSTRIPE};" in csp and f"connect-src 'self' {LOCALSTRIPE};" in csp, csp
    assert "stripe.com" not in csp, csp
    sign_in(page, unique("card-payer"))
    page.locator("#buy").click()
    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)

    with page.expect_response(lambda r: re.search(r"/orders/\d+/pay$", r.url) is not None) as started:
        page.locator("#pay").click()
    payment = started.value.json()
    assert started.value.status == 200, payment
    assert payment["provider"] == "stripe" and payment["status"] == "requires_payment", payment
    assert payment["clientSecret"].startswith(f"{payment['paymentId']}_secret_"), payment
    assert payment["publishableKey"].startswith("pk_test_"), payment
    assert payment["jsUrl"] == f"{LOCALSTRIPE}/js.stripe.com/v3/" and "completeUrl" not in payment, payment
    intent = payment["paymentId"]

    # Stripe.js's card Element, mounted in the page's card form.
    expect(page.locator("#card-form")).to_be_visible()
    expect(page.locator("#pay")).to_be_hidden()
    expect(page.locator("#card-pay")).to_contain_text("19.99")
    field = lambda name: page.locator(f"#card-element input[placeholder='{name}']")  # noqa: E731
    for name, value in THREE_D_SECURE_CARD.items():
        field(name).fill(value)
    typed = {name: field(name).input_value() for name in ("number", "exp_month", "exp_year", "cvc")}
    typed["exp_year"] = "20" + typed["exp_year"]
    shot(page, "storefront-card-form")

    # A failed authentication: Stripe.js's refusal is shown, and nothing is paid.
    assert localstripe.attach_card(intent, typed)["status"] == "requires_action"
    page.locator("#card-pay").click()
    page.get_by_role("button", name="Fail authentication").click()
    expect(page.locator("#card-error")).to_contain_text("did not go through")
    assert not refused(), refused()
    expect(page.locator("#card-form")).to_be_visible()
    expect(page.locator("#card-pay")).to_be_enabled()
    assert localstripe.intent(intent)["status"] == "requires_payment_method"
    page.wait_for_timeout(1500)
    expect(order_status(page)).to_have_attribute("data-status", "confirmed")

    # Again, authenticated: Stripe's event pays the order, and the page reads it.
    assert localstripe.attach_card(intent, typed)["status"] == "requires_action"
    page.locator("#card-pay").click()
    page.get_by_role("button", name="Complete authentication").click()
    expect(page.locator("#card-form")).to_be_hidden()
    expect(order_status(page)).to_have_attribute("data-status", "paid", timeout=20_000)
    expect(page.locator("#order-status")).to_contain_text("Paid:")
    assert localstripe.intent(intent)["status"] == "succeeded"
    shot(page, "storefront-paid-by-card")

    # The page ran Stripe.js's confirmCardPayment, and its CSP refused nothing on the way.
    assert sum("Stripe().confirmCardPayment()" in m for m in console) == 2, console
    assert not refused(), refused()


def with_view_fields(context: BrowserContext, sale_id: int, fields) -> None:
    """Adds fields to the public view the browser reads: the ones the view is about to carry
    (price, admission, limit, the draw's proof), so the page's side is tested now."""

    def enrich(route: Route) -> None:
        real = route.fetch()
        body = real.json()
        if real.status == 200:
            body.update(fields())
        route.fulfill(response=real, json=body)

    context.route(re.compile(rf".*/activities/{sale_id}$"), enrich)


def test_a_draw_sale_queues_then_shows_each_result(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Draw sale", stock=1, starts_in=4, admission="draw", drawWindowMs=3000)
    draw_end = datetime.fromisoformat(sale["startAt"].replace("Z", "+00:00")) + timedelta(seconds=3)
    secret = "draw-secret-for-the-browser-test"
    commitment = hashlib.sha256(secret.encode()).hexdigest()

    def proof():
        fields = {"admission": "draw", "drawWindowMs": 3000, "drawCommitment": commitment}
        if datetime.now(timezone.utc) > draw_end:
            fields.update(drawSecret=secret, drawCutoff=1)
        return fields

    with_view_fields(context, sale["id"], proof)
    pages = [open_sale(context, sale["id"], unique("entrant")) for _ in range(2)]
    for page in pages:
        expect(page.locator("#buy")).to_be_enabled(timeout=15_000)
        expect(page.locator("#buy")).to_have_text("Enter the draw")
        expect(page.locator("#countdown-label")).to_have_text("Draw in")
        page.locator("#buy").click()
    for page in pages:
        expect(order_status(page)).to_have_attribute("data-status", "queued")
        expect(page.locator("#order-status")).to_contain_text("In the draw")
        expect(page.locator("#steps li").first).to_have_text("In the draw")
    expect(pages[0].locator("#phase")).to_have_text("Draw open: entries are collected")
    expect(pages[0].locator("#verify")).to_be_visible()
    expect(pages[0].locator("#draw-commitment")).to_have_text(commitment)
    pages[0].locator("#verify").evaluate("d => (d.open = true)")
    shot(pages[0], "storefront-draw-queued")

    # One unit for two entrants: one wins (pending, then confirmed), the other is not drawn.
    final = re.compile(r"^(confirmed|not_drawn)$")
    for page in pages:
        expect(order_status(page)).to_have_attribute("data-status", final, timeout=20_000)
    results = sorted(p.locator("#order").get_attribute("data-status") for p in pages)
    assert results == ["confirmed", "not_drawn"], results
    loser = next(p for p in pages if p.locator("#order").get_attribute("data-status") == "not_drawn")
    expect(loser.locator("#order-status")).to_contain_text("Not drawn")
    expect(loser.locator("#buy")).to_be_disabled()
    # After the draw the secret is out, and the page checks it against the commitment.
    expect(loser.locator("#draw-secret")).to_have_text(secret)
    expect(loser.locator("#draw-check")).to_contain_text("equals the commitment")
    loser.locator("#verify").evaluate("d => (d.open = true)")
    shot(loser, "storefront-draw-not-drawn")


def test_a_sold_out_sale_disables_the_button(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Tiny sale", stock=1, starts_in=-1)
    early = api.token(unique("early"))
    assert api.purchase(early, sale["id"]).status == 202
    page = open_sale(context, sale["id"], unique("late"))
    buy = page.locator("#buy")
    expect(page.locator("#stock")).to_have_text("none")
    expect(buy).to_be_disabled()
    expect(buy).to_have_text("Sold out")
    expect(page.locator("#buy-hint")).to_contain_text("Every unit is taken")
    expect(page.locator("#phase")).to_have_text("On sale, sold out")
    shot(page, "storefront-sold-out")


def test_cancel_a_confirmed_order(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Cancel sale", stock=2, starts_in=-1)
    page = open_sale(context, sale["id"], unique("canceller"))
    expect(page.locator("#stock")).to_have_text("2")
    # By keyboard alone: the buttons are plain buttons in the tab order.
    page.locator("#buy").focus()
    page.keyboard.press("Enter")
    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)
    # The live stock follows the sale.
    expect(page.locator("#stock")).to_have_text("1", timeout=10_000)
    page.locator("#cancel").focus()
    page.keyboard.press("Space")
    expect(order_status(page)).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#order-status")).to_contain_text("Cancelled: Order #")
    # The unit is back on sale, and so is the buyer's quota.
    expect(page.locator("#stock")).to_have_text("2", timeout=10_000)
    expect(page.locator("#buy")).to_be_enabled()
    shot(page, "storefront-cancelled")


def test_price_and_quantity_within_the_per_order_limit(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Limited sale", stock=10, starts_in=-1, perOrderLimit=3)
    with_view_fields(context, sale["id"], lambda: {"priceMinor": 1999, "currency": "EUR", "perOrderLimit": 3})
    page = open_sale(context, sale["id"], unique("bulk"))
    expect(page.locator("#price")).to_have_text("€19.99")
    qty = page.locator("#qty")
    expect(qty).to_be_visible()
    expect(page.locator("#qty-hint")).to_have_text("at most 3 per order")

    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.post_data or "") if r.method == "POST" and r.url.endswith("/orders") else None)
    qty.fill("4")
    page.locator("#buy").click()
    assert qty.evaluate("e => e.validity.rangeOverflow"), "4 is over the limit"
    page.wait_for_timeout(200)
    assert sent == [], "nothing is sent above the limit"

    qty.fill("2")
    page.locator("#buy").click()
    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)
    assert sent == ['{"quantity":2}'], sent
    expect(page.locator("#order-status")).to_contain_text("2 units")
    shot(page, "storefront-price-quantity")


# (status, code, what the buyer reads): every refusal the purchase can answer.
REFUSALS = [
    (409, "not_started", "has not started yet"),
    (409, "ended", "The sale has ended"),
    (409, "sold_out", "Sold out"),
    (409, "already_purchased", "already have an order"),
    (400, "quantity_exceeds_limit", "more than one order may take"),
    (429, "rate_limited", "wait 1 s"),
    (503, "unavailable", "nothing was bought"),
    (404, "not_found", "No such sale"),
    (409, "busy", "being updated"),
    (409, "conflict", "not possible in the order's current state"),
    (400, "bad_request", "The request was not accepted: made-up reason"),
    (0, "network", "No answer from the server"),
    (401, "unauthorized", "Please sign in"),
]


def test_every_refusal_has_its_own_message(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Refusing sale", stock=5, starts_in=-1)
    page = open_sale(context, sale["id"], unique("refused"))
    answers = list(REFUSALS)

    def refuse(route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        status, code, _ = answers[0]
        if status == 0:
            route.abort("connectionrefused")
            return
        headers = {"Retry-After": "1"} if code == "rate_limited" else {}
        route.fulfill(status=status, headers=headers, json={"error": code, "message": "made-up reason"})

    page.route("**/activities/*/orders", refuse)
    buy = page.locator("#buy")
    message = page.locator("#message")
    for status, code, text in REFUSALS:
        expect(buy).to_be_enabled(timeout=5_000)
        buy.click()
        expect(message).to_have_attribute("data-code", code)
        expect(message).to_contain_text(text)
        if code == "rate_limited":
            # Retry-After keeps the button shut, then it opens by itself.
            expect(buy).to_be_disabled()
            expect(page.locator("#buy-hint")).to_have_text("Try again in 1 s.")
        answers.pop(0)
    # A refused token signs the buyer out.
    expect(page.locator("#signed-out")).to_be_visible()
    expect(buy).to_be_disabled()
    shot(page, "storefront-unauthorized")

    # A pasted bearer token (on AWS: from Cognito) signs in as well.
    page.unroute("**/activities/*/orders")
    user = unique("pasted")
    page.locator("#paste summary").click()
    page.fill("#token", f"Bearer {api.token(user)}")
    page.get_by_role("button", name="Use this token").click()
    expect(page.locator("#who")).to_have_text(user)
    buy.click()
    expect(order_status(page)).to_have_attribute("data-status", re.compile("^(accepted|pending|confirmed)$"))


# ------------------------------------------------------------------ the buyer's own changes, at once


def stop_the_polls(page: Page) -> None:
    """Stops the page's timers where they are (the context's clock is installed), so neither
    the sale's regular poll nor the order's comes round again; requests and their answers
    still run. What the page shows from then on, it read because of what the buyer did. Then
    waits out the server's own copy of the view (at most 250 ms), so the next read is fresh."""
    now_ms = page.evaluate("Date.now()")
    page.clock.pause_at(datetime.fromtimestamp((now_ms + 50) / 1000, tz=timezone.utc))
    page.wait_for_timeout(400)


def hold_one_view_read(page: Page, sale_id: int) -> list[tuple[Route, APIResponse]]:
    """Holds the page's next read of the sale's view with the answer the server gave then, to
    be let through later: an old answer that arrives after newer ones."""
    held: list[tuple[Route, APIResponse]] = []

    def hold(route: Route) -> None:
        if held or route.request.method != "GET":
            route.continue_()
            return
        held.append((route, route.fetch()))

    page.route(re.compile(rf".*/activities/{sale_id}$"), hold)
    deadline = time.monotonic() + 5
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert held, "the page polls the sale's view"
    return held


def test_taking_the_last_unit_reads_sold_out_at_once(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Last unit sale", stock=1, starts_in=-1)
    context.clock.install()
    page = open_sale(context, sale["id"], unique("last-unit"))
    expect(page.locator("#stock")).to_have_text("1")
    expect(page.locator("#buy")).to_be_enabled()
    stop_the_polls(page)

    page.locator("#buy").click()
    # No poll comes round: the purchase itself re-read the sale and the order.
    expect(page.locator("#stock")).to_have_text("none")
    expect(page.locator("#phase")).to_have_text("On sale, sold out")
    expect(page.locator("#buy")).to_have_text("Sold out")
    expect(order_status(page)).to_have_attribute("data-status", re.compile("^(pending|confirmed)$"))
    shot(page, "storefront-last-unit-taken")


def test_an_older_view_answer_does_not_overwrite_a_newer_one(context: BrowserContext, api: Api):
    sale = api.create_sale("Late answer sale", stock=1, starts_in=-1)
    context.clock.install()
    page = open_sale(context, sale["id"], unique("late-answer"))
    expect(page.locator("#stock")).to_have_text("1")
    held = hold_one_view_read(page, sale["id"])
    stop_the_polls(page)

    page.locator("#buy").click()
    expect(page.locator("#stock")).to_have_text("none")
    expect(order_status(page)).to_have_attribute("data-status", re.compile("^(pending|confirmed)$"))
    # Every read the purchase started has answered (the page's timers start no other).
    page.wait_for_timeout(500)
    # The poll sent before the purchase answers last, with the stock of then.
    route, old = held[0]
    assert old.json()["remainingStock"] == 1
    route.fulfill(response=old)
    page.wait_for_timeout(500)
    assert page.locator("#stock").inner_text() == "none"
    assert page.locator("#buy").inner_text() == "Sold out"


def test_a_cancel_puts_the_unit_back_on_the_page_at_once(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Give back sale", stock=1, starts_in=-1)
    context.clock.install()
    page = open_sale(context, sale["id"], unique("give-back"))
    page.locator("#buy").click()
    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)
    expect(page.locator("#stock")).to_have_text("none")
    stop_the_polls(page)

    page.locator("#cancel").click()
    expect(order_status(page)).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#stock")).to_have_text("1")
    expect(page.locator("#phase")).to_have_text("On sale")
    expect(page.locator("#buy")).to_be_enabled()
    shot(page, "storefront-cancelled-at-once")


def test_a_payment_reads_paid_at_once(context: BrowserContext, api: Api):
    sale = api.create_sale("Paid at once sale", stock=2, starts_in=-1)
    context.clock.install()
    page = open_sale(context, sale["id"], unique("pays-at-once"))
    page.locator("#buy").click()
    expect(order_status(page)).to_have_attribute("data-status", "confirmed", timeout=15_000)
    stop_the_polls(page)

    page.locator("#pay").click()
    # The local provider's complete route pays the order before it answers.
    expect(order_status(page)).to_have_attribute("data-status", "paid")
    expect(page.locator("#order-status")).to_contain_text("Paid:")
