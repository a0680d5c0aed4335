// What the page reads from the server on its own: the server's clock (GET /health) and the
// sale's public view (GET /activities/{id}), polled, read again at once when the buyer's own
// action may have moved it, with a render at each edge of the sale.

import { api, newestOnly } from "./api.js";
import { render } from "./render.js";
import { drawEndMs, saleId, serverNow, state } from "./state.js";

const VIEW_EVERY_MS = 1500;
// The server keeps a view for up to 250 ms (per container), so a read right after the buyer's
// own change may be answered from before it: after such a read the next comes once that copy
// has lapsed, not a whole poll later.
const VIEW_AGAIN_MS = 300;
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

let viewTimer = null;
const viewReads = newestOnly();

// The regular poll of the public view.
export function loadView() {
  readView(VIEW_EVERY_MS);
}

// A read at once, when the buyer's purchase, payment or cancel, or her order's new status, may
// have moved the sale's stock: the page shows it now rather than at the next poll.
export function refreshView() {
  readView(VIEW_AGAIN_MS);
}

// Reads the view now and schedules the next read from the answer. There is one timer, taken
// over by each read, so a refresh moves the poll instead of starting a second one.
async function readView(nextInMs) {
  clearTimeout(viewTimer);
  const isNewest = viewReads.begin();
  // no-cache: the browser's copy (max-age=1) may be older than the buyer's own change, and
  // its stale-while-revalidate would show the copy one poll older.
  const r = await api("GET", `/activities/${saleId}`, undefined, { cache: "no-cache" });
  // A newer read is on its way: its answer is shown, and it schedules the next.
  if (!isNewest()) return;
  showView(r);
  viewTimer = setTimeout(loadView, r.ok || r.status === 503 ? nextInMs : VIEW_EVERY_MS * 3);
}

function showView(r) {
  if (r.ok) {
    state.view = r.data;
    state.viewError = null;
  } else {
    state.viewError = r;
  }
  render();
  scheduleEdges();
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
