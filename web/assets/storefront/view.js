// What the page reads from the server on its own: the server's clock (GET /health) and the
// sale's public view (GET /activities/{id}), polled, with a render at each edge of the sale.

import { api } from "./api.js";
import { render } from "./render.js";
import { drawEndMs, saleId, serverNow, state } from "./state.js";

const VIEW_EVERY_MS = 1500;
const CLOCK_SAMPLES = 5;
export const CLOCK_RESYNC_MS = 60000;

// The offset of the server's clock from this browser's, from GET /health's serverTime:
// of a few samples, the one with the shortest round trip, taken at its midpoint.
export async function syncClock() {
  let best = null;
  for (let i = 0; i < CLOCK_SAMPLES; i++) {
    const t0 = Date.now();
    let body;
    try {
      const res = await fetch("/health", { cache: "no-store" });
      body = await res.json();
    } catch (e) {
      continue;
    }
    const t1 = Date.now();
    const server = Date.parse(body && body.serverTime);
    if (!Number.isFinite(server)) continue;
    const rtt = t1 - t0;
    if (!best || rtt < best.rtt) best = { rtt, offset: server - (t0 + t1) / 2 };
  }
  if (best) {
    state.offsetMs = best.offset;
    state.rttMs = best.rtt;
  }
  render();
}

export async function loadView() {
  // no-cache: at this polling period the browser's copy (max-age=1) has always lapsed, and
  // its stale-while-revalidate would show the copy one poll older.
  const r = await api("GET", `/activities/${saleId}`, undefined, { cache: "no-cache" });
  if (r.ok) {
    state.view = r.data;
    state.viewError = null;
  } else {
    state.viewError = r;
  }
  render();
  scheduleEdges();
  setTimeout(loadView, r.ok || r.status === 503 ? VIEW_EVERY_MS : VIEW_EVERY_MS * 3);
}

// A render exactly at the start, the draw's end and the end, so the button opens on time
// (the regular tick is 250 ms).
let edgeTimers = [];
function scheduleEdges() {
  edgeTimers.forEach(clearTimeout);
  edgeTimers = [];
  const v = state.view;
  if (!v) return;
  for (const at of [Date.parse(v.startAt), drawEndMs(), Date.parse(v.endAt)]) {
    const wait = at - serverNow();
    if (at && wait > 0 && wait < VIEW_EVERY_MS * 2) edgeTimers.push(setTimeout(render, wait + 1));
  }
}
