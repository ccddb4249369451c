// Training goodput: the snapshot over HTTP (goodput now / 24 h / 7 d, the stacked hourly chart,
// the breakdown, the top jobs by GPU-hours lost, the jobs holding GPUs), then the `training`
// topic's deltas over the websocket: goodput numbers and the running jobs' steps and rates.
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("page-config").textContent);
  var COLORS = {
    productive: "#3ecf8e", at_risk: "#7fd4b0", startup: "#5aa9ff", data_stall: "#f5b84b",
    checkpoint_save: "#c38bff", checkpoint_restore: "#9d7bff", disruption: "#ff5c6c", hang: "#ff7eb6", idle: "#6b7785",
  };
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 48, r: 10, t: 10, b: 30 },
    xaxis: { gridcolor: "#2a323d", type: "date" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero" },
    legend: { orientation: "h", y: -0.2 }, showlegend: true,
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var STATE_LABELS = { pending: "Pending", allocated: "Allocated", running: "Running", failed: "Failed",
                       preempted: "Preempted", completed: "Completed", released: "Released" };
  var HOUR_MS = 3600000;
  var seq = 0;
  var running = new Map();   // job id -> row, as the latest snapshot or delta had it
  var flashed = new Set();

  function el(id) { return document.getElementById(id); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function fmt(v, d) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US", { minimumFractionDigits: d || 0, maximumFractionDigits: d || 0 }); }
  function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }
  function age(s) {
    if (s === null || s === undefined) return "–";
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }
  function state(s) { return "<span class='job-state state-" + esc(s) + "'>" + esc(STATE_LABELS[s] || s) + "</span>"; }
  function jobLink(j) { return "<a href='" + esc(j.url) + "'>" + esc(j.name) + "</a>"; }

  function sinceText(since, key) {
    var d = new Date(since);
    var hhmm = d.toISOString().slice(11, 16) + " UTC";
    if (key === "1h") return "since " + hhmm + " (this clock hour so far)";
    return "since " + d.toLocaleDateString("en-US", { month: "short", day: "numeric", timeZone: "UTC" }) + ", " + hhmm;
  }

  function renderGoodput(goodput) {
    ["1h", "24h", "7d"].forEach(function (key) {
      var g = goodput[key];
      // Retained goodput, the share at risk beside it, and GPU-hours that add up to the allocated.
      document.querySelector("[data-goodput='" + key + "']").textContent = pct(g.goodput);
      document.querySelector("[data-at-risk-share='" + key + "']").textContent = pct(g.at_risk_share);
      document.querySelector("[data-productive='" + key + "']").textContent = fmt(g.productive_gpu_h, 2);
      document.querySelector("[data-at-risk='" + key + "']").textContent = fmt(g.at_risk_gpu_h, 2);
      document.querySelector("[data-lost='" + key + "']").textContent = fmt(g.lost_gpu_h, 2);
      document.querySelector("[data-allocated='" + key + "']").textContent = fmt(g.allocated_gpu_h, 2);
      // Whole clock hours, the current one so far: say where the window starts.
      if (g.since) document.querySelector("[data-since='" + key + "']").textContent = sinceText(g.since, key);
      var stat = document.querySelector(".stat[data-window='" + key + "']");
      stat.classList.toggle("warn", g.goodput !== null && g.goodput < 0.9);
      stat.classList.toggle("bad", g.goodput !== null && g.goodput < 0.7);
    });
  }

  function renderRunning() {
    var rows = Array.from(running.values());
    rows.sort(function (a, b) { return b.gang_size - a.gang_size || (a.name < b.name ? -1 : 1); });
    el("running-count").textContent = rows.length;
    el("running-gpus").textContent = fmt(rows.reduce(function (n, j) { return n + j.gang_size; }, 0));
    el("running-table").querySelector("tbody").innerHTML = rows.map(function (j) {
      var stale = j.last_step_age_s !== null && j.last_step_age_s > 300;
      return "<tr data-job='" + j.id + "' class='" + (flashed.has(j.id) ? "flash" : "") + (j.state === "failed" ? " row-bad" : "") + "'>" +
        "<td>" + jobLink(j) + "</td><td>" + esc(j.team) + "</td><td>" + state(j.state) + "</td>" +
        "<td class='num'>" + fmt(j.gang_size) + "</td>" +
        "<td class='num' data-col='step'>" + fmt(j.last_step) + "</td>" +
        "<td class='num' data-col='step_rate'>" + fmt(j.step_rate, 2) + "</td>" +
        "<td class='num' data-col='tokens_per_s'>" + fmt(j.tokens_per_s) + "</td>" +
        "<td class='num'>" + (j.step_time_s === null ? "–" : fmt(j.step_time_s, 2) + " s") + "</td>" +
        "<td class='num" + (stale ? " warn-text" : "") + "' data-col='age'>" + age(j.last_step_age_s) + "</td>" +
        "<td class='num" + (j.failures ? " bad-text" : "") + "'>" + fmt(j.failures) + "</td></tr>";
    }).join("") || "<tr><td colspan='10' class='muted'>No job holds GPUs now.</td></tr>";
    flashed.clear();
  }

  function renderTop(top, rangeKey) {
    el("top-range").textContent = "over " + rangeKey;
    el("top-table").querySelector("tbody").innerHTML = top.map(function (j) {
      return "<tr><td>" + jobLink(j) + "</td><td>" + esc(j.team) + "</td><td>" + state(j.state) + "</td>" +
        "<td class='num'>" + fmt(j.gang_size) + "</td><td class='num'>" + fmt(j.lost_gpu_h, 1) + "</td>" +
        "<td class='num'>" + fmt(j.allocated_gpu_h, 1) + "</td><td class='num'>" + pct(j.goodput) + " %</td>" +
        "<td class='num'>" + pct(j.at_risk_share) + " %</td><td>" + esc(j.top_cause_label) + "</td></tr>";
    }).join("") || "<tr><td colspan='9' class='muted'>No GPU-hours lost over " + esc(rangeKey) + ".</td></tr>";
  }

  function drawStacked(snap) {
    var s = snap.series;
    var traces = snap.categories.map(function (c) {
      // Each bar spans its hour, [hour, hour + 1 h), as the accounts do.
      return { x: s.hours, y: s.gpu_h[c.category], name: c.label, type: "bar", marker: { color: COLORS[c.category] },
               xperiod: HOUR_MS, xperiodalignment: "middle",
               hovertemplate: "%{y:.1f} GPU-h<extra>" + c.label + "</extra>" };
    });
    var layout = JSON.parse(JSON.stringify(LAYOUT));
    layout.barmode = "stack";
    layout.bargap = 0.1;
    layout.yaxis.title = { text: "GPU-h" };
    layout.legend = { orientation: "h", y: -0.25, font: { size: 10 }, traceorder: "normal" };
    layout.margin.b = 40;
    // The whole range, to the end of the hour still filling, even before any hour is accounted.
    layout.xaxis.range = [snap.range_start, snap.range_end || new Date(Math.ceil(Date.parse(snap.ts) / HOUR_MS) * HOUR_MS).toISOString()];
    Plotly.react("chart-stacked", traces, layout, CONFIG);
    range.zoomOn(["chart-stacked"]);
    el("series-note").textContent = s.hours.length ? "" : "no hours accounted in this range yet";
  }

  function drawBreakdown(snap) {
    var rows = snap.breakdown.filter(function (b) { return b.badput; });
    rows.sort(function (a, b) { return a.gpu_h - b.gpu_h; });
    var layout = JSON.parse(JSON.stringify(LAYOUT));
    layout.xaxis = { gridcolor: "#2a323d", title: { text: "GPU-h lost" }, rangemode: "tozero" };
    layout.yaxis = { automargin: true };
    layout.showlegend = false;
    layout.margin.l = 10;
    Plotly.react("chart-breakdown", [{
      type: "bar", orientation: "h", x: rows.map(function (b) { return b.gpu_h; }), y: rows.map(function (b) { return b.label; }),
      marker: { color: rows.map(function (b) { return COLORS[b.category]; }) },
      text: rows.map(function (b) { return b.share === null ? "" : (100 * b.share).toFixed(1) + " %"; }), textposition: "auto",
      hovertemplate: "%{x:.2f} GPU-h<extra></extra>",
    }], layout, CONFIG);
    el("breakdown-range").textContent = "GPU-hours over " + rangeLabel(snap) + ", of " + fmt(snap.account.allocated_gpu_h, 1) + " allocated";
  }

  function stamp(ts) { el("last-update").textContent = "updated " + fmtTime(ts); }

  function load() {
    var mine = ++seq;
    return range.fetchJson(config.overview_url)
      .then(function (snap) {
        if (mine !== seq) return;  // a newer range or a reconnect is on its way
        running.clear();
        snap.running.forEach(function (j) { running.set(j.id, j); });
        renderGoodput(snap.goodput);
        renderRunning();
        renderTop(snap.top_jobs, rangeLabel(snap));
        drawStacked(snap);
        drawBreakdown(snap);
        stamp(snap.ts);
      });
  }

  function onDelta(msg) {
    if (msg.type !== "training.delta") return;
    renderGoodput(msg.goodput);
    var seen = new Set();
    msg.running.forEach(function (j) {
      var before = running.get(j.id);
      if (!before || before.last_step !== j.last_step || before.state !== j.state) flashed.add(j.id);
      running.set(j.id, j);
      seen.add(j.id);
    });
    running.forEach(function (_, id) { if (!seen.has(id)) running.delete(id); });  // released since
    renderRunning();
    stamp(msg.ts);
  }

  // A custom window reads whole hours: say which ("2024-05-01 02:00 – 03:00 UTC").
  function rangeLabel(snap) {
    if (!snap.range_end) return snap.range;
    var a = snap.range_start.slice(0, 10) + " " + snap.range_start.slice(11, 16);
    var b = snap.range_end.slice(0, 10) + " " + snap.range_end.slice(11, 16);
    return a + " – " + (a.slice(0, 10) === b.slice(0, 10) ? b.slice(11) : b) + " UTC";
  }

  // The overview's window: a preset or from / to, in the URL; a drag across the chart zooms to it.
  var range = new window.GoodputRange({ onChange: load });
  window.goodputTraining = { running: running };
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
