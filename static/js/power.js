// Power: the snapshot over HTTP (per site its draw against contracted power, racks against their
// budgets, the last hour's per-minute draw), then the `power` topic's deltas over the websocket:
// the sites and racks whose figures changed, and each site's newest minute points (the minute
// still filling is replaced in place, a new one appended).
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("page-config").textContent);
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 44, r: 8, t: 8, b: 28 },
    xaxis: { gridcolor: "#2a323d", type: "date" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero", title: { text: "kW" } },
    showlegend: false,
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var WINDOW_POINTS = 64;
  var seq = 0;
  var drawn = false;
  var pending = [];
  var cards = new Map();  // site id -> {el, site}

  function el(id) { return document.getElementById(id); }
  function field(card, name) { return card.querySelector("[data-field='" + name + "']"); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function kw(v, d) { return v === null || v === undefined ? "–" : Number(v).toFixed(d === undefined ? 1 : d) + " kW"; }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }
  function level(pct) { return pct === null ? "" : pct > 100 ? "over" : pct >= 95 ? "near" : pct >= 80 ? "warm" : "ok"; }

  // A bar's width is set through the CSSOM (allowed by the CSP), never a style attribute in HTML.
  function setBar(bar, pct) {
    var fill = bar.querySelector("i");
    fill.style.width = (pct === null ? 0 : Math.min(100, Math.max(0, pct))) + "%";
    bar.dataset.level = level(pct);
    bar.title = pct === null ? "no budget" : pct.toFixed(1) + " %";
  }

  function rackRow(r) {
    var tr = document.createElement("tr");
    tr.dataset.rack = r.id;
    tr.className = r.utilisation_pct !== null && r.utilisation_pct > 100 ? "row-bad" : "";
    tr.innerHTML = "<td>" + esc(r.name) + "</td><td class='num' data-col='draw'>" + kw(r.draw_kw) + "</td><td class='num'>" +
      kw(r.budget_kw) + "</td><td class='bar-col'><div class='bar power-bar'><i></i></div><span class='small muted' data-col='pct'>" +
      (r.utilisation_pct === null ? "–" : r.utilisation_pct.toFixed(0) + " %") + "</span></td><td class='num'>" + kw(r.headroom_kw) +
      "</td><td class='num'>" + r.idle_gpus + "</td><td class='num' data-col='beyond-budget'>" + r.beyond_budget_gpus + " <span class='muted small'>of " + r.gpus +
      "</span></td><td class='num'>" + Number(r.energy_kwh_24h).toFixed(0) + " / " + Number(r.energy_kwh_7d).toFixed(0) + " kWh</td>";
    setBar(tr.querySelector(".bar"), r.utilisation_pct);
    return tr;
  }

  function renderSite(card, s, racks) {
    field(card, "name").textContent = s.name;
    field(card, "region").textContent = s.region || "";
    field(card, "draw").textContent = kw(s.draw_kw);
    field(card, "draw-parts").textContent = "GPUs " + kw(s.gpu_draw_kw) + " + node overhead " + kw(s.node_overhead_kw) + " (assumed)";
    field(card, "contracted").textContent = kw(s.contracted_kw, 0);
    field(card, "headroom").textContent = kw(s.headroom_kw);
    field(card, "headroom").classList.toggle("bad-text", s.headroom_kw !== null && s.headroom_kw < 0);
    field(card, "idle").textContent = s.idle_gpus + " of " + s.reporting;
    field(card, "headroom-limit").textContent = s.headroom_limited_by === "racks" ? "what the rack budgets allow" :
      s.headroom_limited_by === "contract" ? "contracted less draw" : "";
    field(card, "beyond-budget").textContent = s.beyond_budget_gpus + " of " + s.gpus;
    field(card, "energy").textContent = "GPU energy: " + Number(s.energy_kwh_24h).toFixed(0) + " kWh in 24 h · " + Number(s.energy_kwh_7d).toFixed(0) + " kWh in 7 d";
    setBar(field(card, "bar"), s.utilisation_pct);
    var body = field(card, "racks");
    racks.forEach(function (r) {
      var row = rackRow(r);
      var old = body.querySelector("tr[data-rack='" + r.id + "']");
      if (old) body.replaceChild(row, old); else body.appendChild(row);
    });
  }

  function contractShape(s) {
    if (s.contracted_kw === null) return [];
    return [{ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: s.contracted_kw, y1: s.contracted_kw,
              line: { color: "#ff5c6c", width: 1.5, dash: "dash" } }];
  }

  // The chart shows the last hour, whatever it holds (a fresh site has a point or two).
  function hourEnding(ts) {
    var end = new Date(ts).getTime() + 60000;
    return [new Date(end - 3660000).toISOString(), new Date(end).toISOString()];
  }

  function drawChart(card, s, series, ts) {
    var layout = JSON.parse(JSON.stringify(LAYOUT));
    layout.xaxis.range = hourEnding(ts);
    layout.shapes = contractShape(s);
    if (s.contracted_kw !== null) {
      layout.annotations = [{ xref: "paper", x: 0, yref: "y", y: s.contracted_kw, text: "contracted " + kw(s.contracted_kw, 0),
                              showarrow: false, xanchor: "left", yanchor: "bottom", font: { color: "#ff5c6c", size: 10 } }];
    }
    var cols = series || { ts: [], draw_kw: [] };
    var trace = { x: cols.ts.slice(), y: cols.draw_kw.slice(), name: "draw, GPUs + assumed node overhead", mode: "lines+markers", marker: { size: 3 },
                  line: { width: 2, color: "#5aa9ff" } };
    Plotly.react(card.querySelector("[data-chart='draw']"), [trace], layout, CONFIG);
  }

  // Newest minute points into a drawn chart: a minute already there is replaced, a newer one appended.
  function mergePoints(gd, cols, ts) {
    if (!gd.data || !gd.data.length) return;
    gd.layout.xaxis.range = hourEnding(ts);
    var x = gd.data[0].x, y = gd.data[0].y, add = { x: [], y: [] };
    cols.ts.forEach(function (t, i) {
      var at = x.indexOf(t);
      if (at >= 0) { y[at] = cols.draw_kw[i]; }
      else if (!x.length || new Date(t) > new Date(x[x.length - 1])) { add.x.push(t); add.y.push(cols.draw_kw[i]); }
    });
    if (add.x.length) Plotly.extendTraces(gd, { x: [add.x], y: [add.y] }, [0], WINDOW_POINTS);
    else Plotly.redraw(gd);
  }

  function newCard(s) {
    var card = el("power-site").content.firstElementChild.cloneNode(true);
    card.dataset.site = s.id;
    card.querySelector("[data-chart='draw']").id = "power-chart-" + s.id;
    return card;
  }

  function load() {
    var mine = ++seq;
    drawn = false;
    pending = [];
    return fetch(config.snapshot_url, { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("snapshot " + r.status); return r.json(); })
      .then(function (snap) {
        if (mine !== seq) return;
        var list = el("power-sites");
        var keep = new Set();
        snap.sites.forEach(function (s) {
          keep.add(s.id);
          var entry = cards.get(s.id);
          if (!entry) { entry = { el: newCard(s) }; cards.set(s.id, entry); }
          list.appendChild(entry.el);
          entry.site = s;
          field(entry.el, "racks").innerHTML = "";
          renderSite(entry.el, s, s.racks);
          drawChart(entry.el, s, snap.series.sites[String(s.id)], snap.ts);
        });
        cards.forEach(function (entry, id) { if (!keep.has(id)) { entry.el.remove(); cards.delete(id); } });
        drawn = true;
        el("last-update").textContent = "updated " + fmtTime(snap.ts);
        var held = pending;
        pending = [];
        held.forEach(onDelta);
      });
  }

  function onDelta(msg) {
    if (msg.type !== "power.delta") return;
    if (!drawn) {
      pending.push(msg);
      if (pending.length > 20) pending.shift();
      return;
    }
    for (var i = 0; i < msg.sites.length; i++) {
      if (!cards.has(msg.sites[i].id)) { load(); return; }  // a new site: re-read the page
    }
    msg.sites.forEach(function (s) {
      var entry = cards.get(s.id);
      entry.site = s;
      renderSite(entry.el, s, s.racks);
    });
    Object.keys(msg.points || {}).forEach(function (sid) {
      var entry = cards.get(Number(sid));
      if (entry) mergePoints(entry.el.querySelector("[data-chart='draw']"), msg.points[sid], msg.ts);
    });
    el("last-update").textContent = "updated " + fmtTime(msg.ts);
  }

  window.goodputPower = { cards: cards, reload: load };
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
