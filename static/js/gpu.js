// A GPU's page: utilisation and memory (%), temperature (°C) and power (W), each on its own
// axis, live. A MIG instance charts only its own fields: utilisation and memory.
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("page-config").textContent);
  var charts = [{ id: "chart-util", unit: "%", range: [0, 100] }];
  if (!config.mig) charts.push({ id: "chart-temp", unit: "°C" }, { id: "chart-power", unit: "W" });
  var NAMES = { util: "Utilisation", mem_used_pct: "Memory used", temp: "Temperature", power_w: "Power" };
  var KEYS = config.mig ? [["util", "mem_used_pct"]] : [["util", "mem_used_pct"], ["temp"], ["power_w"]];

  function traces(snap) {
    var s = snap.series;
    return KEYS.map(function (keys) {
      return keys.filter(function (k) { return s[k]; }).map(function (k) {
        return { gpu: snap.gpu.id, key: k, name: NAMES[k], ts: s.ts, y: s[k] };
      });
    });
  }

  window.goodputGpu = new window.GoodputSeriesPage({ charts: charts, traces: traces });
})();
