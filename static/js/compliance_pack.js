// The compliance pack page: poll the API once a second for each pack still queued or running,
// and move its status, progress bar and step; once done, show its size, hash and download link.
(function () {
  "use strict";
  var FINAL = { done: true, failed: true };
  var LABELS = { queued: "Queued", running: "Running", done: "Done", failed: "Failed" };

  function field(row, name) { return row.querySelector('[data-field="' + name + '"]'); }

  function humanSize(bytes) {
    var units = ["bytes", "KB", "MB", "GB"];
    var i = 0;
    while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i += 1; }
    return (i ? bytes.toFixed(1) : String(bytes)) + "\u00a0" + units[i];
  }

  function show(row, pack) {
    row.dataset.status = pack.status;
    var status = field(row, "status");
    status.textContent = LABELS[pack.status] || pack.status;
    status.className = "pack-status pack-" + pack.status;
    field(row, "progress").value = pack.progress;
    field(row, "step").textContent = pack.status === "failed" ? pack.error : pack.step;
    if (pack.status !== "done") { return; }
    field(row, "size").textContent = humanSize(pack.size);
    var hash = field(row, "sha256");
    hash.textContent = pack.sha256.slice(0, 12) + "\u2026";
    hash.title = pack.sha256;
    var link = document.createElement("a");
    link.href = pack.download_url;
    link.setAttribute("download", "");
    link.textContent = "Download";
    field(row, "download").replaceChildren(link);
  }

  function poll() {
    var rows = Array.prototype.filter.call(document.querySelectorAll("tr[data-pack]"), function (row) {
      return !FINAL[row.dataset.status];
    });
    if (!rows.length) { return; }
    Promise.all(rows.map(function (row) {
      return fetch(row.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (pack) { if (pack) { show(row, pack); } })
        .catch(function () { /* a missed poll: the next one catches up */ });
    })).then(function () { window.setTimeout(poll, 1000); });
  }

  window.setTimeout(poll, 1000);
})();
