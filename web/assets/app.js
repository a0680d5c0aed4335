// The storefront of one sale (?sale=<id>): the public view polled every 1.5 s, a countdown
// on the server's clock, the Buy button, and the buyer's order followed to its end.
// Plain browser JavaScript, no build step; every request goes to this page's own origin.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  const TOKEN_KEY = "seckill.token";
  const VIEW_EVERY_MS = 1500;
  const CLOCK_SAMPLES = 5;
  const CLOCK_RESYNC_MS = 60000;
  // orders/me backoff: 300 ms, then x1.6 per poll, at most 3 s.
  const POLL_FIRST_MS = 300;
  const POLL_FACTOR = 1.6;
  const POLL_MAX_MS = 3000;
  // How long a payment may take to come back from the provider before the page stops asking.
  const PAY_WAIT_MS = 60000;

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

  // Why an order failed (orders/me `reason`), for a buyer.
  const FAILURES = {
    sold_out: "the last units went to others first",
    already_purchased: "you already hold an order for this sale",
    reservation_expired: "the reservation ran out before it was written",
    send_failed: "the order could not be passed on",
    unavailable: "the shop was unavailable",
  };

  const params = new URLSearchParams(location.search);
  const saleId = /^[0-9]+$/.test(params.get("sale") || "") ? params.get("sale") : null;

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY),
    view: null, // the public view, as last read
    viewError: null,
    offsetMs: 0, // server clock minus this browser's clock
    rttMs: null, // round trip of the sample the offset came from
    inFlight: false, // a purchase is on its way
    blockedUntil: 0, // browser ms until which Retry-After keeps the button shut
    order: null, // {status, requestId, orderId, quantity, reason}
    acting: false, // pay or cancel on its way
    waitingFor: null, // "paid" while a payment completes
    waitingSince: 0,
    viaDraw: false, // the order went through a draw's pool
    announcedPhase: null,
  };

  // ------------------------------------------------------------------ requests

  // One API call. Resolves to {ok, status, data} or {ok: false, status, error, message,
  // retryAfterMs}; never throws.
  async function api(method, path, body, init = {}) {
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

  function refusalText(r) {
    const say = REFUSALS[r.error];
    return say ? say(r) : `Something went wrong (${r.status}): ${r.message}`;
  }

  // The message line; unchanged text is left alone so a screen reader does not repeat it.
  function say(text, kind = "info") {
    const m = $("message");
    if (m.textContent === text && m.dataset.kind === kind) return;
    m.textContent = text;
    m.dataset.kind = kind;
    m.dataset.code = "";
  }

  function sayRefusal(r) {
    const m = $("message");
    m.textContent = refusalText(r);
    m.dataset.kind = "refusal";
    m.dataset.code = r.error;
  }

  // ------------------------------------------------------------------ server clock

  // The offset of the server's clock from this browser's, from GET /health's serverTime:
  // of a few samples, the one with the shortest round trip, taken at its midpoint.
  async function syncClock() {
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

  const serverNow = () => Date.now() + state.offsetMs;

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

  // ------------------------------------------------------------------ the sale

  const limit = () => (state.view && state.view.perOrderLimit) || 1;

  // Where the sale stands on the server's clock: upcoming, draw (a draw sale's entry window),
  // running or ended.
  function phase() {
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
  function drawEndMs() {
    const v = state.view;
    if (!v || v.admission !== "draw") return null;
    if (v.drawEndAt) return Date.parse(v.drawEndAt);
    if (v.drawWindowMs) return Date.parse(v.startAt) + v.drawWindowMs;
    return null;
  }

  const soldOut = () => state.view && state.view.remainingStock <= 0 && phase() !== "draw";

  // An order that holds the buyer's place: no second purchase while it stands (a draw's
  // loser is refused too: one entry per buyer).
  const holding = () =>
    state.order &&
    ["accepted", "queued", "pending", "confirmed", "paid", "not_drawn"].includes(state.order.status);

  async function loadView() {
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

  // ------------------------------------------------------------------ buying

  async function buy(event) {
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
      setOrder({ status, requestId: r.data.requestId, quantity });
      pollOrder(true);
    } else {
      sayRefusal(r);
      if (r.retryAfterMs) state.blockedUntil = Date.now() + r.retryAfterMs;
      if (r.error === "unauthorized") signOut(false);
      // The buyer's existing order, so they see what they already hold.
      if (r.error === "already_purchased") readOrderOnce();
    }
    render();
  }

  function setOrder(order) {
    state.order = order;
    render();
  }

  // ------------------------------------------------------------------ following the order

  let pollTimer = null;
  let pollDelay = POLL_FIRST_MS;

  // Statuses after which nothing changes by itself (a confirmed order waits for the buyer).
  function settled(status) {
    if (status === "confirmed") return state.waitingFor !== "paid";
    return ["paid", "cancelled", "failed", "not_drawn", "none"].includes(status);
  }

  // Polls GET …/orders/me with backoff until the status settles; honours Retry-After.
  function pollOrder(restart) {
    clearTimeout(pollTimer);
    if (restart) pollDelay = POLL_FIRST_MS;
    pollTimer = setTimeout(pollOnce, pollDelay);
  }

  async function pollOnce() {
    const r = await api("GET", `/activities/${saleId}/orders/me`, undefined, { cache: "no-store" });
    let wait = pollDelay;
    pollDelay = Math.min(POLL_MAX_MS, pollDelay * POLL_FACTOR);
    if (r.ok) {
      const fresh = r.data;
      // Right after a 202 the order may not be visible yet: keep the accepted state.
      if (fresh.status === "none" && state.order && state.order.status === "accepted") {
        pollTimer = setTimeout(pollOnce, wait);
        return;
      }
      applyOrder(fresh);
      if (state.waitingFor === "paid" && Date.now() - state.waitingSince > PAY_WAIT_MS) {
        state.waitingFor = null;
        say("The payment has not come back yet. Reload the page later to see it.", "warn");
        render();
        return;
      }
      if (!settled(fresh.status)) pollTimer = setTimeout(pollOnce, pollDelay);
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

  async function readOrderOnce() {
    if (!state.token || !saleId) return;
    const r = await api("GET", `/activities/${saleId}/orders/me`, undefined, { cache: "no-store" });
    if (!r.ok) return;
    if (r.data.status !== "none") {
      applyOrder(r.data);
      if (!settled(r.data.status)) pollOrder(true);
    }
  }

  function applyOrder(o) {
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
  // completes it at `completeUrl`. The order becomes paid only when the provider's event
  // reaches the server, so the page then waits for orders/me to say so.
  async function pay() {
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
    } else if (p.provider && p.provider !== "local" && p.status !== "succeeded") {
      say(`Complete the payment with ${p.provider}; this page shows the result once it arrives.`);
    } else {
      say("Waiting for the payment's confirmation…");
    }
    state.acting = false;
    state.waitingFor = "paid";
    state.waitingSince = Date.now();
    pollOrder(true);
    render();
  }

  const sameOrigin = (url) => {
    try {
      return new URL(url, location.href).origin === location.origin;
    } catch (e) {
      return false;
    }
  };

  async function cancel() {
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
      await readOrderOnce();
    } else {
      sayRefusal(r);
    }
    render();
  }

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

  function useToken(token) {
    state.token = token.trim();
    sessionStorage.setItem(TOKEN_KEY, state.token);
    say("");
    state.order = null;
    readOrderOnce();
    render();
  }

  function signOut(clearMessage = true) {
    state.token = null;
    state.order = null;
    state.waitingFor = null;
    clearTimeout(pollTimer);
    sessionStorage.removeItem(TOKEN_KEY);
    if (clearMessage) say("");
    render();
  }

  // ------------------------------------------------------------------ drawing the page

  const PHASE_LABELS = {
    upcoming: "Not started",
    draw: "Draw open: entries are collected",
    running: "On sale",
    ended: "Ended",
  };

  function render() {
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

  function renderAccount() {
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
    }[o.status] || `Status: ${o.status}`;
    $("order-status").textContent = state.waitingFor === "paid" && o.status === "confirmed"
      ? `${n}: waiting for the payment's confirmation…`
      : text;
    const canAct = o.status === "confirmed" && !state.acting && state.waitingFor !== "paid";
    $("pay").hidden = o.status !== "confirmed";
    $("cancel").hidden = o.status !== "confirmed";
    $("pay").disabled = !canAct;
    $("cancel").disabled = !canAct;
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
})();
