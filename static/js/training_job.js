// A training job's page: the snapshot over HTTP (account, timeline, per-minute step and GPU
// series, chart markers, failure losses, the checkpoint advisor), then the `job.<id>` topic's
// deltas: the job's state, new per-minute step points (extendTraces; the still-filling minute
// is replaced), and new events (the timeline, and a marker on the step chart).
// Events are followed by seq: the page holds every event below `knownSeq` (its snapshot's
// watermark, then each delta's). A delta says from which seq its events are complete
// (events_from_seq); one that starts past knownSeq means events were missed (the server forgot
// its watermark after an idle hour and re-sent only the newest): the page re-reads its snapshot.
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
  var WINDOW_POINTS = 1441;  // a day of minutes, and the one still filling
  var MARKER_COLORS = { checkpoint_saved: "#3ecf8e", failed: "#ff5c6c", preempted: "#f5b84b", restored: "#5aa9ff" };
  // Events that change the account or the losses table: the page re-reads its snapshot after them.
  var RELOAD_KINDS = { failed: 1, preempted: 1, restored: 1, released: 1, completed: 1, resumed: 1, allocated: 1, started: 1 };

  var seq = 0;
  var drawn = false;         // deltas extend the charts only once the snapshot has drawn them
  var lastMinute = null;     // ISO time of the step chart's newest point
  var seenSeqs = new Set();  // events on the timeline, by seq: a delta may repeat one
  var knownSeq = 0;          // every event with a lower seq is in the snapshot or a delta drawn since
  var pending = [];          // deltas that arrive while the snapshot loads: applied once it is drawn
  var PENDING_MAX = 100;
  var shapes = [];
  var reloadTimer = null;

  function el(id) { return document.getElementById(id); }
  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function fmt(v, d) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US", { minimumFractionDigits: d || 0, maximumFractionDigits: d || 0 }); }
  function pct(v, d) { return v === null || v === undefined ? "–" : (100 * v).toFixed(d === undefined ? 1 : d); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }
  function fmtStamp(ts) { return ts ? new Date(ts).toISOString().slice(0, 19).replace("T", " ") + " UTC" : "–"; }
  function dur(s) {
    if (s === null || s === undefined) return "–";
    if (s < 120) return fmt(s, s < 10 ? 1 : 0) + " s";
    if (s < 7200) return fmt(s / 60, 1) + " min";
    return fmt(s / 3600, 2) + " h";
  }
  function age(s) {
    if (s === null || s === undefined) return "–";
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }
  function plural(n, word) { return fmt(n) + " " + word + (n === 1 ? "" : "s"); }
  function setStat(key, text) {
    document.querySelectorAll("[data-stat='" + key + "']").forEach(function (n) { n.textContent = text; });
  }

  // --- the job's numbers ------------------------------------------------------------------------
  function renderJob(job) {
    var badge = el("job-state");
    badge.className = "job-state state-" + job.state;
    badge.textContent = job.state_label;
    setStat("last_step", fmt(job.last_step));
    setStat("last_step_age", age(job.last_step_age_s));
    setStat("failures", fmt(job.failures));
    setStat("last_checkpoint", job.last_checkpoint_step === null ? "none yet" : "step " + fmt(job.last_checkpoint_step) + ", " + fmtStamp(job.last_checkpoint_at));
  }

  function renderRate(steps) {
    // The newest whole minute: the one still filling would read low.
    var i = steps.ts.length - 1;
    if (i > 0 && Date.parse(steps.ts[i]) + 60000 > Date.now() && steps.step_rate[i - 1] !== null) i -= 1;
    setStat("step_rate", i >= 0 ? fmt(steps.step_rate[i], 2) : "–");
    setStat("tokens_per_s", i >= 0 ? fmt(steps.tokens_per_s[i]) : "–");
  }

  function renderAccount(acc) {
    // Retained goodput with the share at risk beside it; retained + at risk + lost = allocated.
    setStat("goodput", pct(acc.goodput));
    setStat("at_risk_share", pct(acc.at_risk_share));
    setStat("productive_gpu_h", fmt(acc.productive_gpu_h, 2));
    setStat("allocated_gpu_h", fmt(acc.allocated_gpu_h, 2));
    setStat("lost_gpu_h", fmt(acc.lost_gpu_h, 2));
    setStat("at_risk_gpu_h", fmt(acc.at_risk_gpu_h, 2));
    el("lost-stat").classList.toggle("warn", acc.lost_gpu_h > 0);
    // A long job's account comes from the hourly accounts, refreshed every 15 s: say so.
    var asOf = acc.exact ? "" : "as of the last refresh" + (acc.as_of ? " (events since " + fmtStamp(acc.as_of) + " not yet counted)" : "");
    setStat("account_as_of", asOf);
    el("account-note").textContent = acc.exact ? "exact, from every event" : "from the hourly accounts, " + asOf;
    el("breakdown-table").querySelector("tbody").innerHTML = acc.breakdown.map(function (b) {
      var share = b.share === null ? 0 : 100 * b.share;
      return "<tr><td><i class='swatch' style='background:" + COLORS[b.category] + "'></i>" + esc(b.label) + "</td>" +
        "<td class='num'>" + fmt(b.gpu_h, 2) + "</td><td class='num'>" + (b.share === null ? "–" : share.toFixed(1) + " %") + "</td>" +
        "<td class='bar-col'><div class='bar'><i style='width:" + share.toFixed(1) + "%;background:" + COLORS[b.category] + "'></i></div></td></tr>";
    }).join("");
  }

  function costParts(c) {
    return fmt(c.lost_gpu_h, 2) + " progress lost + " + fmt(c.waiting_gpu_h, 2) + " waiting to restart + " +
      fmt(c.reinit_gpu_h, 2) + " re-initialisation + " + fmt(c.restore_gpu_h, 2) + " restore";
  }

  function failureClass(e) {
    // What the reason says caused it (fleet/training/failures.py), ahead of the reason itself.
    return e.failure_class ? "<span class='badge badge-unknown' data-failure-class='" + esc(e.failure_class) + "'>" +
      esc(e.failure_class_label) + "</span> " : "";
  }

  function renderLosses(losses, total) {
    // One figure per disruption (and for all of them), the parts beside it.
    setStat("failure_cost_gpu_h", fmt(total.cost_gpu_h, 2));
    setStat("failure_cost_parts", losses.length ? costParts(total) : "no failures or preemptions");
    el("failure-cost-stat").classList.toggle("warn", total.cost_gpu_h > 0);
    el("losses-table").querySelector("tbody").innerHTML = losses.slice().reverse().map(function (l) {
      var back = l.checkpoint_step === null ? "<span class='bad-text'>no checkpoint: everything since the start</span>"
        : "step " + fmt(l.checkpoint_step) + " saved " + fmtStamp(l.checkpoint_ts);
      var growing = l.growing ? " <span class='muted small'>(" + (l.growing === "waiting" ? "still waiting" : "restarting") + ")</span>" : "";
      return "<tr data-kind='" + esc(l.kind) + "'><td>" + fmtStamp(l.ts) + "</td><td>" + esc(l.kind) + "</td><td class='wrap'>" + failureClass(l) + esc(l.reason || "–") + "</td>" +
        "<td class='num' data-col='cost'>" + fmt(l.cost_gpu_h, 2) + growing + "</td>" +
        "<td class='num'>" + fmt(l.lost_gpu_h, 2) + "</td><td class='num'>" + fmt(l.waiting_gpu_h, 2) + "</td>" +
        "<td class='num'>" + fmt(l.reinit_gpu_h, 2) + "</td><td class='num'>" + fmt(l.restore_gpu_h, 2) + "</td><td>" + back + "</td></tr>";
    }).join("") || "<tr><td colspan='9' class='muted'>No failures or preemptions: nothing lost to a disruption.</td></tr>";
  }

  function renderAdvice(a, job) {
    var body = el("advisor-body");
    if (!a) {
      body.innerHTML = "<p class='muted'>No advice yet: neither this job nor its cluster has saved a checkpoint that " +
        "blocked training, so the checkpoint cost cannot be measured. Send <code>checkpoint_saved</code> events with " +
        "<code>duration_s</code>.</p>";
      return;
    }
    var gpuMtbfS = a.gpu_mtbf_h * 3600;
    var cost = a.checkpoint_cost_source === "job"
      ? "median of this job's " + plural(a.saves_observed, "save")
      : "median of " + plural(a.saves_observed, "save") + " on its cluster (this job has none of its own)";
    // Observed, assumed or their blend: the server labels each figure (a blend is neither).
    var mtbfWhy = a.mtbf_explained;
    var current = a.current_interval_s === null ? "unknown (no planned interval, fewer than two saves)"
      : dur(a.current_interval_s) + " (" + (a.current_interval_source === "planned" ? "planned" : "median time between saves") + ")";
    var lines = [
      ["MTBF of this job", dur(a.job_mtbf_s) + " = " + fmt(gpuMtbfS / 3600) + " h / " + fmt(a.gang_size) + " GPUs; " + mtbfWhy],
      ["Checkpoint cost δ", dur(a.checkpoint_cost_s) + " = " + cost],
      ["Current interval", current],
      ["Young", "τ = √(2 δ M) = √(2 × " + dur(a.checkpoint_cost_s) + " × " + dur(a.job_mtbf_s) + ") = " + dur(a.young_interval_s)],
      ["Daly", "τ = √(2 δ M)(1 + √(δ/2M)/3 + δ/18M) − δ = " + dur(a.daly_interval_s) + " (recommended)"],
    ];
    var verdict;
    if (a.waste_current === null) {
      verdict = "At the recommended " + dur(a.recommended_interval_s) + ": " + pct(a.waste_recommended, 2) + " % expected waste.";
    } else {
      var saved = a.gpu_hours_saved_per_week;
      verdict = "At the current interval " + dur(a.current_interval_s) + ": " + pct(a.waste_current, 2) + " % expected waste; at Daly's " +
        dur(a.recommended_interval_s) + ": " + pct(a.waste_recommended, 2) + " %; " +
        (saved > 0.005 ? "saves " + fmt(saved, 1) + " GPU-hours a week." : "already at the optimum: nothing to save.");
    }
    verdict += " " + a.saving_explained;
    body.innerHTML = "<dl class='advisor-inputs'>" + lines.map(function (l) {
      return "<dt>" + esc(l[0]) + "</dt><dd>" + esc(l[1]) + "</dd>";
    }).join("") + "</dl><p class='advisor-verdict'>" + esc(verdict) + "</p>" +
      "<div class='muted small'>Assumptions</div><ul class='assumptions'>" +
      a.assumptions.map(function (t) { return "<li>" + esc(t) + "</li>"; }).join("") + "</ul>";
  }

  // --- the timeline -----------------------------------------------------------------------------
  function eventText(e) {
    var parts = [];
    if (e.step !== null) parts.push("step " + fmt(e.step));
    if (e.duration_s !== null) parts.push(dur(e.duration_s));
    if (e.bytes !== null) parts.push(fmt(e.bytes / 1e9, 1) + " GB");
    if (e.node) parts.push(e.node);
    if (e.failure_class_label) parts.push(e.failure_class_label);
    if (e.reason) parts.push(e.reason);
    return parts.join(" · ");
  }

  function eventItem(e) {
    return "<li class='ev-" + esc(e.kind) + "' data-seq='" + e.seq + "'><span class='tl-time'>" + fmtStamp(e.ts) + "</span> " +
      "<span class='tl-actor'>" + esc(e.label) + "</span> <span class='tl-text'>" + esc(eventText(e)) + "</span></li>";
  }

  function renderTimeline(events) {
    seenSeqs.clear();
    events.forEach(function (e) { seenSeqs.add(e.seq); });
    el("timeline").innerHTML = events.map(eventItem).join("") ||
      "<li class='muted'>No events yet. Training clients send them to <code>/api/v1/training/jobs/" + config.job_id + "/events</code>.</li>";
  }

  // --- charts -----------------------------------------------------------------------------------
  function markerShape(e) {
    return { type: "line", xref: "x", yref: "paper", x0: e.ts, x1: e.ts, y0: 0, y1: 1,
             line: { color: MARKER_COLORS[e.kind] || "#8b96a5", width: e.kind === "checkpoint_saved" ? 1 : 2,
                     dash: e.kind === "checkpoint_saved" ? "dot" : "solid" } };
  }

  function markerTrace(events, name, kind) {
    var list = events.filter(function (e) { return e.kind === kind; });
    return { x: list.map(function (e) { return e.ts; }), y: list.map(function () { return 0; }), yaxis: "y", name: name,
             mode: "markers", marker: { symbol: kind === "checkpoint_saved" ? "diamond" : "x", size: 9, color: MARKER_COLORS[kind] },
             text: list.map(eventText), hovertemplate: "%{text}<extra>" + name + "</extra>" };
  }

  function drawSteps(snap) {
    var s = snap.series.steps;
    var all = snap.markers.checkpoints.concat(snap.markers.failures, snap.markers.restores);
    shapes = all.map(markerShape);
    var layout = JSON.parse(JSON.stringify(LAYOUT));
    layout.yaxis.title = { text: "steps/s" };
    layout.yaxis2 = { title: { text: "tokens/s" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false };
    layout.margin.r = 56;
    layout.legend = { orientation: "h", y: -0.12, yanchor: "top" };
    layout.shapes = shapes;
    layout.xaxis.range = [snap.series.since, snap.series.until];
    var traces = [
      { x: s.ts.slice(), y: s.step_rate.slice(), name: "steps/s", mode: "lines", connectgaps: false, line: { width: 2, color: "#5aa9ff" } },
      { x: s.ts.slice(), y: s.tokens_per_s.slice(), name: "tokens/s", yaxis: "y2", mode: "lines", connectgaps: false, line: { width: 1.5, color: "#c38bff" } },
      markerTrace(all, "checkpoint", "checkpoint_saved"),
      markerTrace(all, "failure", "failed"),
      markerTrace(all, "preempted", "preempted"),
      markerTrace(all, "restore", "restored"),
    ];
    Plotly.react("chart-steps", traces, layout, CONFIG);
    lastMinute = s.ts.length ? s.ts[s.ts.length - 1] : null;
    el("steps-empty").hidden = s.ts.length > 0;
  }

  function drawGpus(snap) {
    var g = snap.series.gpus;
    var util = JSON.parse(JSON.stringify(LAYOUT));
    util.yaxis.range = [0, 100];
    util.yaxis.title = { text: "%" };
    util.shapes = shapes;
    // The same window as the step chart, so a dip lines up with the steps above it.
    util.xaxis.range = [snap.series.since, snap.series.until];
    Plotly.react("chart-util", [
      { x: g.ts, y: g.util_mean, name: "mean", mode: "lines", line: { width: 2, color: "#3ecf8e" } },
      { x: g.ts, y: g.util_min, name: "lowest GPU", mode: "lines", line: { width: 1, color: "#f5b84b" } },
    ], util, CONFIG);
    var power = JSON.parse(JSON.stringify(LAYOUT));
    power.yaxis.title = { text: "kW" };
    power.shapes = shapes;
    power.xaxis.range = [snap.series.since, snap.series.until];
    power.showlegend = false;
    Plotly.react("chart-power", [{ x: g.ts, y: g.power_kw, name: "power", mode: "lines", line: { width: 2, color: "#f5b84b" } }], power, CONFIG);
    var n = g.gpus.length ? Math.max.apply(null, g.gpus) : 0;
    el("gpu-count").textContent = n ? n + " GPUs reporting, " + (snap.series.bucket_seconds === 3600 ? "1-hour" : "1-minute") + " rollups" : "";
    el("gpu-empty").hidden = g.ts.length > 0;
  }

  function extendSteps(steps) {
    if (!drawn || !steps.ts.length || range.isCustom()) return;  // a custom window stays put
    var gd = el("chart-steps");
    var start = 0;
    if (lastMinute !== null && steps.ts[0] <= lastMinute) {
      // The minute that was still filling at the previous push: replace its point in place.
      for (var i = 0; i < steps.ts.length && steps.ts[i] <= lastMinute; i++) {
        var at = gd.data[0].x.lastIndexOf(steps.ts[i]);
        if (at >= 0) {
          gd.data[0].y[at] = steps.step_rate[i];
          gd.data[1].y[at] = steps.tokens_per_s[i];
        }
        start = i + 1;
      }
    }
    var xs = steps.ts.slice(start);
    if (xs.length) {
      Plotly.extendTraces(gd, { x: [xs, xs.slice()], y: [steps.step_rate.slice(start), steps.tokens_per_s.slice(start)] }, [0, 1], WINDOW_POINTS);
      lastMinute = xs[xs.length - 1];
    } else {
      Plotly.redraw(gd);
    }
    el("steps-empty").hidden = true;
  }

  function addEvents(events) {
    // Below knownSeq the page has them all (the snapshot's 200 newest on the timeline): a re-sent
    // event is dropped, not drawn twice nor taken as news.
    var fresh = events.filter(function (e) { return e.seq >= knownSeq && !seenSeqs.has(e.seq); });
    if (!fresh.length) return false;
    var list = el("timeline");
    if (!seenSeqs.size) list.innerHTML = "";
    fresh.forEach(function (e) {
      seenSeqs.add(e.seq);
      list.insertAdjacentHTML("afterbegin", eventItem(e));
      if (MARKER_COLORS[e.kind] && drawn) {
        shapes.push(markerShape(e));
        ["chart-steps", "chart-util", "chart-power"].forEach(function (id) { Plotly.relayout(id, { shapes: shapes }); });
      }
    });
    return fresh.some(function (e) { return RELOAD_KINDS[e.kind]; });
  }

  // --- loading and live -------------------------------------------------------------------------
  function load() {
    var mine = ++seq;
    drawn = false;
    pending = [];
    return range.fetchJson(config.snapshot_url)
      .then(function (snap) {
        if (mine !== seq) return;
        renderJob(snap.job);
        renderAccount(snap.account);
        if (!range.isCustom()) renderRate(snap.series.steps);  // the rate now, not the window's last
        renderLosses(snap.losses, snap.losses_total);
        renderAdvice(snap.advice, snap.job);
        renderTimeline(snap.timeline);
        drawSteps(snap);
        drawGpus(snap);
        range.zoomOn(["chart-steps", "chart-util", "chart-power"]);
        knownSeq = snap.watermark;
        drawn = true;
        el("last-update").textContent = "updated " + fmtTime(snap.ts);
        // Deltas built while the snapshot was read: their events past its watermark are new.
        var held = pending;
        pending = [];
        held.forEach(onDelta);
      });
  }

  function reloadSoon() {
    // A failure or restore changes the account and the losses: re-read them once things settle.
    if (reloadTimer) clearTimeout(reloadTimer);
    reloadTimer = setTimeout(function () { reloadTimer = null; load(); }, 1500);
  }

  function onDelta(msg) {
    if (msg.type !== "job.delta") return;
    if (!drawn) {
      // Kept, not dropped: the next delta continues from this one's watermark.
      pending.push(msg);
      if (pending.length > PENDING_MAX) pending.shift();
      return;
    }
    if (msg.events_from_seq > knownSeq) {
      load();  // events between knownSeq and events_from_seq were never sent to this page
      return;
    }
    renderJob(msg.job);
    if (msg.steps.ts.length) renderRate(msg.steps);
    extendSteps(msg.steps);
    var reload = addEvents(msg.events);
    knownSeq = Math.max(knownSeq, msg.watermark);
    if (reload) reloadSoon();
    el("last-update").textContent = "updated " + fmtTime(msg.ts);
  }

  // The charts' window: the job's last 24 hours, or from / to in the URL; a drag zooms to it.
  var range = new window.GoodputRange({ onChange: load });
  window.goodputJob = { reload: load, knownSeq: function () { return knownSeq; } };
  new window.GoodputLive({ topics: [config.topic], onMessage: onDelta, onSnapshot: load });
})();
