// An endpoint's page: the snapshot over HTTP for the chosen range (TTFT and ITL p50 / p99 against
// the SLO line with change events and evals marked, throughput, queue, KV-cache usage, the
// prompt-length distribution against its 7-day baseline, the SLO and burn-rate table, the figures
// since each server started), then the `endpoint.<id>` topic's deltas: new or changed minute
// points (extendTraces; the minute still filling is replaced) and the SLO figures. Ranges drawn
// a point a minute (1 h, 6 h) take the points as they come; wider ones re-read their snapshot
// once a new step has begun.
(function () {
  "use strict";

  var S = window.GoodputServing;
  var config = JSON.parse(document.getElementById("page-config").textContent);
  var MINUTE_MS = 60000;
  var CHARTS = {
    "chart-ttft": [{ key: "ttft_p50", name: "p50", color: "#5aa9ff" }, { key: "ttft_p99", name: "p99", color: "#f5b84b" }],
    "chart-itl": [{ key: "itl_p50", name: "p50", color: "#3ecf8e" }, { key: "itl_p99", name: "p99", color: "#c38bff" }],
    "chart-throughput": [{ key: "rps", name: "requests/s", color: "#5aa9ff" },
                         { key: "tokens_per_s", name: "tokens/s", color: "#c38bff", yaxis: "y2", width: 1.5 }],
    "chart-queue": [{ key: "waiting", name: "waiting", color: "#ff5c6c" }, { key: "running", name: "running", color: "#3ecf8e" }],
    "chart-kv": [{ key: "kv_cache_usage", name: "mean", color: "#f5b84b", scale: 100 },
                 { key: "kv_cache_usage_max", name: "max", color: "#ff7eb6", scale: 100, width: 1, dash: "dot" }],
  };
  // Triton's mean times per successful request (the page has the chart only for Triton endpoints).
  if (document.getElementById("chart-duration")) {
    CHARTS["chart-duration"] = [{ key: "request_mean_ms", name: "request", color: "#5aa9ff" },
                                { key: "queue_mean_ms", name: "queue", color: "#ff5c6c" },
                                { key: "compute_mean_ms", name: "compute", color: "#3ecf8e" }];
  }
  var FAILURE_REASONS = { REJECTED: "rejected", CANCELED: "canceled (client; not counted against availability)", BACKEND: "backend",
                          OTHER: "other", UNSPECIFIED: "no reason label" };
  var CHANGE_COLOR = "#5aa9ff";
  var EVAL_COLOR = "#3ecf8e";

  var seq = 0;
  var drawn = false;
  var pending = [];
  var snapshot = null;
  var thresholdsDrawn = "";
  var reloadTimer = null;

  function el(id) { return document.getElementById(id); }
  function setStat(key, text) {
    document.querySelectorAll("[data-stat='" + key + "']").forEach(function (n) { n.textContent = text; });
  }

  // --- figures -----------------------------------------------------------------------------------
  function renderSummary(s) {
    var n = s.now;
    var byKey = {};
    s.slos.forEach(function (r) { byKey[r.slo] = r; });
    setStat("ttft_p50", S.ms(n.ttft_p50));
    setStat("ttft_p99", S.ms(n.ttft_p99));
    setStat("itl_p50", S.ms(n.itl_p50));
    setStat("itl_p99", S.ms(n.itl_p99));
    setStat("ttft_threshold", S.ms(byKey.ttft.threshold_ms));
    setStat("itl_threshold", S.ms(byKey.itl.threshold_ms));
    document.querySelector("[data-stat-box='ttft']").classList.toggle("bad", n.ttft_p99 !== null && n.ttft_p99 > byKey.ttft.threshold_ms);
    document.querySelector("[data-stat-box='itl']").classList.toggle("bad", n.itl_p99 !== null && n.itl_p99 > byKey.itl.threshold_ms);
    setStat("budget", S.pct(s.worst_budget_left));
    var covers = S.coverageNote(s.coverage);
    el("coverage-note").textContent = covers;
    el("coverage-note").hidden = !covers;
    setStat("coverage_short", s.coverage && !s.coverage.complete && s.coverage.since ? " · over " + S.span(s.coverage.seconds) + " of data" : "");
    setStat("requests_5m", S.fmt(n.requests_5m));
    setStat("alerts", s.alerts.length ? s.alerts.map(function (a) { return a.label + ": " + a.severity + " " + a.factor + "×"; }).join("; ") : "no burn-rate alert firing");
    el("budget-stat").classList.toggle("bad", s.verdict === "missing");
    setStat("rps", S.fmt(n.rps, 2));
    setStat("tokens_per_s", S.fmt(n.tokens_per_s));
    setStat("waiting", S.fmt(n.waiting, n.waiting !== null && n.waiting < 10 ? 1 : 0));
    setStat("running", S.fmt(n.running, n.running !== null && n.running < 10 ? 1 : 0));
    setStat("kv", S.pct(n.kv_cache_usage));
    el("queue-stat").classList.toggle("warn", n.kv_cache_usage !== null && n.kv_cache_usage >= 0.9);
    S.setVerdict(el("verdict"), s.verdict);
    el("slo-table").innerHTML = S.sloTable(s.slos, snapshot ? snapshot.burn_windows : []);
    var note = S.interpolationNote(s.slos);
    el("slo-note").textContent = note;
    el("slo-note").hidden = !note;
  }

  function failureText(byReason) {
    var parts = Object.keys(byReason || {}).filter(function (r) { return byReason[r]; }).map(function (r) {
      return S.fmt(byReason[r]) + " " + (FAILURE_REASONS[r] || r.toLowerCase());
    });
    return parts.length ? parts.join(" · ") : "none";
  }

  // Triton: mean request, queue and compute time per successful request, over the last 5 minutes
  // and over the range, and the failures by reason over the range.
  function renderTriton(now, range, rangeKey) {
    var table = el("triton-table");
    if (!table) return;
    var row = function (label, key) {
      return "<tr><td>" + label + "</td><td class='num' data-col='" + key + "-5m'>" + S.ms(now[key]) + " ms</td><td class='num' data-col='" + key + "-range'>" +
        (range ? S.ms(range[key]) : "–") + " ms</td></tr>";
    };
    table.innerHTML = "<thead><tr><th></th><th class='num'>last 5 min</th><th class='num'>" + S.esc(rangeKey) + "</th></tr></thead><tbody>" +
      row("Request", "request_mean_ms") + row("Queue", "queue_mean_ms") + row("Compute", "compute_mean_ms") +
      (range ? "<tr><td>Successful requests</td><td></td><td class='num'>" + S.fmt(range.successes) + "</td></tr>" +
        "<tr><td>Failures by reason</td><td></td><td class='num' data-col='failures'>" + failureText(range.failures_by_reason) + "</td></tr>" : "") +
      "</tbody>";
  }

  function renderSinceStart(since) {
    var table = el("since-table");
    if (!since) {
      table.innerHTML = "<tbody><tr><td class='muted'>No scrape in the last ten minutes.</td></tr></tbody>";
      el("since-note").textContent = "";
      return;
    }
    el("since-note").textContent = "from the latest scrape's cumulative counts, " + S.fmtStamp(since.as_of);
    var rows = [["Time to first token", since.ttft], ["Inter-token latency", since.itl], ["End-to-end latency", since.e2e]];
    var req = since.requests;
    table.innerHTML = "<thead><tr><th></th><th class='num'>p50</th><th class='num'>p90</th><th class='num'>p99</th><th class='num'>observations</th></tr></thead><tbody>" +
      rows.map(function (r) {
        return "<tr><td>" + r[0] + "</td><td class='num'>" + S.ms(r[1].p50) + " ms</td><td class='num'>" + S.ms(r[1].p90) + " ms</td>" +
          "<td class='num'>" + S.ms(r[1].p99) + " ms</td><td class='num'>" + S.fmt(r[1].count) + "</td></tr>";
      }).join("") +
      "<tr><td>Requests</td><td colspan='4' class='num'>" + S.fmt(req.requests_ok) + " ok · " + S.fmt(req.requests_failed) + " failed · " +
      S.fmt(req.requests_aborted) + " aborted</td></tr>" +
      (Object.keys(since.failures_by_reason || {}).length ? "<tr><td>Failures by reason</td><td colspan='4' class='num'>" + failureText(since.failures_by_reason) + "</td></tr>" : "") +
      "</tbody>";
  }

  function changeText(c) {
    var parts = [c.label];
    if (c.from_value || c.to_value) parts.push((c.from_value || "?") + " → " + (c.to_value || "?"));
    if (c.model_version) parts.push("model " + c.model_version);
    if (c.load_to_ready_s !== null) parts.push("ready after " + S.fmt(c.load_to_ready_s) + " s");
    return parts.join(" · ");
  }
  function evalText(e) { return e.suite + " / " + e.metric + " = " + S.fmt(e.score, 3) + (e.model_version ? " (model " + e.model_version + ")" : ""); }

  function renderMarkers(snap) {
    var items = snap.changes.map(function (c) { return { ts: c.ts, cls: "ev-change", who: "Change", text: changeText(c) + (c.note ? " · " + c.note : "") }; })
      .concat(snap.evals.map(function (e) { return { ts: e.ts, cls: "ev-eval", who: "Eval", text: evalText(e) }; }));
    items.sort(function (a, b) { return a.ts < b.ts ? 1 : -1; });
    el("markers-list").innerHTML = items.map(function (i) {
      return "<li class='" + i.cls + "'><span class='tl-time'>" + S.fmtStamp(i.ts) + "</span> <span class='tl-actor'>" + i.who + "</span> <span class='tl-text'>" + S.esc(i.text) + "</span></li>";
    }).join("") || "<li class='muted'>No change events or evals in this range. Send them to <code>/api/v1/serving/endpoints/" + config.endpoint_id + "/changes</code> and <code>/evals</code>.</li>";
  }

  // --- charts ------------------------------------------------------------------------------------
  // Labels are about 6 px a character at the charts' 10 px font; the plot is the chart less its margins.
  var LABEL_PX_PER_CHAR = 6;
  function plotWidth() {
    var widths = Object.keys(CHARTS).map(function (id) { return el(id).clientWidth; }).filter(Boolean);
    return Math.max(120, (widths.length ? Math.min.apply(null, widths) : 600) - 60);
  }

  // Markers close enough for their labels to collide share one label ("3 evals"), its hover
  // text listing each: at any range, however many evals a nightly run posts at once.
  function labelGroups(items, text, plural, snap) {
    var since = Date.parse(snap.since), span = Math.max(1, Date.parse(snap.until) - since), px = plotWidth();
    var groups = [];
    items.slice().sort(function (a, b) { return Date.parse(a.ts) - Date.parse(b.ts); }).forEach(function (item) {
      var at = (Date.parse(item.ts) - since) / span * px;
      var last = groups[groups.length - 1];
      if (last && at < last.at + last.width + 6) {
        last.items.push(item);
        last.width = Math.max(last.width, (String(last.items.length).length + plural.length + 1) * LABEL_PX_PER_CHAR);
      } else {
        groups.push({ at: at, items: [item], width: text(item).length * LABEL_PX_PER_CHAR });
      }
    });
    return groups;
  }

  function markerShapes(snap) {
    var shapes = snap.changes.map(function (c) {
      return { type: "line", xref: "x", yref: "paper", x0: c.ts, x1: c.ts, y0: 0, y1: 1, line: { color: CHANGE_COLOR, width: 1.5, dash: "dash" } };
    }).concat(snap.evals.map(function (e) {
      return { type: "line", xref: "x", yref: "paper", x0: e.ts, x1: e.ts, y0: 0, y1: 1, line: { color: EVAL_COLOR, width: 1, dash: "dot" } };
    }));
    function note(group, y, yanchor, color, text, plural, hover) {
      var first = group.items[0];
      return { xref: "x", yref: "paper", x: first.ts, y: y, showarrow: false, xanchor: "left", yanchor: yanchor,
               text: group.items.length === 1 ? S.esc(text(first)) : group.items.length + " " + plural,
               font: { color: color, size: 10 }, hovertext: group.items.map(function (i) { return S.esc(hover(i)); }).join("<br>") };
    }
    var changeLabel = function (c) { return c.label; };
    var evalLabel = function (e) { return "eval " + S.fmt(e.score, 2); };
    var notes = labelGroups(snap.changes, changeLabel, "changes", snap).slice(-12).map(function (g) {
      return note(g, 1, "top", CHANGE_COLOR, changeLabel, "changes", changeText);
    }).concat(labelGroups(snap.evals, evalLabel, "evals", snap).slice(-12).map(function (g) {
      return note(g, 0, "bottom", EVAL_COLOR, evalLabel, "evals", evalText);
    }));
    return { shapes: shapes, annotations: notes };
  }

  function thresholdsOf(slos) {
    var t = {};
    slos.forEach(function (r) { t[r.slo] = r.threshold_ms; });
    return t;
  }

  function drawCharts(snap, cols) {
    var marks = markerShapes(snap);
    var t = thresholdsOf(snap.slos);
    thresholdsDrawn = JSON.stringify(t);
    Object.keys(CHARTS).forEach(function (id) {
      var layout = S.layout();
      layout.xaxis.range = [snap.since, snap.until];
      layout.shapes = marks.shapes.slice();
      layout.annotations = marks.annotations.slice();
      layout.legend = { orientation: "h", y: 1.1, x: 1, xanchor: "right", font: { size: 10 } };
      layout.margin.t = 18;
      var q = id === "chart-ttft" ? "ttft" : id === "chart-itl" ? "itl" : null;
      if (q && t[q] !== null) {
        layout.shapes.push(S.sloShape(t[q]));
        layout.annotations.push(S.sloAnnotation(t[q]));
        layout.yaxis.title = { text: "ms" };
      }
      if (id === "chart-throughput") {
        layout.yaxis.title = { text: "req/s" };
        layout.yaxis2 = { title: { text: "tokens/s" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false };
        layout.margin.r = 56;
      }
      if (id === "chart-kv") layout.yaxis.range = [0, 105];
      if (id === "chart-duration") layout.yaxis.title = { text: "ms" };
      Plotly.react(id, S.traces(cols, CHARTS[id]), layout, S.CONFIG);
    });
    el("series-empty").hidden = cols.t.length > 0;
    document.querySelectorAll(".series-step").forEach(function (n) {
      n.textContent = "a point per " + (snap.step_seconds >= 3600 ? snap.step_seconds / 3600 + " h" : snap.step_seconds / 60 + " min");
    });
  }

  function drawPrompt(p) {
    var labels = p.bounds.map(function (b, i) {
      var low = i === 0 ? 0 : p.bounds[i - 1];
      return b === null ? "> " + S.fmt(low) : "≤ " + S.fmt(b);
    });
    var layout = S.layout();
    layout.xaxis = { type: "category", gridcolor: "#2a323d", title: { text: "prompt tokens" } };
    layout.yaxis.title = { text: "% of requests" };
    layout.barmode = "group";
    layout.legend = { orientation: "h", y: 1.1, x: 1, xanchor: "right", font: { size: 10 } };
    layout.margin.t = 18;
    layout.margin.b = 44;
    var pctOf = function (v) { return v === null ? null : 100 * v; };
    Plotly.react("chart-prompt", [
      { type: "bar", x: labels, y: p.share.map(pctOf), name: "this range", marker: { color: "#5aa9ff" } },
      { type: "bar", x: labels, y: p.baseline_share.map(pctOf), name: "7 days before", marker: { color: "#6b7785" } },
    ], layout, S.CONFIG);
    var shift = function (v, base, ratio) {
      return S.fmt(v) + (base === null ? "" : " (baseline " + S.fmt(base) + (ratio === null ? "" : ", " + S.fmt(ratio, 2) + "×") + ")");
    };
    el("prompt-note").textContent = p.total ? "p50 " + shift(p.p50, p.baseline_p50, p.p50_ratio) + " · p90 " + shift(p.p90, p.baseline_p90, p.p90_ratio)
      : "no prompts in this range";
  }

  // --- loading and live ------------------------------------------------------------------------
  function load() {
    var mine = ++seq;
    drawn = false;
    pending = [];
    return range.fetchJson(config.snapshot_url)
      .then(function (snap) {
        if (mine !== seq) return;
        snapshot = snap;
        renderSummary(snap);
        renderSinceStart(snap.since_start);
        renderTriton(snap.now, snap.range_figures, range.label());
        renderMarkers(snap);
        drawCharts(snap, snap.series);
        range.zoomOn(Object.keys(CHARTS));
        drawPrompt(snap.prompt_lengths);
        drawn = true;
        el("last-update").textContent = "updated " + S.fmtTime(snap.ts);
        var held = pending;
        pending = [];
        held.forEach(onDelta);
      });
  }

  // The charts show [since, until]: a minute past `until` slides the window along.
  function follow(newest) {
    var end = Date.parse(newest) + MINUTE_MS;
    var until = Date.parse(snapshot.until);
    if (end <= until) return;
    var since = Date.parse(snapshot.since) + (end - until);
    snapshot.since = new Date(since).toISOString();
    snapshot.until = new Date(end).toISOString();
    Object.keys(CHARTS).forEach(function (id) { Plotly.relayout(id, { "xaxis.range": [snapshot.since, snapshot.until] }); });
  }

  function reloadSoon() {
    if (reloadTimer) return;
    reloadTimer = setTimeout(function () { reloadTimer = null; load(); }, 1000);
  }

  function onDelta(msg) {
    if (msg.type !== "endpoint.delta") return;
    if (!drawn) {
      pending.push(msg);
      if (pending.length > 20) pending.shift();
      return;
    }
    renderSummary(msg);
    renderTriton(msg.now, snapshot.range_figures, range.label());
    if (JSON.stringify(thresholdsOf(msg.slos)) !== thresholdsDrawn) {
      reloadSoon();  // a new SLO line: redraw from a fresh snapshot
    } else if (range.isCustom()) {
      // A custom window stays put: its charts take no live points.
    } else if (snapshot.step_seconds === 60) {
      Object.keys(CHARTS).forEach(function (id) {
        S.merge(el(id), msg.points, CHARTS[id], Math.ceil((Date.parse(snapshot.until) - Date.parse(snapshot.since)) / MINUTE_MS) + 8);
      });
      if (msg.points.t.length) {
        el("series-empty").hidden = true;
        follow(msg.points.t[msg.points.t.length - 1]);
      }
    } else if (msg.newest) {
      // A wider range: its newest step is an aggregate; re-read once a new step has begun.
      var x = el("chart-ttft").data[0].x;
      var last = x.length ? Date.parse(x[x.length - 1]) : 0;
      if (Date.parse(msg.newest) >= last + snapshot.step_seconds * 1000) reloadSoon();
    }
    el("last-update").textContent = "updated " + S.fmtTime(msg.ts);
  }

  // The charts' window: a preset or from / to, in the URL; a drag across a chart zooms to it.
  var range = new window.GoodputRange({ onChange: load });
  window.goodputEndpoint = { reload: load };
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
