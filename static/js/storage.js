// Storage: the snapshot over HTTP for the page's range (mounts with free space, throughput, I/O
// time and the jobs on their nodes; per GPU server its read throughput against the 10-20 GB/s a
// training server needs), then the `storage` topic's deltas over the websocket for the default
// range. A custom or other range stays put.
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("page-config").textContent);
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 52, r: 8, t: 8, b: 60 },
    xaxis: { gridcolor: "#2a323d", type: "category", automargin: true }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero", title: { text: "GB/s" } },
    legend: { orientation: "h" }, barmode: "group",
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var seq = 0;

  function el(id) { return document.getElementById(id); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function gbps(v) { return v === null || v === undefined ? "–" : (v / 1e9).toFixed(2) + " GB/s"; }
  function mbps(v) { return v === null || v === undefined ? "–" : (v / 1e6).toFixed(1) + " MB/s"; }
  function pct(v) { return v === null || v === undefined ? "–" : Number(v).toFixed(1) + " %"; }
  function jobs(list) { return list.length ? list.map(function (j) { return "<a href='/training/jobs/" + j.id + "/'>" + esc(j.name) + "</a>"; }).join(", ") : "<span class='muted'>none</span>"; }
  function stamp(ts) { el("last-update").textContent = "updated " + new Date(ts).toISOString().slice(11, 19) + " UTC"; }

  function render(snap) {
    el("storage-empty").hidden = snap.mounts.length > 0;
    el("storage-mounts").textContent = snap.totals.mounts;
    el("storage-low").textContent = snap.totals.low_free;
    el("storage-servers").textContent = snap.totals.servers;
    el("storage-below").textContent = snap.totals.servers_below_need;
    el("storage-mounts-table").querySelector("tbody").innerHTML = snap.mounts.map(function (m) {
      return "<tr><td><a href='/fleet/nodes/" + encodeURIComponent(m.hostname) + "/'>" + esc(m.hostname) + "</a></td><td>" + esc(m.mountpoint) +
        "</td><td>" + esc(m.fstype) + "</td><td>" + esc(m.purpose) + "</td><td class='num" + (m.free_pct !== null && m.free_pct < 10 ? " bad-text" : "") + "'>" + pct(m.free_pct) +
        "</td><td class='num'>" + mbps(m.read_bytes_per_second) + "</td><td class='num'>" + mbps(m.written_bytes_per_second) +
        "</td><td class='num'>" + pct(m.io_busy_pct) + "</td><td>" + jobs(m.jobs) + "</td></tr>";
    }).join("") || "<tr><td colspan='9' class='muted'>No mounts.</td></tr>";
    el("storage-servers-table").querySelector("tbody").innerHTML = snap.servers.map(function (s) {
      return "<tr><td>" + esc(s.hostname) + "</td><td class='num'>" + gbps(s.average_read_bytes_per_second) + "</td><td class='num" +
        (s.below_need ? " bad-text" : "") + "'>" + gbps(s.peak_read_bytes_per_second) + "</td><td>" + jobs(s.jobs) + "</td></tr>";
    }).join("") || "<tr><td colspan='4' class='muted'>No GPU servers.</td></tr>";
    var names = snap.servers.map(function (s) { return s.hostname; });
    var need = snap.need_bytes_per_second[0] / 1e9;
    Plotly.react("chart-servers", [
      { x: names, y: snap.servers.map(function (s) { return s.peak_read_bytes_per_second / 1e9; }), name: "peak minute", type: "bar" },
      { x: names, y: snap.servers.map(function (s) { return s.average_read_bytes_per_second / 1e9; }), name: "average", type: "bar" },
      { x: names, y: names.map(function () { return need; }), name: "needed (10 GB/s)", type: "scatter", mode: "lines", line: { dash: "dash", color: "#e5534b" } },
    ], LAYOUT, CONFIG);
    stamp(snap.ts);
  }

  function load() {
    var mine = ++seq;
    return range.fetchJson(config.snapshot_url).then(function (snap) {
      if (snap && mine === seq) render(snap);
    });
  }

  function onDelta(msg) {
    if (msg.type !== "storage.delta" || range.isCustom() || (range.select.value && range.select.value !== range.fallback)) return;
    render({ ts: msg.ts, totals: msg.totals, mounts: msg.mounts, servers: msg.servers, need_bytes_per_second: [10e9, 20e9] });
  }

  var range = new window.GoodputRange({ onChange: load });
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
