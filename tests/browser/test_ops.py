"""The operator page (web/ops.html) in Chromium: live charts of a running sale with an admin
token, and the sale's row with its stats and reconcile state."""

from __future__ import annotations

import re

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


def _at_least(n: int) -> re.Pattern:
    """data-points of n or more (n < 10), as a pattern over its digits."""
    return re.compile(rf"^(?:[{n}-9]|[1-9]\d+)$")


def _contains(text: str) -> re.Pattern:
    return re.compile(re.escape(text))
