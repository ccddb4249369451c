// Serving SLOs: the overview snapshot over HTTP (per endpoint its last hour of TTFT and ITL
// p50 / p99 against the SLO line, the last five minutes' figures, the SLO and burn-rate table),
// then the `serving` topic's deltas over the websocket: each endpoint's new or changed minute
// points (extendTraces; the minute still filling is replaced) and its small figures.
(function () {
  "use strict";

  var S = window.GoodputServing;
  var config = JSON.parse(document.getElementById("page-config").textContent);
  var WINDOW_POINTS = 64;  // an hour of minutes, the one filling, and a gap or two
  var LATENCY = {
    ttft: [{ key: "ttft_p50", name: "p50", color: "#5aa9ff" }, { key: "ttft_p99", name: "p99", color: "#f5b84b" }],
    itl: [{ key: "itl_p50", name: "p50", color: "#3ecf8e" }, { key: "itl_p99", name: "p99", color: "#c38bff" }],
  };
  var seq = 0;
  var drawn = false;
  var pending = [];
  var cards = new Map();  // endpoint id -> {el, summary, thresholds}
  var windows = [];

  function el(id) { return document.getElementById(id); }
  function field(card, name) { return card.querySelector("[data-field='" + name + "']"); }

  function renderTotals() {
    var all = Array.from(cards.values()).map(function (c) { return c.summary; });
    var budgets = all.map(function (s) { return s.worst_budget_left; }).filter(function (b) { return b !== null; });
    var totals = {
      endpoints: all.length,
      meeting: all.filter(function (s) { return s.verdict === "meeting"; }).length,
      missing: all.filter(function (s) { return s.verdict === "missing"; }).length,
      no_data: all.filter(function (s) { return s.verdict === "no_data"; }).length,
      alerts: all.reduce(function (n, s) { return n + s.alerts.length; }, 0),
      pages: all.reduce(function (n, s) { return n + s.alerts.filter(function (a) { return a.severity === "page"; }).length; }, 0),
      worst: budgets.length ? Math.min.apply(null, budgets) : null,
    };
    ["endpoints", "meeting", "missing", "no_data", "alerts", "pages"].forEach(function (k) {
      document.querySelector("[data-total='" + k + "']").textContent = S.fmt(totals[k]);
    });
    document.querySelector("[data-total='worst_budget_left']").textContent = S.pct(totals.worst);
    el("stat-missing").classList.toggle("bad", totals.missing > 0);
    el("stat-alerts").classList.toggle("bad", totals.pages > 0);
    el("stat-alerts").classList.toggle("warn", totals.alerts > 0 && !totals.pages);
    el("stat-budget").classList.toggle("bad", totals.worst !== null && totals.worst < 0);
    el("stat-budget").classList.toggle("warn", totals.worst !== null && totals.worst >= 0 && totals.worst < 0.25);
  }

  function meta(e) {
    var parts = [e.site + (e.region ? " (" + e.region + ")" : ""), e.framework_label];
    if (e.model) parts.push(e.model + (e.version ? " · v" + e.version : ""));
    parts.push(e.replicas + (e.replicas === 1 ? " replica" : " replicas"));
    return parts.join(" · ");
  }

  function thresholds(e) {
    var t = {};
    e.slos.forEach(function (r) { if (r.threshold_ms !== null) t[r.slo] = r.threshold_ms; });
    return t;
  }

  function renderSummary(card, e) {
    var n = e.now;
    var link = field(card, "link");
    link.textContent = e.name;
    link.href = e.url;
    S.setVerdict(field(card, "verdict"), e.verdict);
    field(card, "meta").textContent = meta(e);
    field(card, "ttft").textContent = S.ms(n.ttft_p50) + " / " + S.ms(n.ttft_p99) + " ms";
    field(card, "itl").textContent = S.ms(n.itl_p50) + " / " + S.ms(n.itl_p99) + " ms";
    field(card, "rps").textContent = S.fmt(n.rps, 2);
    field(card, "tokens").textContent = S.fmt(n.tokens_per_s);
    field(card, "waiting").textContent = S.fmt(n.waiting, n.waiting !== null && n.waiting < 10 ? 1 : 0);
    field(card, "running").textContent = S.fmt(n.running, n.running !== null && n.running < 10 ? 1 : 0);
    field(card, "kv").textContent = n.kv_cache_usage === null ? "–" : S.pct(n.kv_cache_usage) + " %";
    field(card, "kv").classList.toggle("warn-text", n.kv_cache_usage !== null && n.kv_cache_usage >= 0.9);
    field(card, "request").textContent = S.ms(n.request_mean_ms) + " ms";
    field(card, "request-box").hidden = n.request_mean_ms === null || n.request_mean_ms === undefined;
    field(card, "burn").innerHTML = S.sloTable(e.slos, windows);
    var covers = S.coverageNote(e.coverage);
    field(card, "coverage").textContent = covers;
    field(card, "coverage").hidden = !covers;
    var note = S.interpolationNote(e.slos);
    field(card, "note").textContent = note;
    field(card, "note").hidden = !note;
    card.classList.toggle("card-bad", e.verdict === "missing");
  }

  function drawCharts(card, e) {
    var t = thresholds(e);
    ["ttft", "itl"].forEach(function (q) {
      var layout = S.layout();
      layout.margin = { l: 44, r: 8, t: 8, b: 28 };
      layout.legend = { orientation: "h", y: 1.12, x: 1, xanchor: "right", font: { size: 10 } };
      if (t[q] !== undefined) {
        layout.shapes = [S.sloShape(t[q])];
        layout.annotations = [S.sloAnnotation(t[q])];
      }
      Plotly.react(card.querySelector("[data-chart='" + q + "']"), S.traces(e.series, LATENCY[q]), layout, S.CONFIG);
    });
  }

  function newCard(e) {
    var card = el("endpoint-card").content.firstElementChild.cloneNode(true);
    card.dataset.endpoint = e.id;
    card.querySelector("[data-chart='ttft']").id = "ttft-" + e.id;
    card.querySelector("[data-chart='itl']").id = "itl-" + e.id;
    return card;
  }

  function load() {
    var mine = ++seq;
    drawn = false;
    pending = [];
    return fetch(config.overview_url, { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("snapshot " + r.status); return r.json(); })
      .then(function (snap) {
        if (mine !== seq) return;
        windows = snap.burn_windows;
        var list = el("endpoints");
        var keep = new Set();
        snap.endpoints.forEach(function (e) {
          keep.add(e.id);
          var entry = cards.get(e.id);
          if (!entry) {
            entry = { el: newCard(e) };
            cards.set(e.id, entry);
          }
          list.appendChild(entry.el);  // in the snapshot's order
          entry.summary = e;
          entry.thresholds = thresholds(e);
          renderSummary(entry.el, e);
          drawCharts(entry.el, e);
        });
        cards.forEach(function (entry, id) { if (!keep.has(id)) { entry.el.remove(); cards.delete(id); } });
        if (!snap.endpoints.length) list.innerHTML = "";
        renderTotals();
        drawn = true;
        el("last-update").textContent = "updated " + S.fmtTime(snap.ts);
        var held = pending;
        pending = [];
        held.forEach(onDelta);
      });
  }

  function onDelta(msg) {
    if (msg.type !== "serving.delta") return;
    if (!drawn) {
      pending.push(msg);
      if (pending.length > 20) pending.shift();
      return;
    }
    for (var i = 0; i < msg.endpoints.length; i++) {
      if (!cards.has(msg.endpoints[i].id)) { load(); return; }  // a new endpoint: re-read the page
    }
    msg.endpoints.forEach(function (e) {
      var entry = cards.get(e.id);
      var before = JSON.stringify(entry.thresholds);
      entry.summary = e;
      entry.thresholds = thresholds(e);
      renderSummary(entry.el, e);
      if (JSON.stringify(entry.thresholds) !== before) {
        drawCharts(entry.el, Object.assign({}, e, { series: seriesOf(entry.el) }));  // a new SLO line
      }
      ["ttft", "itl"].forEach(function (q) {
        S.merge(entry.el.querySelector("[data-chart='" + q + "']"), e.points, LATENCY[q], WINDOW_POINTS);
      });
    });
    renderTotals();
    el("last-update").textContent = "updated " + S.fmtTime(msg.ts);
  }

  // The columns a drawn card holds now (to redraw it with a new SLO line).
  function seriesOf(card) {
    var out = { t: [] };
    ["ttft", "itl"].forEach(function (q) {
      var gd = card.querySelector("[data-chart='" + q + "']");
      LATENCY[q].forEach(function (s, j) {
        out.t = gd.data[j].x.slice();
        out[s.key] = gd.data[j].y.slice();
      });
    });
    return out;
  }

  window.goodputServing = { cards: cards, reload: load };
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
