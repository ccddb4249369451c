(function () {
  "use strict";
  var s = JSON.parse(document.getElementById("gpu-series").textContent);
  var layout = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: "#8b96a5", size: 11 },
    margin: { l: 56, r: 56, t: 14, b: 30 }, legend: { orientation: "h", y: -0.12 },
    xaxis: { gridcolor: "#2a323d", type: "date" },
    yaxis: { gridcolor: "#2a323d", title: { text: "% · °C" }, rangemode: "tozero" },
    yaxis2: { overlaying: "y", side: "right", title: { text: "W" }, showgrid: false, rangemode: "tozero", tickformat: ",.0f" },
  };
  Plotly.newPlot("gpu-chart", [
    { x: s.ts, y: s.util, name: "Utilisation %", mode: "lines", line: { color: "#5aa9ff" } },
    { x: s.ts, y: s.temp, name: "Temperature °C", mode: "lines", line: { color: "#f5b84b" } },
    { x: s.ts, y: s.power_w, name: "Power W", mode: "lines", yaxis: "y2", line: { color: "#3ecf8e" } },
  ], layout, { displayModeBar: false, responsive: true });
})();
