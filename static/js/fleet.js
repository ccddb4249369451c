// Fleet dashboard at any fleet size: aggregates, one row per site and the worst GPUs over the
// `fleet` topic; one page of the GPU table, filtered, sorted and paged on the server, whose rows
// come over that page's own topic (`fleetview.<digest>`, named by the server in the snapshot);
// with a site chosen, its worst GPUs over `site.<id>`. The page never holds more than one table
// page of GPUs, however large the fleet.
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
  var tableSeq = 0;
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
  var TABLE_KEYS = ["site_id", "state", "q", "sort", "page", "size"];

  var siteOrder = [];   // site ids in trace order
  var siteNames = {};
  var rows = [];        // the table page on screen, nothing more
  var table = JSON.parse(document.getElementById("table-query").textContent);
  var view = { count: 0, pages: 1, total: null, topic: null, siteTopic: null };
  var lastTs = {};      // uuid -> sample time on screen, to flash rows that changed

  function el(id) { return document.getElementById(id); }
  function fmt(v, d) { return v === null || v === undefined ? "–" : (d === undefined ? v : Number(v).toFixed(d)); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }
  var TOTAL_DIGITS = { mean_util: 1, power_kw: 1, max_temp: 1 };

  // Pushes come every second and mostly change a few cells: a row is rebuilt only when its HTML
  // changed, and text only when it differs, so a push costs the browser little layout work.
  function setRows(tbody, html) {
    var have = tbody.rows;
    var before = tbody.__html;
    if (!before || have.length !== html.length) {
      tbody.innerHTML = html.join("");
    } else {
      html.forEach(function (row, i) {
        if (before[i] === row) return;
        // Same row, new figures: swap only the cells that changed (a push changes two or three).
        var scratch = document.createElement("tbody");
        scratch.innerHTML = row;
        var fresh = scratch.rows[0], old = have[i];
        if (!fresh || fresh.cells.length !== old.cells.length || fresh.cells[0].innerHTML !== old.cells[0].innerHTML) {
          old.outerHTML = row;
          return;
        }
        if (old.className !== fresh.className) old.className = fresh.className;
        for (var c = 0; c < fresh.cells.length; c++) {
          if (old.cells[c].innerHTML !== fresh.cells[c].innerHTML) {
            old.cells[c].innerHTML = fresh.cells[c].innerHTML;
            old.cells[c].className = fresh.cells[c].className;
          }
        }
      });
    }
    tbody.__html = html;
  }
  function setText(node, text) { if (node.textContent !== text) node.textContent = text; }

  function renderTotals(t) {
    document.querySelectorAll("[data-total]").forEach(function (node) {
      var key = node.dataset.total;
      setText(node, String(fmt(t[key], TOTAL_DIGITS[key])));
    });
    el("errors-stat").classList.toggle("bad", t.with_errors > 0);
    view.total = t.gpus;
    renderCount();
  }

  var STALE_MS = JSON.parse(el("stale-seconds").textContent) * 1000;
  function isStale(g) { return Date.now() - Date.parse(g.ts) > STALE_MS; }

  function gpuLink(g) {
    return "<a href='/fleet/gpus/" + encodeURIComponent(g.uuid) + "/'>" + esc(g.hostname) + "/gpu" + g.index + "</a>";
  }

  function renderWorst(worst) {
    var html = worst.map(function (g) {
      return "<tr class='" + (g.health === "failed" ? "row-bad" : "") + "'><td>" + gpuLink(g) + "</td><td>" + esc(g.site) +
        "</td><td>" + esc(g.health) + "</td><td class='num'>" + fmt(g.temp) + "</td><td class='num'>" + fmt(g.ecc_dbe) +
        "</td><td class='num'>" + fmt(g.xid) + "</td></tr>";
    });
    setRows(el("worst").querySelector("tbody"), html.length ? html : ["<tr><td colspan='6' class='muted'>No GPUs have reported.</td></tr>"]);
  }

  function renderSites(sites) {
    sites.forEach(function (s) { siteNames[s.id] = s.name; });
    var html = sites.map(function (s) {
      return "<tr data-site='" + s.id + "'><td><a href='?site_id=" + s.id + "' data-site-id='" + s.id + "'>" + esc(s.name) + "</a></td><td>" + esc(s.region) +
        "</td><td class='num'>" + s.gpus + "</td><td class='num'>" + s.reporting + "</td><td class='num'>" + s.healthy +
        "</td><td class='num'>" + s.degraded + "</td><td class='num" + (s.failed ? " bad-text" : "") + "'>" + s.failed +
        "</td><td class='num'>" + fmt(s.mean_util) + "</td><td class='num'>" + fmt(s.mean_temp) + "</td><td class='num'>" + fmt(s.max_temp) +
        "</td><td class='num'>" + fmt(s.power_kw, 1) + "</td></tr>";
    });
    setRows(el("site-table").querySelector("tbody"), html.length ? html : ["<tr><td colspan='11' class='muted'>No sites yet.</td></tr>"]);
    var select = el("gpu-site");
    var known = Array.prototype.map.call(select.options, function (o) { return o.value; }).join(",");
    var wanted = [""].concat(sites.map(function (s) { return String(s.id); })).join(",");
    if (known !== wanted) {  // a new site: rebuild the choices, keeping the one chosen
      select.innerHTML = "<option value=''>All sites</option>" + sites.map(function (s) {
        return "<option value='" + s.id + "'>" + esc(s.name) + "</option>";
      }).join("");
      select.value = table.filters.site_id || "";
    }
  }

  function renderCount() {
    setText(el("gpu-count"), view.count + " of " + (view.total === null ? "–" : view.total));
    setText(el("page-info"), "page " + table.page + " of " + view.pages);
    el("page-prev").setAttribute("aria-disabled", String(table.page <= 1));
    el("page-next").setAttribute("aria-disabled", String(table.page >= view.pages));
  }

  function renderTable() {
    var html = rows.map(function (g) {
      var changed = lastTs[g.uuid] !== undefined && lastTs[g.uuid] !== g.ts;
      var cls = (g.health === "failed" ? "row-bad " : "") + (isStale(g) ? "row-stale " : "") + (changed ? "flash" : "");
      return "<tr class='" + cls + "'><td><a href='/fleet/nodes/" + encodeURIComponent(g.hostname) + "/'>" + esc(g.hostname) + "</a></td>" +
        "<td><a href='/fleet/gpus/" + encodeURIComponent(g.uuid) + "/'>gpu" + g.index + "</a></td><td>" + esc(g.model) + "</td><td>" + esc(g.site) + "</td>" +
        "<td>" + esc(g.health) + "</td><td class='num'>" + fmt(g.util) + "</td><td class='num'>" + fmt(g.mem_used_pct) + "</td><td class='num'>" + fmt(g.temp) + "</td>" +
        "<td class='num'>" + fmt(g.mem_temp) + "</td><td class='num'>" + fmt(g.power_w, 0) + "</td><td class='num'>" + fmt(g.sm_clock, 0) + "</td>" +
        "<td class='num" + (g.xid > 0 ? " bad-text" : "") + "'>" + fmt(g.xid) + "</td><td class='num" + (g.ecc_dbe > 0 ? " bad-text" : "") + "'>" + fmt(g.ecc_dbe) + "</td>" +
        "<td>" + fmtTime(g.ts) + "</td></tr>";
    });
    setRows(el("gpu-table").querySelector("tbody"), html.length ? html : ["<tr class='empty'><td colspan='14' class='muted'>No GPUs match.</td></tr>"]);
    lastTs = {};
    rows.forEach(function (g) { lastTs[g.uuid] = g.ts; });
    document.querySelectorAll("#gpu-table th a[data-sort]").forEach(function (a) {
      a.classList.toggle("sorted", table.sort.replace(/^-/, "") === a.dataset.sort);
    });
    renderCount();
  }

  // A table page from the snapshot, the table API or a push: rows, count, and its topic.
  function showPage(page) {
    rows = page.gpus;
    view.count = page.count;
    view.pages = page.pages;
    table.page = page.page;
    renderTable();
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
    // One chart a task: each redraw is the browser's longest piece of work on this page, so the
    // three are not run back to back in one task. A snapshot drawn meanwhile drops the rest.
    var seq = snapshotSeq;
    CHARTS.forEach(function (chart, n) {
      var xs = siteOrder.map(function (id) { return bySite[id] && bySite[id].reporting ? [ts] : []; });
      var ys = siteOrder.map(function (id) { return bySite[id] && bySite[id].reporting ? [bySite[id][chart.siteKey]] : []; });
      setTimeout(function () {
        if (seq !== snapshotSeq || !chartsDrawn) return;
        Plotly.extendTraces(chart.id, { x: xs, y: ys }, indices, windowPoints);
      }, n * 16);
    });
  }

  function stamp(ts) { el("last-update").textContent = "updated " + fmtTime(ts); }

  // The table's query string (filters, sort, page, size), as the HTML view and the API read it.
  function tableQuery() {
    var params = new URLSearchParams();
    Object.keys(table.filters).forEach(function (k) { if (table.filters[k]) params.set(k, table.filters[k]); });
    if (table.sort !== "hostname") params.set("sort", table.sort);
    if (table.page !== 1) params.set("page", table.page);
    if (table.size !== 50) params.set("size", table.size);
    return params;
  }

  // Follow the page's topics: the fleet, this table page's view, the chosen site. The live client
  // subscribes to live.topics on every (re)connect; while open, the change is sent at once.
  function follow(viewTopic, siteTopic) {
    var wanted = ["fleet"];
    if (viewTopic) wanted.push(viewTopic);
    if (siteTopic) wanted.push(siteTopic);
    var before = live.topics;
    live.topics = wanted;
    view.topic = viewTopic;
    view.siteTopic = siteTopic;
    el("worst-scope").textContent = siteTopic ? "in " + (siteNames[table.filters.site_id] || "the site") : "in the fleet";
    var ws = live.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    var gone = before.filter(function (t) { return wanted.indexOf(t) < 0; });
    var added = wanted.filter(function (t) { return before.indexOf(t) < 0; });
    if (gone.length) ws.send(JSON.stringify({ action: "unsubscribe", topics: gone }));
    if (added.length) ws.send(JSON.stringify({ action: "subscribe", topics: added }));
  }

  function loadSnapshot() {
    var seq = ++snapshotSeq;
    chartsDrawn = false;
    var q = tableQuery().toString();
    return range.fetchJson("/api/v1/fleet/overview/" + (q ? "?" + q : ""))
      .then(function (snap) {
        if (seq !== snapshotSeq) return;  // a newer snapshot (another range, a reconnect) is on its way
        tableSeq++;  // and it supersedes any table read still on its way
        renderSites(snap.sites);
        renderTotals(snap.totals);
        renderWorst(snap.worst);
        showPage(Object.assign({ gpus: snap.gpus }, snap.table));
        follow(snap.table.topic, snap.topics.site);
        drawCharts(snap.series);
        stamp(snap.ts);
      });
  }

  // A filter, sort or page change: one table page over HTTP; the aggregates stay as they are.
  function loadTable() {
    var seq = ++tableSeq;
    var params = tableQuery();
    var text = params.toString();
    var url = new URLSearchParams(window.location.search);
    TABLE_KEYS.forEach(function (k) { url.delete(k); });
    params.forEach(function (v, k) { url.set(k, v); });
    var search = url.toString();
    window.history.replaceState(null, "", window.location.pathname + (search ? "?" + search : ""));
    return fetch("/api/v1/fleet/gpu-table/" + (text ? "?" + text : ""), { credentials: "same-origin" })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (seq !== tableSeq) return;
        var box = el("table-errors");
        if (!res.ok) {
          if (!box) { box = document.createElement("div"); box.id = "table-errors"; box.className = "form-errors"; el("gpu-form").after(box); }
          box.textContent = Object.keys(res.body).map(function (k) { return k + ": " + res.body[k]; }).join(" ");
          return;
        }
        if (box) box.remove();
        showPage(res.body);
        follow(res.body.topic, res.body.site_topic || null);
        if (res.body.worst) renderWorst(res.body.worst);
      })
      .catch(function (err) { console.error("table read failed", err); });
  }

  function onDelta(msg) {
    if (msg.type === "fleet.delta") {
      renderSites(msg.sites);
      renderTotals(msg.totals);
      if (!view.siteTopic) renderWorst(msg.worst);
      extendCharts(msg.ts, msg.sites);
      stamp(msg.ts);
    } else if (msg.type === "fleet.rows" && msg.topic === view.topic) {
      showPage(msg);  // the whole page: a sort by a live figure changes who is on it
    } else if (msg.type === "site.delta" && msg.topic === view.siteTopic) {
      renderWorst(msg.worst);
    }
  }

  var typing = null;
  function changeFilters() {
    table.filters = {};
    if (el("gpu-site").value) table.filters.site_id = el("gpu-site").value;
    if (el("gpu-state").value) table.filters.state = el("gpu-state").value;
    if (el("gpu-filter").value.trim()) table.filters.q = el("gpu-filter").value.trim();
    table.page = 1;
    loadTable();
  }
  el("gpu-site").addEventListener("change", changeFilters);
  el("gpu-state").addEventListener("change", changeFilters);
  el("gpu-filter").addEventListener("input", function () { clearTimeout(typing); typing = setTimeout(changeFilters, 250); });
  el("gpu-form").addEventListener("submit", function (e) { e.preventDefault(); changeFilters(); });
  el("page-size").addEventListener("change", function () { table.size = Number(el("page-size").value); table.page = 1; loadTable(); });
  ["page-prev", "page-next"].forEach(function (id) {
    el(id).addEventListener("click", function (e) {
      e.preventDefault();
      var next = table.page + Number(el(id).dataset.step);
      if (next < 1 || next > view.pages) return;
      table.page = next;
      loadTable();
    });
  });
  document.querySelectorAll("#gpu-table th a[data-sort]").forEach(function (a) {
    a.addEventListener("click", function (e) {
      e.preventDefault();
      var key = a.dataset.sort;
      // A figure sorts highest first on its first click; names A to Z.
      var numeric = ["hostname", "site", "model", "health"].indexOf(key) < 0;
      table.sort = table.sort === key ? "-" + key : table.sort === "-" + key ? key : (numeric ? "-" + key : key);
      table.page = 1;
      loadTable();
    });
  });
  el("site-table").addEventListener("click", function (e) {
    var link = e.target.closest("a[data-site-id]");
    if (!link) return;
    e.preventDefault();
    el("gpu-site").value = link.dataset.siteId;
    changeFilters();
  });

  // The charts' window: a preset or from / to, in the URL; a drag across a chart zooms to it.
  var range = new window.GoodputRange({ onChange: loadSnapshot });
  var live = new window.GoodputLive({ topics: ["fleet"], onMessage: onDelta, onSnapshot: loadSnapshot });
  window.goodputFleet = { rows: function () { return rows; }, live: live };
})();
