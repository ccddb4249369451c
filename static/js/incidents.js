// Incident list: rows arrive and change live. A delta carries the incidents that changed; rows
// that match the page's filters are inserted or updated in place, others are dropped.
(function () {
  "use strict";
  var form = document.getElementById("incident-filters");
  var tbody = document.querySelector("#incident-table tbody");

  function esc(s) { return String(s === null || s === undefined ? "" : s).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; }); }
  function fmtTime(ts) { return new Date(ts).toISOString().slice(0, 19).replace("T", " ") + " UTC"; }
  function selected(name) {
    return Array.prototype.map.call(form.querySelectorAll("input[name=" + name + "]:checked"), function (i) { return i.value; });
  }
  function wanted(row) {
    var states = selected("state"), sevs = selected("severity"), site = form.querySelector("input[name=site]").value.trim();
    return (!states.length || states.indexOf(row.state) >= 0) && (!sevs.length || sevs.indexOf(row.severity) >= 0) &&
      (!site || row.site === site);
  }
  var STATE_LABEL = { triggered: "Triggered", acknowledged: "Acknowledged", mitigated: "Mitigated", resolved: "Resolved" };
  function render(row) {
    var tr = document.createElement("tr");
    tr.dataset.id = row.id;
    tr.className = "flash";
    tr.innerHTML = "<td><a href='" + esc(row.url) + "'>#" + row.id + "</a></td><td><span class='sev sev-" + esc(row.severity) + "'>" +
      esc(row.severity) + "</span></td><td><span class='state state-" + esc(row.state) + "'>" + esc(STATE_LABEL[row.state] || row.state) +
      "</span></td><td><a href='" + esc(row.url) + "'>" + esc(row.title) + "</a></td><td>" + esc(row.site || "–") + "</td><td>" +
      esc(row.category) + "</td><td>" + fmtTime(row.detected_at) + "</td><td class='num'>" + row.gpu_hours.toFixed(2) +
      "</td><td>" + esc(row.commander || "–") + "</td>";
    return tr;
  }
  function onDelta(msg) {
    if (msg.type !== "incidents.delta") return;
    Object.keys(msg.open).forEach(function (sev) {
      var el = document.querySelector("[data-open='" + sev + "']");
      if (!el) return;
      el.textContent = msg.open[sev];
      el.closest(".stat").classList.toggle("bad", msg.open[sev] > 0 && (sev === "SEV1" || sev === "SEV2"));
    });
    msg.incidents.slice().reverse().forEach(function (row) {
      var existing = tbody.querySelector("tr[data-id='" + row.id + "']");
      if (!wanted(row)) { if (existing) existing.remove(); return; }
      var fresh = render(row);
      if (existing) { existing.replaceWith(fresh); } else { tbody.insertBefore(fresh, tbody.firstChild); }
      var empty = tbody.querySelector("tr.empty");
      if (empty) empty.remove();
    });
  }
  function snapshot() {
    // After a reconnect the page may have missed deltas: take the server's view of the list.
    var params = new URLSearchParams(new FormData(form));
    return fetch("/api/v1/incidents/?limit=500&ordering=-detected_at&" + params.toString(), { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("incidents " + r.status); return r.json(); })
      .then(function (body) {
        tbody.innerHTML = "";
        body.results.forEach(function (i) {
          tbody.appendChild(render({ id: i.id, title: i.title, severity: i.severity, state: i.state, site: i.labels.site,
            category: i.category, detected_at: i.detected_at, gpu_hours: i.gpu_hours, commander: i.commander,
            url: "/incidents/" + i.id + "/" }));
        });
        if (!body.results.length) tbody.innerHTML = "<tr class='empty'><td colspan='9' class='muted'>No incidents match.</td></tr>";
      });
  }
  // The snapshot after each (re)connect covers anything that changed between the server
  // rendering this page and the subscription taking effect.
  new window.GoodputLive({ topics: ["incidents"], onMessage: onDelta, onSnapshot: snapshot });
})();
