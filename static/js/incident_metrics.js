(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("incident-metrics").textContent);
  // Plotly mutates the layout it is given: each chart gets its own. Months and categories are
  // labels, not dates, so the x axes are categorical.
  function layout() {
    return {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: "#8b96a5", size: 11 },
      margin: { l: 44, r: 10, t: 14, b: 40 }, xaxis: { gridcolor: "#2a323d", type: "category" },
      yaxis: { gridcolor: "#2a323d", rangemode: "tozero" }, legend: { orientation: "h", y: -0.2 }, barmode: "group",
    };
  }
  // A count axis ticks at whole numbers only (Plotly would put 0.5 between 0 and 1): a step of
  // 1, 2, 5, 10, 20, ... with at most six ticks.
  function countAxis(layout, values) {
    var max = Math.max.apply(null, [1].concat(values.filter(function (v) { return v !== null; })));
    var step = 1;
    for (var k = 1; max / step > 6; k++) step = [1, 2, 5][k % 3] * Math.pow(10, Math.floor(k / 3));
    layout.yaxis.tick0 = 0;
    layout.yaxis.dtick = step;
    layout.yaxis.tickformat = "d";
    return layout;
  }
  var config = { displayModeBar: false, responsive: true };
  var colors = { SEV1: "#ff5c6c", SEV2: "#f5b84b", SEV3: "#5aa9ff", SEV4: "#8b96a5" };
  var bySeverity = {};
  data.mttx.forEach(function (r) {
    var s = bySeverity[r.severity] = bySeverity[r.severity] || { x: [], y: [] };
    s.x.push(r.month); s.y.push(r.mttr);
  });
  Plotly.newPlot("chart-mttr", Object.keys(bySeverity).sort().map(function (sev) {
    return { type: "bar", name: sev, x: bySeverity[sev].x, y: bySeverity[sev].y, marker: { color: colors[sev] } };
  }), layout(), config);
  var counts = data.categories.map(function (c) { return c.count; });
  Plotly.newPlot("chart-categories", [{ type: "bar", x: data.categories.map(function (c) { return c.category || "other"; }),
    y: counts, marker: { color: "#5aa9ff" } }], countAxis(layout(), counts), config);
  Plotly.newPlot("chart-gpu-hours", [{ type: "bar", x: data.gpu_hours.map(function (g) { return g.month; }),
    y: data.gpu_hours.map(function (g) { return g.gpu_hours; }), marker: { color: "#f5b84b" } }], layout(), config);
})();
