"""The operator page (web/ops.html) in Chromium: live charts of a running sale with an admin
token, the sale's row with its stats and reconcile state, and the refunds and disputes that
need a human."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
from conftest import Api, sign_in, unique
from playwright.sync_api import BrowserContext, expect

# Pixels of a canvas that something was drawn on (the axes and grid alone draw some).
INKED = """(id) => {
  const c = document.getElementById(id);
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
  return n;
}"""

# Pixels of one colour (within antialiasing's rounding): a series' line, not the grid.
COLOURED = """([id, rgb]) => {
  const c = document.getElementById(id);
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  const near = (a, b) => Math.abs(a - b) <= 12;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i + 3] > 64 && near(d[i], rgb[0]) && near(d[i + 1], rgb[1]) && near(d[i + 2], rgb[2])) n++;
  return n;
}"""
BLUE = [0x00, 0x72, 0xB2]  # the first series of every chart


def test_the_operator_page_charts_a_running_sale(context: BrowserContext, api: Api, shot):
    sale = api.create_sale("Ops sale", stock=50, starts_in=-1)
    sale_id = sale["id"]
    page = context.new_page()
    page.goto(f"/ops.html?sale={sale_id}")
    sign_in(page, "ops")
    expect(page.locator("#selected-name")).to_have_text(f"{sale_id}: Ops sale")

    # Buyers arrive while the page watches: the charts move.
    for i in range(6):
        assert api.purchase(api.token(unique(f"crowd{i}")), sale_id).status == 202
        page.wait_for_timeout(400)
    expect(page.locator("#chart-stock")).to_have_attribute("data-points", _at_least(4), timeout=15_000)
    expect(page.locator("#chart-rate")).to_have_attribute("data-points", _at_least(3))
    expect(page.locator("#chart-queue")).to_have_attribute("data-points", _at_least(3))

    row = page.locator(f'#sales-body tr[data-id="{sale_id}"]')
    expect(row).to_have_attribute("aria-selected", "true")
    # Six units sold of fifty, conserved (drift 0), and reconcile has looked at the sale.
    expect(row.locator("td").nth(3)).to_have_text("44", timeout=10_000)
    expect(row.locator("td").nth(6)).to_have_text("6", timeout=10_000)
    expect(row.locator("td").nth(8)).to_have_text("0")
    expect(row.locator("td").nth(9)).to_contain_text("drift 0", timeout=10_000)
    expect(page.locator("#c-accepted")).not_to_have_text("0")
    expect(page.locator("#legend-stock")).to_contain_text("redis stock 44")
    expect(page.locator("#chart-stock")).to_have_attribute("aria-label", _contains("redis stock 44"))
    shot(page, "ops")

    for canvas in ("chart-stock", "chart-rate", "chart-queue"):
        assert page.evaluate(INKED, canvas) > 1_000, f"{canvas} has its grid, labels and lines drawn"
    assert page.evaluate(COLOURED, ["chart-stock", BLUE]) > 100, "the redis stock line is drawn"
    assert page.evaluate(COLOURED, ["chart-rate", BLUE]) > 20, "the accepted/s line is drawn"


def test_the_operator_page_lists_the_refunds_and_disputes_that_need_a_human(
    context: BrowserContext, api: Api, shot
):
    # The payments' refund states are set by the owner, as reconcile and the webhook would
    # (no API moves them): scripts/browser-tests.sh exports the dev server's DATABASE_URL.
    database = os.environ.get("DATABASE_URL")
    if not database:
        pytest.skip("DATABASE_URL of the dev server's database (scripts/browser-tests.sh sets it)")
    page = context.new_page()
    page.goto("/ops.html")
    sign_in(page, "ops")
    # This suite's first payments are made below: nothing needs a human yet.
    expect(page.locator("#payments-empty")).to_be_visible()
    expect(page.locator("#payments-table")).to_be_hidden()
    expect(page.locator("#p-failed")).to_have_text("0")

    sale = api.create_sale("Refund sale", stock=5, starts_in=-1)
    failed, disputed, owed, owed_now = (_paid_order(api, sale["id"], unique(n)) for n in ("f", "d", "o", "n"))
    _psql(
        database,
        # Refused five times; the provider's answer is shown as text, never as markup.
        f"""update payments set status = 'succeeded', refund_state = 'failed', refund_attempts = 5,
                   refund_error = 'card_declined: <b id="injected">no</b>',
                   updated_at = now() - interval '10 minutes' where order_id = {failed};
            update payments set status = 'succeeded', disputed_at = now() - interval '20 minutes',
                   updated_at = now() - interval '20 minutes' where order_id = {disputed};"""
        # Owed back for an hour and for a moment, at a provider the dev server's reconcile
        # (the local one, every 2 s) does not refund through: both stay owed.
        f"""update payments set status = 'succeeded', provider = 'elsewhere', refund_state = 'due',
                   updated_at = now() - interval '1 hour' where order_id = {owed};
            update payments set status = 'succeeded', provider = 'elsewhere', refund_state = 'due',
                   updated_at = now() where order_id = {owed_now};""",
    )

    rows = page.locator("#payments-body tr")
    expect(rows).to_have_count(3)
    expect(page.locator("#payments-empty")).to_be_hidden()
    assert [rows.nth(i).get_attribute("data-order") for i in range(3)] == [str(failed), str(disputed), str(owed)]
    first = rows.nth(0).locator("td")
    expect(first.nth(1)).to_have_text(str(sale["id"]))
    expect(first.nth(2)).to_have_text(f"pi_local_{failed}")
    expect(first.nth(3)).to_contain_text("19.99")
    expect(first.nth(4)).to_have_text("failed")
    expect(first.nth(5)).to_have_text("5")
    expect(first.nth(6)).to_have_text('card_declined: <b id="injected">no</b>')
    expect(page.locator("#injected")).to_have_count(0)
    expect(rows.nth(1).locator("td").nth(8)).to_have_text("20 min ago")
    expect(rows.nth(2).locator("td").nth(4)).to_have_text("due")
    expect(rows.nth(2).locator("td").nth(9)).to_have_text("60 min ago")
    expect(page.locator("#p-failed")).to_have_text("1")
    expect(page.locator("#p-disputed")).to_have_text("1")
    expect(page.locator("#p-due")).to_have_text("2")
    expect(page.locator("#p-oldest")).to_have_text("60 min ago")
    expect(page.locator("#payments-note")).to_contain_text("owed for more than 5 min")
    shot(page, "ops-payments")


def _paid_order(api: Api, sale_id: int, user: str) -> int:
    """A confirmed order of `user` with its payment started (the local provider's): its id."""
    token = api.token(user)
    assert api.purchase(token, sale_id).status == 202
    deadline = time.monotonic() + 15
    while (order := api.my_order(token, sale_id))["status"] != "confirmed":
        assert time.monotonic() < deadline, order
        time.sleep(0.2)
    started = api.call("POST", f"/orders/{order['orderId']}/pay", token=token)
    assert started.status == 200, started
    return order["orderId"]


def _psql(database: str, sql: str) -> None:
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", database, "-c", sql], check=True)


def _at_least(n: int) -> re.Pattern:
    """data-points of n or more (n < 10), as a pattern over its digits."""
    return re.compile(rf"^(?:[{n}-9]|[1-9]\d+)$")


def _contains(text: str) -> re.Pattern:
    return re.compile(re.escape(text))
