// The model page's lineage graph: a Sankey from training jobs to datasets to the model version.
// The data comes from the page (json_script "lineage-data"); links are one per lineage row.
(function () {
  "use strict";
  const el = document.getElementById("lineage-graph");
  const data = document.getElementById("lineage-data");
  if (!el || !data || typeof Plotly === "undefined") return;
  const graph = JSON.parse(data.textContent);
  const COLORS = { model: "#5aa9ff", dataset: "#7bd389", job: "#f5b84b" };
  const narrow = window.matchMedia("(max-width: 600px)").matches;
  el.style.height = Math.max(260, Math.min(620, 60 + graph.labels.length * 34)) + "px";
  Plotly.react(
    el,
    [{
      type: "sankey",
      orientation: "h",
      arrangement: "snap",
      node: {
        label: graph.labels,
        color: graph.kinds.map((k) => COLORS[k]),
        pad: narrow ? 10 : 16,
        thickness: narrow ? 12 : 18,
        line: { width: 0 },
      },
      link: { source: graph.source, target: graph.target, value: graph.value, color: "rgba(154,167,189,.25)" },
      textfont: { color: "#e6e9ef", size: narrow ? 10 : 12 },
    }],
    { margin: { l: 8, r: 8, t: 8, b: 8 }, paper_bgcolor: "rgba(0,0,0,0)", font: { color: "#e6e9ef" } },
    { displayModeBar: false, responsive: true },
  );
})();
