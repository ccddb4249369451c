// Per-GPU charts for the GPU and node pages: a snapshot over HTTP for the chosen range, then the
// live points of the page's topic appended with extendTraces, at most one per bucket. A gap in
// the data (more than three buckets) is drawn as a gap: a null point breaks the line.
(function () {
  "use strict";

  var COLORS = ["#5aa9ff", "#3ecf8e", "#f5b84b", "#c38bff", "#ff7eb6", "#4dd0e1", "#ff8a65", "#aed581"];
  var LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: "#8b96a5", size: 11 }, margin: { l: 48, r: 10, t: 10, b: 30 },
    xaxis: { gridcolor: "#2a323d", type: "date" }, yaxis: { gridcolor: "#2a323d", rangemode: "tozero" },
    legend: { orientation: "h", y: -0.2 }, showlegend: true,
  };
  var CONFIG = { displayModeBar: false, responsive: true };

  function el(id) { return document.getElementById(id); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(11, 19) + " UTC"; }

  // opts.charts: [{id, unit, range}]; opts.traces(snapshot) -> for each chart, a list of
  // {gpu, key, name, ts, y}; a live point {id, ts, <key>: value} feeds the traces of its gpu id.
  function SeriesPage(opts) {
    this.opts = opts;
    this.config = JSON.parse(el("page-config").textContent);
    this.seq = 0;
    this.drawn = false;   // no live point is appended before the current range's snapshot is drawn
    this.traces = [];     // per chart: [{gpu, key}] in trace order
    this.lastMs = {};     // gpu id -> time of its newest point
    var self = this;
    // The charts' window: a preset or from / to, in the URL; a drag across a chart zooms to it.
    this.range = new window.GoodputRange({ onChange: function () { return self.load(); } });
    new window.GoodputLive({
      topics: [this.config.topic],
      onMessage: function (msg) { self.onDelta(msg); },
      onSnapshot: function () { return self.load(); },
    });
  }

  SeriesPage.prototype.load = function () {
    var self = this;
    var seq = ++this.seq;
    this.drawn = false;
    return this.range.fetchJson(this.config.series_url)
      .then(function (snap) {
        if (seq !== self.seq) return;  // a newer range was chosen while this one loaded
        self.draw(snap);
      });
  };

  SeriesPage.prototype.draw = function (snap) {
    var self = this;
    this.bucketMs = snap.bucket_seconds * 1000;
    this.windowPoints = Math.ceil(snap.range_seconds / snap.bucket_seconds) + 1;
    this.lastMs = {};
    var perChart = this.opts.traces(snap);
    this.traces = [];
    this.opts.charts.forEach(function (chart, c) {
      var specs = perChart[c];
      self.traces.push(specs.map(function (t) { return { gpu: t.gpu, key: t.key }; }));
      specs.forEach(function (t) {
        if (t.ts.length) self.lastMs[t.gpu] = Math.max(self.lastMs[t.gpu] || 0, Date.parse(t.ts[t.ts.length - 1]));
      });
      var data = specs.map(function (t, i) {
        // Small markers: a point between two gaps (one sample after a silence) has no line to draw.
        var color = COLORS[i % COLORS.length];
        return { x: t.ts.slice(), y: t.y.slice(), name: t.name, mode: "lines+markers", connectgaps: false,
                 line: { width: 2, color: color }, marker: { size: 3, color: color } };
      });
      var layout = JSON.parse(JSON.stringify(LAYOUT));
      layout.yaxis.title = { text: chart.unit };
      if (chart.range) layout.yaxis.range = chart.range;
      if (snap.from) layout.xaxis.range = [snap.from, snap.to];  // a custom window, drawn whole
      Plotly.react(chart.id, data, layout, CONFIG);
    });
    this.range.zoomOn(this.opts.charts.map(function (chart) { return chart.id; }));
    this.drawn = true;
    el("last-update").textContent = "updated " + fmtTime(snap.ts) + " · " + snap.resolution +
      (snap.resolution === "raw" ? " samples" : " rollups");
  };

  SeriesPage.prototype.onDelta = function (msg) {
    if (msg.type !== "gpu.delta" || !this.drawn) return;  // the snapshot being drawn includes it
    if (this.range.isCustom()) return;  // a custom window stays put
    var self = this;
    var byGpu = {};
    msg.points.forEach(function (p) {
      var ms = Date.parse(p.ts);
      var last = self.lastMs[p.id] || 0;
      if (ms - last < self.bucketMs) return;  // this bucket already has its point
      byGpu[p.id] = { point: p, gap: last > 0 && ms - last > 3 * self.bucketMs ? new Date(last + self.bucketMs).toISOString() : null };
      self.lastMs[p.id] = ms;
    });
    if (!Object.keys(byGpu).length) return;
    this.opts.charts.forEach(function (chart, c) {
      var xs = [], ys = [], indices = [];
      self.traces[c].forEach(function (t, i) {
        var hit = byGpu[t.gpu];
        if (!hit) return;
        indices.push(i);
        xs.push(hit.gap ? [hit.gap, hit.point.ts] : [hit.point.ts]);
        ys.push(hit.gap ? [null, hit.point[t.key]] : [hit.point[t.key]]);
      });
      if (indices.length) Plotly.extendTraces(chart.id, { x: xs, y: ys }, indices, self.windowPoints);
    });
    el("last-update").textContent = "updated " + fmtTime(msg.ts);
  };

  window.GoodputSeriesPage = SeriesPage;
})();
