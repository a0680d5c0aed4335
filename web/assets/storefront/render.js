// Drawing the page from `state`: the sale's facts and countdown, the Buy button and why it is
// shut, the buyer's order step by step (and its card form), the draw's commitment checked
// here, and the account.

import { refusalText, say } from "./api.js";
import { $, drawEndMs, holding, limit, phase, saleId, serverNow, soldOut, state } from "./state.js";

// Why an order failed (orders/me `reason`), for a buyer.
const FAILURES = {
  sold_out: "the last units went to others first",
  already_purchased: "you already hold an order for this sale",
  reservation_expired: "the reservation ran out before it was written",
  send_failed: "the order could not be passed on",
  unavailable: "the shop was unavailable",
};

// ------------------------------------------------------------------ formatting

function formatPrice(minor, currency) {
  try {
    const fmt = new Intl.NumberFormat(undefined, { style: "currency", currency });
    const digits = fmt.resolvedOptions().maximumFractionDigits;
    return fmt.format(minor / 10 ** digits);
  } catch (e) {
    return `${minor} (minor units of ${currency})`;
  }
}

// 75 s -> "1:15", 3725 s -> "1:02:05"; counts whole seconds up, so 0:00 means "now".
function formatSpan(ms) {
  const total = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h > 0 ? `${h}:${two(m)}:${two(s)}` : `${m}:${two(s)}`;
}

const formatTime = (ms) =>
  new Date(ms).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });

// The token's claims, read (not verified: the server does that) to show who is signed in.
function claims(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part.padEnd(part.length + ((4 - (part.length % 4)) % 4), "=")));
  } catch (e) {
    return null;
  }
}

// ------------------------------------------------------------------ drawing the page

const PHASE_LABELS = {
  upcoming: "Not started",
  draw: "Draw open: entries are collected",
  running: "On sale",
  ended: "Ended",
};

export function render() {
  renderAccount();
  if (!saleId) return;
  const v = state.view;
  const p = phase();
  document.body.dataset.phase = p || "";
  if (!v) {
    if (state.viewError) {
      $("title").textContent =
        state.viewError.error === "not_found" ? `No sale ${saleId}` : "The sale cannot be shown right now";
      say(refusalText(state.viewError), "refusal");
    }
    $("buy").disabled = true;
    return;
  }
  $("title").textContent = v.title;
  document.title = `${v.title} · seckill`;

  const price = $("price");
  price.hidden = v.priceMinor == null || !v.currency;
  if (!price.hidden) price.textContent = formatPrice(v.priceMinor, v.currency);

  $("phase").textContent = PHASE_LABELS[p] + (soldOut() && p !== "ended" ? ", sold out" : "");
  $("stock").textContent = v.remainingStock > 0 ? String(v.remainingStock) : "none";
  renderCountdown(p);
  if (p !== state.announcedPhase) {
    // Read out the moment the sale opens, its draw closes or it ends, not every tick of
    // the countdown.
    const was = state.announcedPhase;
    if (was === "upcoming" && p === "running") say("The sale is open.");
    if (was === "upcoming" && p === "draw") say("The draw is open: enter now.");
    if (was === "draw" && p === "running") say("The draw's entry window has closed.");
    if (was && p === "ended") say("The sale has ended.");
    state.announcedPhase = p;
  }

  const qtyRow = $("qty-row");
  qtyRow.hidden = !(v.perOrderLimit > 1);
  $("qty").max = String(limit());
  $("qty-hint").textContent = `at most ${limit()} per order`;

  renderBuy(p);
  renderOrder();
  renderDraw();
}

// Signed in with a token that has not expired (by its own exp; the server checks it too).
function signedInNow() {
  const who = state.token && claims(state.token);
  return !!state.token && !(who && who.exp && who.exp * 1000 < Date.now());
}

export function renderAccount() {
  const who = state.token && claims(state.token);
  const signedIn = signedInNow();
  $("whoami").hidden = !signedIn;
  $("signed-out").hidden = signedIn;
  $("who").textContent = (who && who.sub) || "a pasted token";
  $("sign-in-button").textContent = `Sign in as ${$("user").value.trim() || "…"}`;
  $("clock").textContent =
    state.rttMs == null
      ? "Server clock: not measured yet"
      : `Server clock: ${formatTime(serverNow())} (offset ${Math.round(state.offsetMs)} ms, round trip ${state.rttMs} ms)`;
}

function renderCountdown(p) {
  const v = state.view;
  const now = serverNow();
  const label = $("countdown-label");
  const out = $("countdown");
  if (p === "upcoming") {
    label.textContent = "Starts in";
    out.textContent = formatSpan(Date.parse(v.startAt) - now);
  } else if (p === "draw") {
    label.textContent = "Draw in";
    out.textContent = formatSpan(drawEndMs() - now);
  } else if (p === "running") {
    label.textContent = "Ends in";
    out.textContent = formatSpan(Date.parse(v.endAt) - now);
  } else {
    label.textContent = "Ended";
    out.textContent = formatTime(Date.parse(v.endAt));
  }
  out.dataset.remainingMs = String(Math.round(Date.parse(v.startAt) - now));
  $("window").textContent =
    `Opens ${formatTime(Date.parse(v.startAt))}, closes ${formatTime(Date.parse(v.endAt))}` +
    (v.admission === "draw" ? " · entries in the opening window are drawn at random" : "") +
    " (server clock)";
}

function renderBuy(p) {
  const button = $("buy");
  const signedIn = signedInNow();
  const blocked = Date.now() < state.blockedUntil;
  let why = "";
  if (!signedIn) why = "Sign in to buy.";
  else if (p === "upcoming") why = "Opens at the start.";
  else if (p === "ended") why = "The sale has ended.";
  else if (soldOut()) why = "Every unit is taken; a cancelled order puts its units back.";
  else if (state.inFlight) why = "Sending your order…";
  else if (blocked) why = `Try again in ${Math.ceil((state.blockedUntil - Date.now()) / 1000)} s.`;
  else if (holding()) {
    why = {
      queued: "Your entry is in the draw.",
      not_drawn: "One draw entry per buyer.",
      entered_late: "One draw entry per buyer.",
    }[state.order.status] || "You hold an order for this sale.";
  }
  button.disabled = why !== "";
  $("qty").disabled = button.disabled;
  button.setAttribute("aria-busy", state.inFlight ? "true" : "false");
  button.textContent = state.inFlight ? "Sending…" : soldOut() ? "Sold out" : p === "draw" ? "Enter the draw" : "Buy";
  $("buy-hint").textContent = why;
}

// The steps of an order, and what its status means.
function renderOrder() {
  const o = state.order;
  const section = $("order");
  section.hidden = !o;
  if (!o) {
    section.dataset.status = "";
    return;
  }
  section.dataset.status = o.status;
  const order = ["accepted", "pending", "confirmed", "paid"];
  const first = $("steps").firstElementChild;
  if (o.status === "queued") state.viaDraw = true;
  first.textContent = state.viaDraw || state.view.admission === "draw" ? "In the draw" : "Accepted";
  const reached = { accepted: 0, queued: 0, pending: 1, confirmed: 2, paid: 3 }[o.status];
  for (const li of $("steps").children) {
    const i = order.indexOf(li.dataset.step);
    li.className = reached == null ? "off" : i < reached ? "done" : i === reached ? "now" : "";
    if (i === reached) li.setAttribute("aria-current", "step");
    else li.removeAttribute("aria-current");
  }
  const n = o.orderId ? `Order #${o.orderId}` : "Your order";
  const units = o.quantity > 1 ? `${o.quantity} units` : "1 unit";
  const drawEnd = drawEndMs();
  const text = {
    accepted: `Accepted: ${units} reserved for you. Writing the order…`,
    queued:
      "In the draw: your entry is in the pool. The draw runs when the entry window closes" +
      (drawEnd ? ` (${formatTime(drawEnd)})` : "") + "; the result appears here.",
    pending: `Reserved: ${units}. The order is being written…`,
    confirmed: `Confirmed: ${n}, ${units}. Pay to complete it, or cancel to give it back.`,
    paid: `Paid: ${n} is yours.`,
    cancelled: `Cancelled: ${n}. The stock went back on sale.`,
    failed: `Not completed: ${FAILURES[o.reason] || o.reason || "refused"}. Nothing was charged.`,
    not_drawn: "Not drawn: the draw passed over your entry this time. Nothing was charged.",
    entered_late: "Too late for the draw: your entry reached us again only after the draw began, so it could not be drawn. Nothing was charged.",
  }[o.status] || `Status: ${o.status}`;
  $("order-status").textContent = state.waitingFor === "paid" && o.status === "confirmed"
    ? `${n}: waiting for the payment's confirmation…`
    : text;
  const canAct = o.status === "confirmed" && !state.acting && state.waitingFor !== "paid";
  $("pay").hidden = o.status !== "confirmed" || !!state.card;
  $("cancel").hidden = o.status !== "confirmed";
  $("pay").disabled = !canAct;
  $("cancel").disabled = !canAct;
  renderCard();
}

// The card form (card.js) while a Stripe payment waits for the buyer's card.
function renderCard() {
  const c = state.card;
  $("card-form").hidden = !c;
  if (!c) return;
  const button = $("card-pay");
  button.disabled = state.acting;
  button.setAttribute("aria-busy", state.acting ? "true" : "false");
  button.textContent = state.acting ? "Paying…" : `Pay ${formatPrice(c.amountMinor, c.currency.toUpperCase())}`;
}

function renderDraw() {
  const v = state.view;
  const box = $("verify");
  box.hidden = !v.drawCommitment;
  if (box.hidden) return;
  $("draw-commitment").textContent = v.drawCommitment;
  if (v.drawSecret) $("draw-secret").textContent = v.drawSecret;
  if (v.drawCutoff != null) $("draw-cutoff").textContent = String(v.drawCutoff);
  if (v.drawSecret && box.dataset.checked !== v.drawSecret) {
    box.dataset.checked = v.drawSecret;
    checkCommitment(v.drawSecret, v.drawCommitment);
  }
}

// Hashes the revealed secret (as text, and as hex bytes) with SHA-256 and compares it with
// the commitment; says so either way.
async function checkCommitment(secret, commitment) {
  const out = $("draw-check");
  if (!(window.crypto && crypto.subtle)) return;
  const hex = (buf) => [...new Uint8Array(buf)].map((b) => b.toString(16).padStart(2, "0")).join("");
  const inputs = [new TextEncoder().encode(secret)];
  if (/^([0-9a-f]{2})+$/i.test(secret)) {
    inputs.push(new Uint8Array(secret.match(/../g).map((h) => parseInt(h, 16))));
  }
  const want = commitment.toLowerCase().replace(/^sha256:/, "");
  for (const bytes of inputs) {
    if (hex(await crypto.subtle.digest("SHA-256", bytes)) === want) {
      out.textContent = "Checked here: SHA-256 of the revealed secret equals the commitment.";
      return;
    }
  }
  out.textContent =
    "This page could not match the secret to the commitment with plain SHA-256; check it with the scheme the shop documents.";
}
