// A node's page: its GPUs side by side (one trace per GPU) on utilisation (%), temperature (°C)
// and power (W) charts, live.
(function () {
  "use strict";
  var charts = [
    { id: "chart-util", unit: "%", range: [0, 100], key: "util" },
    { id: "chart-temp", unit: "°C", key: "temp" },
    { id: "chart-power", unit: "W", key: "power_w" },
  ];

  function traces(snap) {
    return charts.map(function (chart) {
      return snap.gpus.map(function (g) {
        return { gpu: g.id, key: chart.key, name: g.label, ts: g.series.ts, y: g.series[chart.key] };
      });
    });
  }

  window.goodputNode = new window.GoodputSeriesPage({ charts: charts, traces: traces });
})();
