// The storefront's state: the sale this page shows (?sale=<id>), what the page knows of it and
// of the buyer, the server's clock, and where the sale stands on it. Every other module reads
// and writes this one `state`.

export const $ = (id) => document.getElementById(id);

// sessionStorage key of the buyer's token.
export const TOKEN_KEY = "seckill.token";

const params = new URLSearchParams(location.search);
export const saleId = /^[0-9]+$/.test(params.get("sale") || "") ? params.get("sale") : null;

export const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  view: null, // the public view, as last read
  viewError: null,
  offsetMs: 0, // server clock minus this browser's clock
  rttMs: null, // round trip of the sample the offset came from
  inFlight: false, // a purchase is on its way
  blockedUntil: 0, // browser ms until which Retry-After keeps the button shut
  order: null, // {status, requestId, orderId, quantity, reason}
  acting: false, // pay or cancel on its way
  card: null, // {amountMinor, currency} while the card form is open (card.js)
  waitingFor: null, // "paid" while a payment completes
  waitingSince: 0,
  viaDraw: false, // the order went through a draw's pool
  announcedPhase: null,
};

export const serverNow = () => Date.now() + state.offsetMs;

// ------------------------------------------------------------------ the sale

export const limit = () => (state.view && state.view.perOrderLimit) || 1;

// Where the sale stands on the server's clock: upcoming, draw (a draw sale's entry window),
// running or ended.
export function phase() {
  const v = state.view;
  if (!v) return null;
  const now = serverNow();
  const start = Date.parse(v.startAt);
  const end = Date.parse(v.endAt);
  if (now < start) return "upcoming";
  if (now >= end) return "ended";
  const drawEnd = drawEndMs();
  if (drawEnd && now < drawEnd) return "draw";
  return "running";
}

// When a draw sale's entry window closes, if the view tells.
export function drawEndMs() {
  const v = state.view;
  if (!v || v.admission !== "draw") return null;
  if (v.drawEndAt) return Date.parse(v.drawEndAt);
  if (v.drawWindowMs) return Date.parse(v.startAt) + v.drawWindowMs;
  return null;
}

export const soldOut = () => state.view && state.view.remainingStock <= 0 && phase() !== "draw";

// An order that holds the buyer's place: no second purchase while it stands (a draw's
// loser is refused too: one entry per buyer).
export const holding = () =>
  state.order &&
  ["accepted", "queued", "pending", "confirmed", "paid", "not_drawn", "entered_late"].includes(state.order.status);
