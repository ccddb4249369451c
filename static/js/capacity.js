// The capacity plan: supply (installed, energised, healthy) against reserved demand by tier over
// the next twelve months, from the plan the page was rendered with (the same as GET
// /api/v1/capacity/plan). Months in conflict are shaded. The pool selector redraws the chart for
// one pool; quota bars get their widths here, since the CSP allows no style attributes.
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("page-config").textContent);
  var plan = config.plan;
  var TIERS = {
    "reserved": { name: "Reserved", color: "#5aa9ff" },
    "on-demand": { name: "On-demand", color: "#a98bff" },
    "preemptible": { name: "Preemptible", color: "#f5b84b" },
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var phone = window.matchMedia("(max-width: 600px)");

  function layout(months, conflicts) {
    var shapes = [];
    conflicts.forEach(function (c, i) {
      if (!c) return;
      // A category axis places month i at i: shade from half a month before to half after.
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: i - 0.5, x1: i + 0.5, y0: 0, y1: 1,
                    fillcolor: "rgba(255, 92, 108, .16)", line: { width: 0 }, layer: "below" });
    });
    // One "conflict" label per run of months in conflict, centred on the run, and only where it
    // has room: on a phone a month is narrower than the word, and labels side by side would run
    // together ("conflictconflictconflict"); the shading marks every month either way.
    var runs = [];
    conflicts.forEach(function (c, i) {
      if (!c) return;
      var last = runs[runs.length - 1];
      if (last && last.end === i - 1) last.end = i; else runs.push({ start: i, end: i });
    });
    var monthPx = Math.max(1, (document.getElementById("chart-plan").clientWidth - 52) / Math.max(1, months.length));
    var labelPx = 48;  // "conflict" at 10 px
    var freeFrom = -Infinity;
    var annotations = [];
    runs.forEach(function (run) {
      var centre = (run.start + run.end) / 2;
      var left = (centre + 0.5) * monthPx - labelPx / 2;
      if (left < freeFrom) return;
      freeFrom = left + labelPx + 4;
      annotations.push({ x: centre, y: 1, xref: "x", yref: "paper", yanchor: "bottom", text: "conflict",
                         showarrow: false, font: { color: "#ff5c6c", size: 10 } });
    });
    return {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: "#8b96a5", size: 11 }, margin: { l: 44, r: 8, t: 18, b: phone.matches ? 40 : 28 },
      barmode: "stack", bargap: 0.35, shapes: shapes, annotations: annotations,
      xaxis: { type: "category", gridcolor: "#2a323d", tickangle: phone.matches ? -45 : 0 },
      yaxis: { gridcolor: "#2a323d", rangemode: "tozero", title: { text: "GPUs" } },
      legend: { orientation: "h", x: 0, y: phone.matches ? -0.26 : -0.14, yanchor: "top", font: { size: 11 } },
      hovermode: "x unified",
    };
  }

  function series(rows) {
    var months = rows.map(function (r) { return r.month; });
    var traces = Object.keys(TIERS).map(function (tier) {
      return { type: "bar", name: TIERS[tier].name, x: months, marker: { color: TIERS[tier].color },
               y: rows.map(function (r) { return r.reserved[tier]; }), hovertemplate: "%{y}" };
    });
    traces.push({ type: "scatter", mode: "lines", name: "Installed", x: months, line: { shape: "hv", color: "#8b96a5", dash: "dash", width: 1.5 },
                  y: rows.map(function (r) { return r.installed; }) });
    traces.push({ type: "scatter", mode: "lines+markers", name: "Energised", x: months, line: { shape: "hv", color: "#3ecf8e", width: 2.5 },
                  marker: { size: 5 }, y: rows.map(function (r) { return r.energised; }) });
    traces.push({ type: "scatter", mode: "markers", name: "Healthy (today)", x: months, marker: { symbol: "diamond", size: 11, color: "#e3e8ee" },
                  y: rows.map(function (r) { return r.healthy; }) });
    return { months: months, traces: traces, conflicts: rows.map(function (r) { return r.conflict; }) };
  }

  function draw() {
    var chosen = document.getElementById("plan-pool").value;
    var pool = plan.pools.find(function (p) { return String(p.id) === chosen; });
    var s = series(pool ? pool.months : plan.total);
    Plotly.react("chart-plan", s.traces, layout(s.months, s.conflicts), CONFIG);
  }

  function quotaBars() {
    document.querySelectorAll(".quota-bar").forEach(function (bar) {
      bar.querySelector("i").style.width = Math.min(100, Number(bar.dataset.pct)) + "%";
      bar.querySelector("b").style.left = Math.min(100, Number(bar.dataset.mark)) + "%";
    });
  }

  document.getElementById("plan-pool").addEventListener("change", draw);
  phone.addEventListener("change", draw);
  quotaBars();
  draw();
})();
