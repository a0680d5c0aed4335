// The buyer: their token, and their order from Buy to its end (the 202, orders/me polled with
// backoff until it settles, pay and cancel). Each of the buyer's actions, and each new status
// of her order, reads the sale and the order again at once instead of waiting for a poll.

import { api, newestOnly, say, sayRefusal } from "./api.js";
import { closeCard, payByCard } from "./card.js";
import { render } from "./render.js";
import { $, saleId, state, TOKEN_KEY } from "./state.js";
import { refreshView } from "./view.js";

// orders/me backoff: 300 ms, then x1.6 per poll, at most 3 s.
const POLL_FIRST_MS = 300;
const POLL_FACTOR = 1.6;
const POLL_MAX_MS = 3000;
// How long a payment may take to come back from the provider before the page stops asking.
const PAY_WAIT_MS = 60000;

// ------------------------------------------------------------------ buying

export async function buy(event) {
  event.preventDefault();
  if ($("buy").disabled) return;
  // Grey at once, before the request leaves, and until its answer is in.
  state.inFlight = true;
  say("");
  render();
  const quantity = Number($("qty").value) || 1;
  const r = await api("POST", `/activities/${saleId}/orders`, { quantity });
  state.inFlight = false;
  if (r.ok) {
    const status = r.data.status === "queued" ? "queued" : "accepted";
    // The order section says what happened; the message line is for refusals.
    orderChangedHere({ status, requestId: r.data.requestId, quantity });
  } else {
    purchaseRefused(r);
  }
  render();
}

function purchaseRefused(r) {
  sayRefusal(r);
  if (r.retryAfterMs) state.blockedUntil = Date.now() + r.retryAfterMs;
  if (r.error === "unauthorized") signOut(false);
  // The buyer's existing order, so they see what they already hold.
  if (r.error === "already_purchased") readOrderOnce();
  // The page's stock was older than the server's.
  if (r.error === "sold_out") refreshView();
}

// An answer to the buyer's own action (a 202, a cancel) changed her order: show it, and read the
// sale (its stock moved with the order) and the order again at once. The order's read is sent
// after the change, so a read still on its way from before it is dropped.
function orderChangedHere(order) {
  applyOrder(order);
  refreshView();
  readOrderOnce();
}

// ------------------------------------------------------------------ following the order

let pollTimer = null;
let pollDelay = POLL_FIRST_MS;
const orderReads = newestOnly();

// Statuses after which nothing changes by itself (a confirmed order waits for the buyer).
function settled(status) {
  if (status === "confirmed") return state.waitingFor !== "paid";
  return ["paid", "cancelled", "failed", "not_drawn", "entered_late", "none"].includes(status);
}

// Reads GET …/orders/me now (at the start, at sign-in, after each of the buyer's actions), then
// polls it with backoff until the status settles; honours Retry-After. The read started here
// supersedes any still on its way and the poll scheduled next: one round of polls at a time.
export function readOrderOnce() {
  if (!state.token || !saleId) return;
  clearTimeout(pollTimer);
  pollDelay = POLL_FIRST_MS;
  pollOnce();
}

async function pollOnce() {
  const isNewest = orderReads.begin();
  const r = await api("GET", `/activities/${saleId}/orders/me`, undefined, { cache: "no-store" });
  // A newer read is on its way: its answer is shown, and it carries the polling on.
  if (!isNewest()) return;
  let wait = pollDelay;
  pollDelay = Math.min(POLL_MAX_MS, pollDelay * POLL_FACTOR);
  if (r.ok) {
    orderRead(r.data, wait);
    return;
  }
  if (r.error === "unauthorized") {
    sayRefusal(r);
    signOut(false);
    return;
  }
  if (r.status === 429 || r.status === 503) wait = Math.max(wait, r.retryAfterMs);
  pollTimer = setTimeout(pollOnce, wait);
}

// What orders/me said of the order. A status the page did not show yet (confirmed, paid,
// cancelled, failed, ...) may come with the sale's stock moved, so the view is read again too.
function orderRead(fresh, wait) {
  // Right after a 202 the order may not be visible yet (a container's `none` may be up to a
  // second old): keep what the 202 said.
  if (fresh.status === "none" && state.order && ["accepted", "queued"].includes(state.order.status)) {
    pollTimer = setTimeout(pollOnce, wait);
    return;
  }
  const before = state.order && state.order.status;
  applyOrder(fresh);
  if (before && before !== fresh.status) refreshView();
  if (paymentOverdue()) return;
  if (!settled(fresh.status)) pollTimer = setTimeout(pollOnce, pollDelay);
}

// Whether the page stopped waiting for a payment that has not come back in time (and said so).
function paymentOverdue() {
  if (state.waitingFor !== "paid" || Date.now() - state.waitingSince <= PAY_WAIT_MS) return false;
  state.waitingFor = null;
  say("The payment has not come back yet. Reload the page later to see it.", "warn");
  render();
  return true;
}

function applyOrder(o) {
  // Only a confirmed order is paid for: an order cancelled (or paid) meanwhile closes the card.
  if (o.status !== "confirmed") closeCard(false);
  if (o.status === "paid" && state.waitingFor === "paid") {
    state.waitingFor = null;
    say("Payment received.");
  }
  if (o.status === "queued") state.viaDraw = true;
  state.order = o.status === "none" ? null : o;
  render();
}

// ------------------------------------------------------------------ pay and cancel

// Pay: the server starts a payment at its provider; with the local provider the page
// completes it at `completeUrl`, with Stripe the buyer's card confirms it through Stripe.js
// (card.js). The order becomes paid only when the provider's event reaches the server, so
// the page then waits for orders/me to say so.
export async function pay() {
  const id = state.order && state.order.orderId;
  if (!id || state.acting) return;
  state.acting = true;
  say("Starting the payment…");
  render();
  const r = await api("POST", `/orders/${id}/pay`);
  if (!r.ok) {
    state.acting = false;
    sayRefusal(r);
    render();
    return;
  }
  const p = r.data || {};
  if (p.completeUrl && sameOrigin(p.completeUrl)) {
    const done = await api("POST", p.completeUrl);
    if (!done.ok) {
      state.acting = false;
      sayRefusal(done);
      render();
      return;
    }
    say("Payment sent; waiting for the provider's confirmation…");
  } else if (p.clientSecret && p.status !== "succeeded") {
    // The buyer may still cancel while typing the card.
    state.acting = false;
    render();
    if (!(await payByCard(p))) return;
    say("Payment sent; waiting for Stripe's confirmation…");
  } else if (p.provider && p.provider !== "local" && p.status !== "succeeded") {
    say(`Complete the payment with ${p.provider}; this page shows the result once it arrives.`);
  } else {
    say("Waiting for the payment's confirmation…");
  }
  state.acting = false;
  state.waitingFor = "paid";
  state.waitingSince = Date.now();
  readOrderOnce();
  render();
}

const sameOrigin = (url) => {
  try {
    return new URL(url, location.href).origin === location.origin;
  } catch (e) {
    return false;
  }
};

export async function cancel() {
  const id = state.order && state.order.orderId;
  if (!id || state.acting) return;
  state.acting = true;
  say("Cancelling…");
  render();
  const r = await api("POST", `/orders/${id}/cancel`);
  state.acting = false;
  if (r.ok) {
    say("");
    state.waitingFor = null;
    if (state.order) orderChangedHere({ ...state.order, status: r.data.status });
  } else {
    sayRefusal(r);
  }
  render();
}

// ------------------------------------------------------------------ the token

export function useToken(token) {
  state.token = token.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  say("");
  state.order = null;
  readOrderOnce();
  render();
}

export function signOut(clearMessage = true) {
  closeCard(false);
  state.token = null;
  state.order = null;
  state.waitingFor = null;
  clearTimeout(pollTimer);
  orderReads.forget();
  sessionStorage.removeItem(TOKEN_KEY);
  if (clearMessage) say("");
  render();
}
