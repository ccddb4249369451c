// Cost: the snapshot over HTTP for the page's range (losses in money by kind, month, team, pool,
// cause and job; serving's cost per million tokens; each pool's own-or-rent), then the `cost`
// topic's deltas over the websocket for the default range. A custom or other range stays put.
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("page-config").textContent);
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 60, r: 8, t: 8, b: 40 },
    xaxis: { gridcolor: "#2a323d", type: "category" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero" },
    legend: { orientation: "h" }, barmode: "stack",
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var seq = 0;

  function el(id) { return document.getElementById(id); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function num(v, d) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en", { maximumFractionDigits: d === undefined ? 1 : d }); }
  function rows(id, list, cols, empty) {
    el(id).querySelector("tbody").innerHTML = list.map(function (r) { return "<tr>" + cols(r) + "</tr>"; }).join("") ||
      "<tr><td colspan='6' class='muted'>" + empty + "</td></tr>";
  }

  function render(snap) {
    var cur = " " + snap.currency;
    el("cost-empty").hidden = snap.has_prices;
    el("cost-total").textContent = snap.total + cur;
    el("cost-hours").textContent = num(snap.gpu_hours) + " GPU-h" + (snap.unpriced_gpu_hours ? ", " + num(snap.unpriced_gpu_hours) + " without a price" : "");
    ["training", "idle", "reserved", "incident"].forEach(function (k) {
      var row = snap.by_kind.filter(function (r) { return r.kind === k; })[0];
      el("cost-kind-" + k).textContent = row ? row.amount + cur : "0.00" + cur;
    });
    var money = function (r) { return "<td class='num'>" + num(r.gpu_hours) + "</td><td class='num'>" + esc(r.amount) + cur + "</td>"; };
    rows("cost-teams", snap.by_team, function (r) { return "<td>" + esc(r.team) + "</td>" + money(r); }, "Nothing lost.");
    rows("cost-pools", snap.by_pool, function (r) { return "<td>" + esc(r.site ? r.site + "/" + r.pool : r.pool) + "</td>" + money(r); }, "Nothing lost.");
    rows("cost-causes", snap.by_cause, function (r) { return "<td>" + esc(r.kind) + "</td><td>" + esc(r.label) + "</td>" + money(r); }, "Nothing lost.");
    rows("cost-jobs", snap.top_jobs, function (r) { return "<td><a href='/training/jobs/" + r.job_id + "/'>" + esc(r.name || r.job_id) + "</a></td>" + money(r); }, "No badput.");
    rows("cost-serving", snap.serving, function (r) {
      var w = function (name) { var x = r.windows[name]; return "<td class='num'>" + (x.per_million_tokens === null ? "<span class='muted'>–</span>" : esc(x.per_million_tokens) + cur + "<div class='muted small'>" + num(x.tokens / 1e6, 2) + " M tokens</div>") + "</td>"; };
      return "<td><a href='/serving/endpoints/" + r.id + "/'>" + esc(r.site + "/" + r.name) + "</a></td><td class='num'>" + r.gpus + "</td>" + w("1h") + w("24h") + w("30d");
    }, "No endpoints.");
    rows("cost-own", snap.own_or_rent, function (r) {
      return "<td>" + esc(r.site + "/" + r.pool) + "</td><td class='num'>" + esc(r.hourly) + " " + esc(r.currency) + "</td><td class='small muted'>" +
        r.derivation.map(esc).join("<br>") + "</td><td class='num'>" + (r.break_even_pct === null ? "–" : r.break_even_pct + " %") + "</td><td>" +
        (r.periods.length ? r.periods.map(function (p) { return p.days + " d: " + esc(p.sentence); }).join("<br>") : "<span class='muted'>" + (r.mode === "rate" ? "rented" : "no cloud rate or use yet") + "</span>") + "</td>";
    }, "No prices.");
    var months = snap.by_month.map(function (m) { return m.month; });
    Plotly.react("chart-months", [{ x: months, y: snap.by_month.map(function (m) { return Number(m.amount); }), type: "bar", name: snap.currency }], LAYOUT, CONFIG);
    var q = range.query();
    el("cost-csv").href = config.csv_url + (q ? "?" + q : "");
    el("last-update").textContent = "updated " + new Date(snap.ts).toISOString().slice(11, 19) + " UTC";
  }

  function load() {
    var mine = ++seq;
    return range.fetchJson(config.snapshot_url).then(function (snap) {
      if (snap && mine === seq) render(snap);
    });
  }

  function onDelta(msg) {
    if (msg.type !== "cost.delta" || range.isCustom() || (range.select.value && range.select.value !== range.fallback)) return;
    msg.window = null;
    render(msg);
  }

  var range = new window.GoodputRange({ onChange: load });
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
