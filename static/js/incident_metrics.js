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
  Plotly.newPlot("chart-categories", [{ type: "bar", x: data.categories.map(function (c) { return c.category || "other"; }),
    y: data.categories.map(function (c) { return c.count; }), marker: { color: "#5aa9ff" } }], layout(), config);
  Plotly.newPlot("chart-gpu-hours", [{ type: "bar", x: data.gpu_hours.map(function (g) { return g.month; }),
    y: data.gpu_hours.map(function (g) { return g.gpu_hours; }), marker: { color: "#f5b84b" } }], layout(), config);
})();
