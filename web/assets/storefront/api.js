// Requests to the API (this page's own origin) and what the page says about their answers: the
// message line, and a sentence for each refusal code.

import { $, limit, state } from "./state.js";

// What each refusal code means to a buyer. The API answers {"error": code, "message": text}.
const REFUSALS = {
  not_started: () => "The sale has not started yet. The button opens at the start.",
  ended: () => "The sale has ended.",
  sold_out: () => "Sold out: every unit is taken.",
  already_purchased: () =>
    "You already have an order or a draw entry for this sale (one per buyer).",
  quantity_exceeds_limit: () =>
    `That is more than one order may take (at most ${limit()} per order).`,
  rate_limited: (r) =>
    `Too many attempts. Please wait ${Math.ceil(r.retryAfterMs / 1000) || 1} s and try again.`,
  unavailable: () =>
    "The shop could not take this just now, and nothing was bought. Please try again.",
  unauthorized: () => "Please sign in: the token is missing, expired or not valid here.",
  forbidden: () => "This account may not do that.",
  not_found: () => "No such sale or order.",
  busy: () => "The sale is being updated. Try again in a moment.",
  conflict: (r) => `That is not possible in the order's current state (${r.message}).`,
  bad_request: (r) => `The request was not accepted: ${r.message}`,
  network: () => "No answer from the server. Check the connection and try again.",
};

// One API call. Resolves to {ok, status, data} or {ok: false, status, error, message,
// retryAfterMs}; never throws.
export async function api(method, path, body, init = {}) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      ...init,
    });
  } catch (e) {
    return { ok: false, status: 0, error: "network", message: String(e), retryAfterMs: 0 };
  }
  let data = null;
  try {
    data = await res.json();
  } catch (e) {
    data = null;
  }
  if (res.ok) return { ok: true, status: res.status, data };
  const retryAfter = Number(res.headers.get("Retry-After"));
  return {
    ok: false,
    status: res.status,
    error: (data && data.error) || `http_${res.status}`,
    message: (data && data.message) || res.statusText,
    retryAfterMs: Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter * 1000 : 0,
  };
}

// Reads of one thing (the sale's view, the buyer's order) may overlap: a poll still on its way
// when the buyer's action reads again. Only the newest read's answer counts, so an older answer
// that arrives late neither overwrites a newer one nor carries a second round of polls on.
// `begin()` marks a read as sent and returns the check for its answer; `forget()` drops every
// answer still on its way.
export function newestOnly() {
  let newest = 0;
  return {
    begin() {
      const read = ++newest;
      return () => read === newest;
    },
    forget() {
      newest++;
    },
  };
}

export function refusalText(r) {
  const say = REFUSALS[r.error];
  return say ? say(r) : `Something went wrong (${r.status}): ${r.message}`;
}

// The message line; unchanged text is left alone so a screen reader does not repeat it.
export function say(text, kind = "info") {
  const m = $("message");
  if (m.textContent === text && m.dataset.kind === kind) return;
  m.textContent = text;
  m.dataset.kind = kind;
  m.dataset.code = "";
}

export function sayRefusal(r) {
  const m = $("message");
  m.textContent = refusalText(r);
  m.dataset.kind = "refusal";
  m.dataset.code = r.error;
}
