// The storefront of one sale (?sale=<id>): the public view polled every 1.5 s, a countdown
// on the server's clock, the Buy button, and the buyer's order followed to its end.
// Plain browser JavaScript, no build step; every request goes to this page's own origin, but
// Stripe.js's when the shop takes payments with Stripe.
//
// This module starts the page: it signs the buyer in and wires the controls. The rest is in
// storefront/: state.js (what the page knows, and where the sale stands), api.js (requests and
// the messages about their answers), view.js (the server's clock and the public view, polled),
// render.js (drawing the page), buyer.js (the buyer's token and order) and card.js (paying by
// card with Stripe.js).

import { api, say, sayRefusal } from "./storefront/api.js";
import { buy, cancel, pay, readOrderOnce, signOut, useToken } from "./storefront/buyer.js";
import { confirmCard } from "./storefront/card.js";
import { render, renderAccount } from "./storefront/render.js";
import { $, saleId } from "./storefront/state.js";
import { CLOCK_RESYNC_MS, loadView, syncClock } from "./storefront/view.js";

// ------------------------------------------------------------------ signing in

async function signIn(event) {
  event.preventDefault();
  const user = $("user").value.trim();
  if (!$("user").checkValidity()) {
    say("A name is letters, digits, '.', '_', '-' or '@' (at most 64).", "refusal");
    return;
  }
  const r = await api("POST", "/dev/token", { user, admin: false });
  if (r.ok) {
    useToken(r.data.token);
  } else if (r.status === 404) {
    $("paste").open = true;
    say("This server does not sign names in (only the local dev server does): paste a token.", "warn");
  } else {
    sayRefusal(r);
  }
}

// ------------------------------------------------------------------ start

function wire() {
  $("sign-in").addEventListener("submit", signIn);
  $("user").addEventListener("input", renderAccount);
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = $("token").value.trim();
    if (t) useToken(t.replace(/^Bearer\s+/i, ""));
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("buy-form").addEventListener("submit", buy);
  $("pay").addEventListener("click", pay);
  $("card-form").addEventListener("submit", confirmCard);
  $("cancel").addEventListener("click", cancel);
}

function start() {
  wire();
  if (!saleId) {
    $("pick-sale").hidden = false;
    renderAccount();
    return;
  }
  $("sale").hidden = false;
  syncClock();
  setInterval(syncClock, CLOCK_RESYNC_MS);
  loadView();
  readOrderOnce();
  // The countdown and the button follow the server clock between view reads.
  setInterval(render, 250);
  render();
}

start();
