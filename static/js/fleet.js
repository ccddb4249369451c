// Fleet dashboard: snapshot over HTTP, then deltas over the websocket appended with extendTraces.
(function () {
  "use strict";

  // The live charts keep the snapshot's resolution: one point per bucket, a window as long as
  // the chosen range. Deltas arrive up to twice a second; only one per bucket becomes a point.
  var bucketMs = 10000;
  var windowPoints = 90;
  var lastPointMs = 0;
  // Deltas extend the charts only once the current range's snapshot has drawn them: a delta that
  // arrives first (the socket opens before the snapshot returns, or the range just changed) would
  // extend a chart Plotly has not drawn ("gd.data must be an array"), and the snapshot includes it.
  var chartsDrawn = false;
  var snapshotSeq = 0;
  var TABLE_LIMIT = 1000;
  var CHARTS = [
    { id: "chart-util", key: "util", siteKey: "mean_util", range: [0, 100] },
    { id: "chart-power", key: "power_kw", siteKey: "power_kw" },
    { id: "chart-temp", key: "temp", siteKey: "max_temp" },
  ];
  var COLORS = ["#5aa9ff", "#3ecf8e", "#f5b84b", "#c38bff", "#ff7eb6", "#4dd0e1"];
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 44, r: 10, t: 14, b: 30 },
    xaxis: { gridcolor: "#2a323d", type: "date" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero" },
    legend: { orientation: "h", y: -0.18 }, showlegend: true,
  };
  var CONFIG = { displayModeBar: false, responsive: true };

  var gpus = new Map();
  var siteOrder = [];   // site ids in trace order
  var siteNames = {};
  var flashed = new Set();

  function el(id) { return document.getElementById(id); }
  function fmt(v, d) { return v === null || v === undefined ? "–" : (d === undefined ? v : Number(v).toFixed(d)); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }
  var TOTAL_DIGITS = { mean_util: 1, power_kw: 1, max_temp: 1 };

  function renderTotals(t) {
    document.querySelectorAll("[data-total]").forEach(function (node) {
      var key = node.dataset.total;
      node.textContent = fmt(t[key], TOTAL_DIGITS[key]);
    });
    el("errors-stat").classList.toggle("bad", t.with_errors > 0);
    var hot = el("hottest").querySelector("tbody");
    hot.innerHTML = t.hottest.map(function (g) {
      return "<tr><td><a href='/fleet/gpus/" + encodeURIComponent(g.uuid) + "/'>" + esc(g.hostname) + "/gpu" + g.index +
        "</a></td><td>" + esc(g.site) + "</td><td class='num'>" + fmt(g.temp) + "</td><td class='num'>" + fmt(g.util) +
        "</td><td class='num'>" + fmt(g.power_w, 0) + "</td></tr>";
    }).join("") || "<tr><td colspan='5' class='muted'>No fresh samples.</td></tr>";
  }

  function renderSites(sites) {
    var select = el("gpu-site");
    var current = select.value;
    sites.forEach(function (s) { siteNames[s.id] = s.name; });
    el("site-cards").innerHTML = sites.map(function (s) {
      return "<div class='card site-card' data-site='" + s.id + "'><div class='card-title'>" + esc(s.name) +
        " <span class='muted'>" + esc(s.region) + "</span></div>" +
        "<div class='kv'><span>GPUs reporting</span><b>" + s.reporting + " / " + s.gpus + "</b></div>" +
        "<div class='kv'><span>Mean util</span><b>" + fmt(s.mean_util) + "%</b></div>" +
        "<div class='kv'><span>Hottest</span><b>" + fmt(s.max_temp) + " °C</b></div>" +
        // GPUs only: the site's draw with its nodes, against its contracted power, is on /power/.
        "<div class='kv'><span title='the latest power of the GPUs, without the node overhead'>GPU power</span><b>" + fmt(s.power_kw, 1) + " kW</b></div>" +
        "<div class='kv'><span title='GPUs with an open XID or double-bit ECC finding'>GPUs with XID / ECC errors</span><b class='" + (s.with_errors ? "bad-text" : "") + "'>" + s.with_errors + "</b></div></div>";
    }).join("");
    select.innerHTML = "<option value=''>All sites</option>" + sites.map(function (s) {
      return "<option value='" + esc(s.name) + "'>" + esc(s.name) + "</option>";
    }).join("");
    select.value = current;
  }

  var STALE_MS = JSON.parse(document.getElementById("stale-seconds").textContent) * 1000;
  function isStale(g) { return Date.now() - Date.parse(g.ts) > STALE_MS; }

  function renderTable() {
    var text = el("gpu-filter").value.trim().toLowerCase();
    var site = el("gpu-site").value;
    var state = el("gpu-state").value;
    var rows = [];
    gpus.forEach(function (g) {
      if (site && g.site !== site) return;
      if (text && (g.hostname + " " + g.uuid + " " + g.model).toLowerCase().indexOf(text) < 0) return;
      // The same GPUs as the "GPUs with XID / ECC errors" figure: an open XID or ECC finding.
      if (state === "errors" && !g.open_xid_ecc) return;
      if (state === "throttled" && !(g.throttle > 1)) return;
      if (state === "stale" && !isStale(g)) return;
      rows.push(g);
    });
    rows.sort(function (a, b) { return a.hostname < b.hostname ? -1 : a.hostname > b.hostname ? 1 : a.index - b.index; });
    el("gpu-count").textContent = rows.length + " of " + gpus.size + (rows.length > TABLE_LIMIT ? " (first " + TABLE_LIMIT + " shown)" : "");
    el("gpu-table").querySelector("tbody").innerHTML = rows.slice(0, TABLE_LIMIT).map(function (g) {
      var cls = (g.open_xid_ecc || (g.xid > 0) || (g.ecc_dbe > 0) ? "row-bad " : "") + (isStale(g) ? "row-stale " : "") + (flashed.has(g.uuid) ? "flash" : "");
      return "<tr class='" + cls + "'><td><a href='/fleet/nodes/" + encodeURIComponent(g.hostname) + "/'>" + esc(g.hostname) + "</a></td>" +
        "<td><a href='/fleet/gpus/" + encodeURIComponent(g.uuid) + "/'>gpu" + g.index + "</a></td><td>" + esc(g.model) + "</td><td>" + esc(g.site) + "</td>" +
        "<td class='num'>" + fmt(g.util) + "</td><td class='num'>" + fmt(g.mem_used_pct) + "</td><td class='num'>" + fmt(g.temp) + "</td>" +
        "<td class='num'>" + fmt(g.mem_temp) + "</td><td class='num'>" + fmt(g.power_w, 0) + "</td><td class='num'>" + fmt(g.sm_clock, 0) + "</td>" +
        "<td class='num" + (g.xid > 0 ? " bad-text" : "") + "'>" + fmt(g.xid) + "</td><td class='num" + (g.ecc_dbe > 0 ? " bad-text" : "") + "'>" + fmt(g.ecc_dbe) + "</td>" +
        "<td>" + fmtTime(g.ts) + "</td></tr>";
    }).join("");
    flashed.clear();
  }

  function drawCharts(series) {
    bucketMs = series.bucket_seconds * 1000;
    windowPoints = Math.ceil(series.range_seconds / series.bucket_seconds);
    lastPointMs = 0;
    Object.keys(series.sites).forEach(function (id) {
      var ts = series.sites[id].ts;
      if (ts.length) lastPointMs = Math.max(lastPointMs, Date.parse(ts[ts.length - 1]));
    });
    siteOrder = Object.keys(series.sites).map(Number).sort(function (a, b) { return a - b; });
    Object.keys(siteNames).map(Number).forEach(function (id) { if (siteOrder.indexOf(id) < 0) siteOrder.push(id); });
    CHARTS.forEach(function (chart) {
      var traces = siteOrder.map(function (id, i) {
        var s = series.sites[id] || { ts: [], util: [], power_kw: [], temp: [] };
        return { x: s.ts, y: s[chart.key], name: siteNames[id] || ("site " + id), mode: "lines",
                 line: { width: 2, color: COLORS[i % COLORS.length] } };
      });
      var layout = JSON.parse(JSON.stringify(LAYOUT));
      if (chart.range) layout.yaxis.range = chart.range;
      if (series.from) layout.xaxis.range = [series.from, series.to];  // a custom window, drawn whole
      Plotly.react(chart.id, traces, layout, CONFIG);
    });
    range.zoomOn(CHARTS.map(function (chart) { return chart.id; }));
    chartsDrawn = true;
  }

  function extendCharts(ts, sites) {
    if (!chartsDrawn || range.isCustom()) return;  // a custom window stays put
    if (Date.parse(ts) - lastPointMs < bucketMs) return;  // this bucket already has its point
    lastPointMs = Date.parse(ts);
    var bySite = {};
    sites.forEach(function (s) { bySite[s.id] = s; });
    sites.forEach(function (s) {
      if (siteOrder.indexOf(s.id) < 0) {  // a site that appeared after the snapshot gets a trace
        siteOrder.push(s.id);
        CHARTS.forEach(function (chart) {
          Plotly.addTraces(chart.id, { x: [], y: [], name: s.name, mode: "lines",
                                       line: { width: 2, color: COLORS[(siteOrder.length - 1) % COLORS.length] } });
        });
      }
    });
    var indices = siteOrder.map(function (_, i) { return i; });
    if (!indices.length) return;
    CHARTS.forEach(function (chart) {
      var xs = siteOrder.map(function (id) { return bySite[id] && bySite[id].reporting ? [ts] : []; });
      var ys = siteOrder.map(function (id) { return bySite[id] && bySite[id].reporting ? [bySite[id][chart.siteKey]] : []; });
      Plotly.extendTraces(chart.id, { x: xs, y: ys }, indices, windowPoints);
    });
  }

  function stamp(ts) { el("last-update").textContent = "updated " + fmtTime(ts); }

  function loadSnapshot() {
    var seq = ++snapshotSeq;
    chartsDrawn = false;
    return range.fetchJson("/api/v1/fleet/overview/")
      .then(function (snap) {
        if (seq !== snapshotSeq) return;  // a newer snapshot (another range, a reconnect) is on its way
        gpus.clear();
        snap.gpus.forEach(function (g) { gpus.set(g.uuid, g); });
        renderSites(snap.sites);
        renderTotals(snap.totals);
        renderTable();
        drawCharts(snap.series);
        stamp(snap.ts);
      });
  }

  function onDelta(msg) {
    if (msg.type !== "fleet.delta") return;
    msg.gpus.forEach(function (g) { gpus.set(g.uuid, g); flashed.add(g.uuid); });
    renderSites(msg.sites);
    renderTotals(msg.totals);
    renderTable();
    extendCharts(msg.ts, msg.sites);
    stamp(msg.ts);
  }

  ["gpu-filter", "gpu-site", "gpu-state"].forEach(function (id) { el(id).addEventListener("input", renderTable); });
  // The charts' window: a preset or from / to, in the URL; a drag across a chart zooms to it.
  var range = new window.GoodputRange({ onChange: loadSnapshot });
  window.goodputFleet = { gpus: gpus };
  new window.GoodputLive({ topics: ["fleet"], onMessage: onDelta, onSnapshot: loadSnapshot });
})();
