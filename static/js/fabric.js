// Fabric: the snapshot over HTTP for the page's range (port health per site and rack, the worst
// ports, the link-flap timeline, throughput per fabric), then the `fabric` topic's deltas over the
// websocket: the default range's counts and worst ports, and the newest throughput minutes (the
// minute still filling replaced in place, a new one appended). A custom or other range stays put.
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("page-config").textContent);
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 52, r: 8, t: 8, b: 28 },
    xaxis: { gridcolor: "#2a323d", type: "date" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero" },
    legend: { orientation: "h" },
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var FABRICS = ["compute", "storage", "management"];
  var seq = 0;
  var throughput = null;

  function el(id) { return document.getElementById(id); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function num(v, d) { return v === null || v === undefined ? "–" : Number(v).toFixed(d === undefined ? 0 : d); }
  function gbps(v) { return v === null || v === undefined ? "–" : (v / 1e9).toFixed(1) + " GB/s"; }
  function stamp(ts) { el("last-update").textContent = "updated " + new Date(ts).toISOString().slice(11, 19) + " UTC"; }

  function renderCounts(totals, sites) {
    el("fabric-empty").hidden = totals.ports > 0;
    el("fabric-ports").textContent = totals.ports;
    el("fabric-up").textContent = totals.up;
    el("fabric-flapping").textContent = totals.flapping;
    el("fabric-degraded").textContent = totals.degraded;
    var rows = [];
    sites.forEach(function (s) {
      s.racks.forEach(function (r) {
        rows.push("<tr><td>" + esc(s.name) + "</td><td>" + esc(r.name) + "</td><td class='num'>" + r.ports +
          "</td><td class='num'>" + r.up + "</td><td class='num" + (r.flapping ? " bad-text" : "") + "'>" + r.flapping +
          "</td><td class='num" + (r.degraded ? " bad-text" : "") + "'>" + r.degraded + "</td></tr>");
      });
    });
    el("fabric-racks").querySelector("tbody").innerHTML = rows.join("") || "<tr><td colspan='6' class='muted'>No ports in the range.</td></tr>";
  }

  function renderWorst(ports) {
    el("fabric-worst").querySelector("tbody").innerHTML = ports.map(function (p) {
      return "<tr><td><a href='/fleet/nodes/" + encodeURIComponent(p.hostname) + "/'>" + esc(p.hostname) + "</a></td><td>" + esc(p.name) +
        "</td><td>" + esc(p.fabric) + "</td><td class='num'>" + num(p.errors) + "</td><td class='num'>" + num(p.errors_per_hour, 1) +
        "</td><td class='num'>" + num(p.symbol_errors) + "</td><td class='num'>" + num(p.flaps) + "</td><td class='num" +
        (p.below_rate ? " bad-text" : "") + "'>" + gbps(p.rate_bytes_per_second) + " / " + gbps(p.rated_bytes_per_second) + "</td></tr>";
    }).join("") || "<tr><td colspan='8' class='muted'>No port with errors in the range.</td></tr>";
  }

  function drawThroughput() {
    var traces = FABRICS.map(function (f) {
      return { x: throughput.ts, y: throughput.bytes_per_second[f].map(function (v) { return v === null ? null : v / 1e9; }), name: f, type: "scatter", mode: "lines" };
    });
    Plotly.react("chart-throughput", traces, Object.assign({}, LAYOUT, { yaxis: Object.assign({}, LAYOUT.yaxis, { title: { text: "GB/s" } }) }), CONFIG);
  }

  function drawFlaps(flaps, win) {
    var trace = { x: flaps.map(function (f) { return f.ts; }), y: flaps.map(function (f) { return f.hostname + " " + f.interface; }),
      text: flaps.map(function (f) { return f.flaps + " flap(s)"; }), mode: "markers", type: "scatter", marker: { size: 9, color: "#e5534b" } };
    // The whole window on the time axis: one flap alone would otherwise zoom it to milliseconds.
    var xaxis = Object.assign({}, LAYOUT.xaxis, win ? { range: [win.from, win.to] } : {});
    Plotly.react("chart-flaps", [trace], Object.assign({}, LAYOUT, { xaxis: xaxis, yaxis: { gridcolor: "#2a323d", type: "category", automargin: true }, showlegend: false }), CONFIG);
  }

  function load() {
    var mine = ++seq;
    return range.fetchJson(config.snapshot_url).then(function (snap) {
      if (!snap || mine !== seq) return;
      renderCounts(snap.totals, snap.sites);
      renderWorst(snap.worst_ports);
      throughput = snap.throughput;
      drawThroughput();
      drawFlaps(snap.flaps, snap.window);
      range.zoomOn(["chart-throughput", "chart-flaps"]);
      stamp(snap.ts);
    });
  }

  function onDelta(msg) {
    if (msg.type !== "fabric.delta" || range.isCustom() || (range.select.value && range.select.value !== range.fallback)) return;
    renderCounts(msg.totals, msg.sites);
    renderWorst(msg.worst_ports);
    if (throughput) {
      msg.throughput.ts.forEach(function (ts, i) {
        var at = throughput.ts.indexOf(ts);
        if (at < 0) { throughput.ts.push(ts); at = throughput.ts.length - 1; }
        FABRICS.forEach(function (f) { throughput.bytes_per_second[f][at] = msg.throughput.bytes_per_second[f][i]; });
      });
      drawThroughput();
    }
    stamp(msg.ts);
  }

  var range = new window.GoodputRange({ onChange: load });
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
