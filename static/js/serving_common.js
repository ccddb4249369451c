// What the serving pages share: formatting, the latency charts' SLO line, the SLO / burn-rate
// table, and merging live minute points into a Plotly chart (the minute still filling at the
// previous push is replaced in place, newer minutes are appended with extendTraces).
(function () {
  "use strict";

  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 48, r: 10, t: 10, b: 30 },
    xaxis: { gridcolor: "#2a323d", type: "date" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero" },
    legend: { orientation: "h", y: -0.2 }, showlegend: true,
  };
  var CONFIG = { displayModeBar: false, responsive: true };
  var SLO_COLOR = "#ff5c6c";
  var VERDICTS = { meeting: "meeting SLOs", missing: "missing SLOs", no_data: "no traffic" };

  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function fmt(v, d) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US", { minimumFractionDigits: d || 0, maximumFractionDigits: d || 0 }); }
  // Latency in ms: whole milliseconds from 10 ms up, one decimal below.
  function ms(v) { return v === null || v === undefined ? "–" : fmt(v, Math.abs(v) < 10 ? 1 : 0); }
  function pct(fraction, d) { return fraction === null || fraction === undefined ? "–" : (100 * fraction).toFixed(d === undefined ? 1 : d); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }
  function fmtStamp(ts) { return ts ? new Date(ts).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "–"; }
  function layout() { return JSON.parse(JSON.stringify(LAYOUT)); }

  function sloShape(thresholdMs) {
    return { type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: thresholdMs, y1: thresholdMs,
             line: { color: SLO_COLOR, width: 1.5, dash: "dash" } };
  }
  function sloAnnotation(thresholdMs) {
    return { xref: "paper", x: 0, yref: "y", y: thresholdMs, text: "SLO " + ms(thresholdMs) + " ms", showarrow: false,
             xanchor: "left", yanchor: "bottom", font: { color: SLO_COLOR, size: 10 } };
  }

  // The traces of a chart from snapshot columns: specs [{key, name, color, scale, yaxis, dash}].
  function traces(cols, specs) {
    return specs.map(function (s) {
      var y = cols[s.key].map(function (v) { return v === null || v === undefined ? null : v * (s.scale || 1); });
      var t = { x: cols.t.slice(), y: y, name: s.name, mode: "lines", connectgaps: false,
                line: { width: s.width || 2, color: s.color, dash: s.dash || "solid" } };
      if (s.yaxis) t.yaxis = s.yaxis;
      return t;
    });
  }

  // Merge live columns into a drawn chart whose traces follow `specs` (same order). Returns the
  // number of points appended.
  function merge(gd, cols, specs, maxPoints) {
    if (!gd || !gd.data || !cols.t.length) return 0;
    var xs = gd.data[0].x;
    var last = xs.length ? xs[xs.length - 1] : null;
    var replaced = false;
    var start = 0;
    for (var i = 0; i < cols.t.length; i++) {
      var t = cols.t[i];
      if (last !== null && t <= last) {
        var at = xs.lastIndexOf(t);
        if (at >= 0) {
          specs.forEach(function (s, j) {
            var v = cols[s.key][i];
            gd.data[j].y[at] = v === null || v === undefined ? null : v * (s.scale || 1);
          });
          replaced = true;
        }
        start = i + 1;
      }
    }
    var fresh = cols.t.slice(start);
    if (fresh.length) {
      var update = { x: [], y: [] };
      specs.forEach(function (s) {
        update.x.push(fresh.slice());
        update.y.push(cols[s.key].slice(start).map(function (v) { return v === null || v === undefined ? null : v * (s.scale || 1); }));
      });
      Plotly.extendTraces(gd, update, specs.map(function (_, j) { return j; }), maxPoints);
    } else if (replaced) {
      Plotly.redraw(gd);
    }
    return fresh.length;
  }

  function burnCell(row, w) {
    var burn = row.burn[w];
    var hot = row.alerting_windows.indexOf(w) >= 0;
    var cls = "num" + (hot ? " burn-hot" : burn !== null && burn > 1 ? " burn-warm" : "");
    return "<td class='" + cls + "' data-window='" + w + "'>" + (burn === null ? "–" : fmt(burn, burn < 10 ? 2 : 1) + "×") + "</td>";
  }

  function sloTarget(row) {
    return fmt(row.target_pct, 2).replace(/\.?0+$/, "") + " %" + (row.threshold_ms === null ? "" : " ≤ " + ms(row.threshold_ms) + " ms");
  }

  // The SLO table: target, SLI and budget left over the SLO window, burn rate per window.
  function sloTable(rows, windows) {
    var head = "<thead><tr><th>SLO</th><th>Target</th><th class='num'>SLI</th><th class='num'>Budget left</th>" +
      windows.map(function (w) { return "<th class='num'>" + esc(w) + "</th>"; }).join("") + "<th>Alerts</th></tr></thead>";
    var body = rows.map(function (r) {
      var budgetCls = r.budget_left === null ? "" : r.budget_left < 0 ? " bad-text" : r.budget_left < 0.25 ? " warn-text" : "";
      var alerts = r.alerts.map(function (a) {
        return "<span class='alert-chip alert-" + esc(a.severity) + "' title='" + esc(a.long_window + " " + fmt(a.long_burn, 1) + "×, " + a.short_window + " " + fmt(a.short_burn, 1) + "×") + "'>" +
          esc(a.severity) + " " + esc(a.factor) + "×</span>";
      }).join(" ") || "<span class='muted'>none</span>";
      return "<tr data-slo='" + esc(r.slo) + "' class='" + (r.alerts.length ? "row-bad" : "") + "'><td title='" + esc(r.label) + "'>" + esc(r.short) + (r.interpolated ? " <span class='muted' title='threshold between bucket bounds: interpolated'>≈</span>" : "") + "</td>" +
        "<td>" + sloTarget(r) + "</td>" +
        "<td class='num'>" + (r.sli === null ? "–" : pct(r.sli, 2) + " %") + "</td>" +
        "<td class='num" + budgetCls + "' data-col='budget'>" + (r.budget_left === null ? "–" : pct(r.budget_left) + " %") + "</td>" +
        windows.map(function (w) { return burnCell(r, w); }).join("") + "<td>" + alerts + "</td></tr>";
    }).join("");
    return head + "<tbody>" + body + "</tbody>";
  }

  function interpolationNote(rows) {
    var names = rows.filter(function (r) { return r.interpolated; }).map(function (r) { return r.label; });
    if (!names.length) return "";
    return "≈ " + names.join(" and ") + ": the threshold falls between two histogram bucket bounds, so the count of " +
      "requests within it is interpolated inside the bucket (an estimate, as histogram_quantile's percentiles are).";
  }

  // A length of time as people say it: "90 s", "42 min", "3 h 5 min", "2 d 4 h".
  function span(seconds) {
    var s = Math.max(0, Math.round(seconds));
    if (s < 120) return s + " s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + " min";
    var h = Math.floor(m / 60), d = Math.floor(h / 24);
    if (d < 1) return h + " h" + (m % 60 ? " " + (m % 60) + " min" : "");
    return d + " d" + (h % 24 ? " " + (h % 24) + " h" : "");
  }

  // What the SLO window's figures rest on, when it is less than the window: "the 30-day budget
  // and SLIs rest on 3 h 5 min of data (since ...)". Empty when the data covers the window.
  function coverageNote(c) {
    if (!c || c.complete) return "";
    if (!c.since) return "No data in the " + c.period_days + "-day SLO window yet.";
    return "Budget left and SLIs are over " + span(c.seconds) + " of data (since " + fmtStamp(c.since) + "), not yet the whole " +
      c.period_days + "-day SLO window; burn-rate alerts count once the data spans their short window.";
  }

  function setVerdict(el, verdict) {
    el.className = "slo-verdict verdict-" + verdict;
    el.textContent = VERDICTS[verdict] || verdict;
  }

  window.GoodputServing = {
    CONFIG: CONFIG, esc: esc, fmt: fmt, ms: ms, pct: pct, fmtTime: fmtTime, fmtStamp: fmtStamp, layout: layout,
    sloShape: sloShape, sloAnnotation: sloAnnotation, traces: traces, merge: merge, sloTable: sloTable,
    interpolationNote: interpolationNote, setVerdict: setVerdict, span: span, coverageNote: coverageNote,
  };
})();
