// The operator page: polls GET /admin/ops (queue, counters, reconcile, the refunds and
// disputes that need a human) every second, the chosen sale's GET /admin/activities/{id} every
// second, the others every 5 s, and draws live line charts on <canvas> by hand. Needs a token
// with the seckill:admin scope. Server text goes in as textContent only.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  const TOKEN_KEY = "seckill.ops.token";
  const TICK_MS = 1000;
  const LIST_EVERY_MS = 5000;
  const DETAIL_EVERY_MS = 5000;
  const MAX_DETAILED = 10;
  const WINDOW_S = 120; // seconds of history a chart shows
  // Okabe-Ito colours: told apart with every common colour-vision deficiency.
  const COLORS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9"];

  const params = new URLSearchParams(location.search);
  const state = {
    token: sessionStorage.getItem(TOKEN_KEY),
    selected: /^[0-9]+$/.test(params.get("sale") || "") ? Number(params.get("sale")) : null,
    sales: [], // the list page
    details: new Map(), // id -> {detail, at}
    ops: null,
    serverOffsetMs: 0,
    lastCounters: null, // {at, counters}
    lastUnits: null, // {at, id, units}: the derived rate when the process counts nothing
    listAt: 0,
  };

  // ------------------------------------------------------------------ requests

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    try {
      const res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
      const data = await res.json().catch(() => null);
      if (res.ok) return { ok: true, status: res.status, data };
      return { ok: false, status: res.status, error: data && data.error, message: (data && data.message) || res.statusText };
    } catch (e) {
      return { ok: false, status: 0, error: "network", message: String(e) };
    }
  }

  function say(text, kind = "info") {
    $("message").textContent = text;
    $("message").dataset.kind = kind;
  }

  function sayError(r) {
    const why = {
      unauthorized: "Sign in: the token is missing, expired or not valid here.",
      forbidden: "This token lacks the seckill:admin scope.",
      network: "No answer from the server.",
    }[r.error];
    say(why || `${r.status} ${r.error || ""}: ${r.message}`, "refusal");
  }

  // ------------------------------------------------------------------ charts

  // A line chart of a few series over the last WINDOW_S seconds, drawn on a canvas.
  class LineChart {
    constructor(canvas, legend, title, series, { integer = false } = {}) {
      this.canvas = canvas;
      this.integer = integer;
      this.legend = legend;
      this.title = title;
      this.series = series.map((s, i) => ({ ...s, color: COLORS[i % COLORS.length] }));
      this.points = []; // {t: seconds, v: {key: number|null}}
      this.buildLegend();
    }

    buildLegend() {
      this.legend.textContent = "";
      this.values = {};
      for (const s of this.series) {
        const li = document.createElement("li");
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.background = s.dash
          ? `repeating-linear-gradient(90deg, ${s.color} 0 4px, transparent 4px 7px)`
          : s.color;
        const text = document.createElement("span");
        li.append(swatch, text);
        this.legend.append(li);
        this.values[s.key] = text;
      }
    }

    reset() {
      this.points = [];
      this.draw();
    }

    push(t, values) {
      this.points.push({ t, v: values });
      while (this.points.length && this.points[0].t < t - WINDOW_S) this.points.shift();
      this.draw();
    }

    draw() {
      const c = this.canvas;
      const dpr = window.devicePixelRatio || 1;
      const w = c.clientWidth || 400;
      const h = c.clientHeight || 180;
      if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
        c.width = Math.round(w * dpr);
        c.height = Math.round(h * dpr);
      }
      const g = c.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, h);
      const style = getComputedStyle(document.body);
      const ink = style.color;
      const left = 52, right = 10, top = 10, bottom = 22;
      const pw = w - left - right, ph = h - top - bottom;

      const last = this.points.length ? this.points[this.points.length - 1].t : 0;
      const first = this.points.length ? this.points[0].t : 0;
      // The x axis spans the history there is, from 20 s up to WINDOW_S.
      const span = Math.min(WINDOW_S, Math.max(20, Math.ceil((last - first) / 10) * 10));
      let max = 0;
      for (const p of this.points) for (const s of this.series) max = Math.max(max, p.v[s.key] || 0);
      const step = niceStep(max / 4, this.integer);
      const yMax = Math.max(step, Math.ceil(max / step) * step);
      const x = (t) => left + pw * (1 - (last - t) / span);
      const y = (v) => top + ph * (1 - v / yMax);

      // Grid and axis labels.
      g.font = "11px system-ui, sans-serif";
      g.fillStyle = ink;
      g.strokeStyle = "rgba(128,128,128,0.35)";
      g.lineWidth = 1;
      g.textAlign = "right";
      g.textBaseline = "middle";
      for (let v = 0; v <= yMax + step / 2; v += step) {
        const yy = Math.round(y(v)) + 0.5;
        g.beginPath();
        g.moveTo(left, yy);
        g.lineTo(w - right, yy);
        g.stroke();
        g.fillText(formatNumber(v), left - 6, yy);
      }
      g.textAlign = "center";
      g.textBaseline = "top";
      for (const ago of [span, span / 2, 0]) {
        g.textAlign = ago === span ? "left" : ago === 0 ? "right" : "center";
        g.fillText(ago === 0 ? "now" : `−${ago} s`, left + pw * (1 - ago / span), h - bottom + 6);
      }

      // One line per series; a gap where a value is missing.
      g.lineWidth = 2;
      g.lineJoin = "round";
      for (const s of this.series) {
        g.strokeStyle = s.color;
        g.setLineDash(s.dash || []);
        g.beginPath();
        let open = false;
        for (const p of this.points) {
          const v = p.v[s.key];
          if (v == null) {
            open = false;
            continue;
          }
          if (open) g.lineTo(x(p.t), y(v));
          else g.moveTo(x(p.t), y(v));
          open = true;
        }
        g.stroke();
        g.setLineDash([]);
        const lastPoint = this.points[this.points.length - 1];
        if (lastPoint && lastPoint.v[s.key] != null) {
          g.fillStyle = s.color;
          g.beginPath();
          g.arc(x(lastPoint.t), y(lastPoint.v[s.key]), 3, 0, 2 * Math.PI);
          g.fill();
        }
      }

      // The same figures in words, for the legend and for screen readers.
      const latest = this.points.length ? this.points[this.points.length - 1].v : {};
      const words = this.series.map((s) => `${s.label} ${latest[s.key] == null ? "–" : formatNumber(latest[s.key])}`);
      this.series.forEach((s, i) => (this.values[s.key].textContent = words[i]));
      c.setAttribute("aria-label", `${this.title}: ${this.points.length ? words.join(", ") : "no data yet"}`);
      c.dataset.points = String(this.points.length);
    }
  }

  // A grid step: the smallest 1, 2 or 5 times a power of ten at or above v (at least 1 for
  // counts, at least 0.5 for rates).
  function niceStep(v, integer) {
    const floor = integer ? 1 : 0.5;
    if (!(v > floor)) return floor;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function formatNumber(v) {
    if (v == null) return "–";
    return Math.abs(v) >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(1);
  }

  const rateChart = new LineChart($("chart-rate"), $("legend-rate"), "Purchases per second", [
    { key: "accepted", label: "accepted/s" },
    { key: "refused", label: "refused/s" },
    { key: "unavailable", label: "unavailable/s" },
  ]);
  const queueChart = new LineChart($("chart-queue"), $("legend-queue"), "Queue depth", [
    { key: "visible", label: "visible" },
    { key: "inFlight", label: "in flight" },
    { key: "deadLetter", label: "dead letters" },
  ], { integer: true });
  const stockChart = new LineChart($("chart-stock"), $("legend-stock"), "Stock", [
    { key: "redis", label: "redis stock" },
    // Dashed: once orders are written it lies on the redis line.
    { key: "db", label: "db stock", dash: [6, 5] },
    { key: "pending", label: "pending" },
    { key: "confirmed", label: "confirmed" },
    // Dotted: with one unit per buyer it lies on the confirmed line.
    { key: "participants", label: "participants", dash: [2, 4] },
  ], { integer: true });

  // ------------------------------------------------------------------ polling

  const nowS = () => performance.now() / 1000;

  async function tick() {
    if (!state.token) return;
    const t = nowS();
    const [ops] = await Promise.all([api("GET", "/admin/ops"), refreshSales(t)]);
    if (!ops.ok) {
      sayError(ops);
      if (ops.error === "unauthorized") signOut();
      return;
    }
    if ($("message").dataset.kind === "refusal") say("");
    state.ops = ops.data;
    state.serverOffsetMs = Date.parse(ops.data.now) - Date.now();
    renderOps(t);
    renderPayments();
    renderSales();
  }

  // The list every LIST_EVERY_MS; the chosen sale's detail every tick; the others'
  // every DETAIL_EVERY_MS.
  async function refreshSales(t) {
    if (!state.sales.length || Date.now() - state.listAt > LIST_EVERY_MS) {
      const list = await api("GET", "/admin/activities?limit=20");
      if (list.ok) {
        state.sales = list.data.items;
        state.listAt = Date.now();
        if (state.selected == null && state.sales.length) {
          const running = state.sales.find((a) => phaseOf(a) === "running");
          select((running || state.sales[0]).id);
        }
      }
    }
    const due = state.sales.slice(0, MAX_DETAILED).filter((a) => {
      const d = state.details.get(a.id);
      return a.id === state.selected || !d || Date.now() - d.at > DETAIL_EVERY_MS;
    });
    if (state.selected != null && !due.some((a) => a.id === state.selected)) due.push({ id: state.selected });
    await Promise.all(
      due.map(async (a) => {
        const r = await api("GET", `/admin/activities/${a.id}`);
        if (r.ok) state.details.set(a.id, { detail: r.data, at: Date.now() });
      }),
    );
    const chosen = state.details.get(state.selected);
    if (chosen) {
      const s = chosen.detail.stats;
      stockChart.push(t, {
        redis: s.redisStock,
        db: s.dbRemaining,
        pending: s.pendingQuantity,
        confirmed: s.confirmedQuantity,
        participants: s.participants,
      });
      $("selected-name").textContent = `${chosen.detail.id}: ${chosen.detail.title}`;
    }
  }

  function renderOps(t) {
    const o = state.ops;
    $("now").textContent = new Date(Date.parse(o.now)).toLocaleTimeString();
    $("q-visible").textContent = formatNumber(o.queue.visible);
    $("q-inflight").textContent = formatNumber(o.queue.inFlight);
    $("q-dead").textContent = formatNumber(o.queue.deadLetter);
    queueChart.push(t, o.queue);

    if (o.counters) {
      $("c-accepted").textContent = String(o.counters.purchasesAccepted);
      $("c-refused").textContent = String(o.counters.purchasesRefused);
      const prev = state.lastCounters;
      state.lastCounters = { t, c: o.counters };
      $("rate-note").textContent = "From this server's purchase counters.";
      if (prev) {
        const dt = Math.max(0.001, t - prev.t);
        // A restart resets the counters: never chart a negative rate.
        const rate = (k) => Math.max(0, (o.counters[k] - prev.c[k]) / dt);
        rateChart.push(t, {
          accepted: rate("purchasesAccepted"),
          refused: rate("purchasesRefused"),
          unavailable: rate("purchasesUnavailable"),
        });
      }
      return;
    }
    // No counters where the admin runs apart from the entry (Lambda): accepted units per
    // second of the chosen sale, from the change in its pending + confirmed quantity.
    $("c-accepted").textContent = "–";
    $("c-refused").textContent = "–";
    $("rate-note").textContent =
      "This server does not count purchases: accepted/s is derived from the chosen sale's pending + confirmed units; refusals are not known here.";
    const chosen = state.details.get(state.selected);
    if (!chosen) return;
    const s = chosen.detail.stats;
    const units = s.pendingQuantity + s.confirmedQuantity;
    const prev = state.lastUnits;
    state.lastUnits = { t, id: state.selected, units };
    if (prev && prev.id === state.selected) {
      rateChart.push(t, { accepted: Math.max(0, (units - prev.units) / Math.max(0.001, t - prev.t)), refused: null, unavailable: null });
    }
  }

  // ------------------------------------------------------------------ payments

  // How long ago `iso` was on the server's clock, in its largest whole unit.
  function ago(iso) {
    const s = Math.max(0, Math.round((Date.parse(state.ops.now) - Date.parse(iso)) / 1000));
    return `${duration(s)} ago`;
  }

  function duration(s) {
    if (s < 120) return `${s} s`;
    if (s < 2 * 3600) return `${Math.floor(s / 60)} min`;
    if (s < 2 * 86400) return `${Math.floor(s / 3600)} h`;
    return `${Math.floor(s / 86400)} d`;
  }

  // An amount in the currency's minor units, in the page's locale ("$19.99").
  function money(minor, currency) {
    try {
      const f = new Intl.NumberFormat(undefined, { style: "currency", currency: currency.toUpperCase() });
      return f.format(minor / 10 ** f.resolvedOptions().maximumFractionDigits);
    } catch (e) {
      return `${minor} ${currency}`;
    }
  }

  function renderPayments() {
    const p = state.ops.payments;
    const c = p.counts;
    // A count at the cap was not read further.
    const count = (id, n, kind) => {
      $(id).textContent = n >= p.countCap ? `${p.countCap}+` : String(n);
      $(id).className = n > 0 ? kind : "";
    };
    count("p-due", c.refundsDue, "");
    count("p-refunding", c.refundsRefunding, "");
    count("p-failed", c.refundsFailed, "bad");
    count("p-refunded", c.refundedRecently, "");
    count("p-disputed", c.disputed, "bad");
    $("p-refunded-label").textContent = `Refunded (last ${duration(p.refundedWithinSecs)})`;
    $("p-oldest").textContent = c.oldestOwedAt ? ago(c.oldestOwedAt) : "–";
    $("payments-note").textContent =
      `Payments that need a human: refunds that failed, disputes, and refunds owed for more than ${duration(p.owedForSecs)}. Newest change first.`;

    const rows = p.flagged.map((f) => {
      const tr = document.createElement("tr");
      tr.dataset.order = String(f.orderId);
      const cell = (text, cls) => {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      };
      const owed = f.refundState === "due" || f.refundState === "refunding";
      cell(String(f.orderId), "num");
      cell(String(f.activityId), "num");
      cell(f.providerPaymentId);
      cell(money(f.amountMinor, f.currency), "num");
      cell(f.refundState || "–", f.refundState === "failed" ? "bad" : owed ? "warn" : "");
      cell(String(f.refundAttempts), "num");
      cell(f.refundError || "–", "error");
      cell(f.refundId || "–");
      cell(f.disputedAt ? ago(f.disputedAt) : "–", f.disputedAt ? "bad" : "");
      cell(ago(f.updatedAt));
      return tr;
    });
    $("payments-body").replaceChildren(...rows);
    $("payments-table").hidden = rows.length === 0;
    $("payments-empty").hidden = rows.length > 0;
  }

  function phaseOf(a) {
    const now = Date.now() + state.serverOffsetMs;
    if (a.state && a.state !== "published") return a.state;
    if (now < Date.parse(a.startAt)) return "upcoming";
    if (now >= Date.parse(a.endAt)) return "ended";
    return "running";
  }

  function renderSales() {
    const body = $("sales-body");
    const checks = new Map(((state.ops && state.ops.reconcile) || []).map((r) => [r.activityId, r]));
    const rows = [];
    for (const a of state.sales) {
      const d = state.details.get(a.id);
      const s = d && d.detail.stats;
      const r = checks.get(a.id);
      const tr = document.createElement("tr");
      tr.dataset.id = String(a.id);
      tr.setAttribute("aria-selected", String(a.id === state.selected));
      const cell = (text, cls) => {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      };
      cell(String(a.id));
      cell(a.title);
      cell(phaseOf(a) + (a.admission === "draw" ? " (draw)" : ""));
      cell(s ? formatNumber(s.redisStock) : "…");
      cell(s ? String(s.dbRemaining) : "…");
      cell(s ? `${s.pendingQuantity} (${s.pendingCount})` : "…");
      cell(s ? String(s.confirmedQuantity) : "…");
      cell(s ? String(s.participants) : "…");
      cell(s ? formatNumber(s.drift) : "…", s && s.drift != null ? (s.drift === 0 ? "good" : "bad") : "");
      if (r) {
        const ago = Math.max(0, Math.round((Date.parse(state.ops.now) - Date.parse(r.checkedAt)) / 1000));
        cell(`${ago} s ago, drift ${r.drift}, ${r.repairs} repair${r.repairs === 1 ? "" : "s"}`, r.drift === 0 ? "" : "bad");
      } else {
        cell("not checked yet");
      }
      const td = document.createElement("td");
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = a.id === state.selected ? "Charted" : "Chart";
      b.setAttribute("aria-label", `Chart sale ${a.id}`);
      b.disabled = a.id === state.selected;
      b.addEventListener("click", () => select(a.id));
      td.append(b);
      tr.append(td);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function select(id) {
    if (state.selected === id && stockChart.points.length) return;
    state.selected = id;
    state.lastUnits = null;
    stockChart.reset();
    const url = new URL(location.href);
    url.searchParams.set("sale", String(id));
    history.replaceState(null, "", url);
    renderSales();
  }

  // ------------------------------------------------------------------ signing in

  function renderAccount() {
    $("whoami").hidden = !state.token;
    $("signed-out").hidden = !!state.token;
    let who = "a pasted token";
    try {
      who = JSON.parse(atob(state.token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))).sub || who;
    } catch (e) {
      /* a token that is not a JWT we can read: the server decides */
    }
    $("who").textContent = who;
    $("sign-in-button").textContent = `Sign in as ${$("user").value.trim() || "…"} (admin)`;
  }

  function useToken(token) {
    state.token = token.trim().replace(/^Bearer\s+/i, "");
    sessionStorage.setItem(TOKEN_KEY, state.token);
    say("");
    renderAccount();
    tick();
  }

  function signOut() {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    renderAccount();
  }

  $("sign-in").addEventListener("submit", async (e) => {
    e.preventDefault();
    const r = await api("POST", "/dev/token", { user: $("user").value.trim(), admin: true });
    if (r.ok) useToken(r.data.token);
    else if (r.status === 404) {
      $("paste").open = true;
      say("This server does not sign names in (only the local dev server does): paste an admin token.", "warn");
    } else sayError(r);
  });
  $("user").addEventListener("input", renderAccount);
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if ($("token").value.trim()) useToken($("token").value);
  });
  $("sign-out").addEventListener("click", signOut);
  window.addEventListener("resize", () => [rateChart, queueChart, stockChart].forEach((c) => c.draw()));

  renderAccount();
  [rateChart, queueChart, stockChart].forEach((c) => c.draw());
  // One tick at a time: the next starts a second after the last one ended.
  (async function loop() {
    await tick();
    setTimeout(loop, TICK_MS);
  })();
})();
