// The scheduler queue figures, kept live on the capacity page (its queue panel and the wait beside
// each team's quota) and on a team's page (its queues and its quota table): the `scheduler` topic's
// deltas carry the figures of the pools that changed and each team's wait beside its quota on them
// (`quota_waits`, fleet.scheduler.read.quota_waits); after each (re)connect the plan API's `queues`
// and `quota_waits` parts are the snapshot. Figures are written into the cells the server rendered
// (data-pool, data-queue, data-team, data-value); a queue newly mapped to a pool appears on the next
// page load.
(function () {
  "use strict";

  var card = document.querySelector("[data-scheduler-live]");
  if (!card || !window.GoodputLive) return;

  // The same rule as fleet.scheduler.read.duration.
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 90 * 60) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function count(value) {
    return value === null || value === undefined ? "–" : String(Math.round(value));
  }

  function wait(w) {
    return w ? duration(w.p50) + " / " + duration(w.p95) : "– / –";
  }

  function set(scope, key, text) {
    var el = scope.querySelector('[data-value="' + key + '"]');
    if (el) el.textContent = text;
  }

  function attr(value) {
    return window.CSS && CSS.escape ? CSS.escape(String(value)) : String(value).replace(/["\\]/g, "\\$&");
  }

  // Each team's p95 wait over 1 h beside its quota: the text the server computed, never worked out here.
  function renderWaits(waits) {
    (waits || []).forEach(function (w) {
      var selector = 'tr[data-pool="' + w.pool + '"][data-team="' + attr(w.team) + '"] [data-value="queue_wait"]';
      document.querySelectorAll(selector).forEach(function (cell) {
        cell.textContent = w.text;
        cell.title = w.title;
      });
    });
  }

  function render(pools) {
    (pools || []).forEach(function (f) {
      var section = card.querySelector('section[data-pool="' + f.pool + '"]');
      if (!section) return;
      set(section, "gpus_allocated", count(f.gpus_allocated));
      set(section, "gpus_reserved", count(f.gpus_reserved));
      set(section, "nodes_drained", count(f.nodes_drained));
      set(section, "nodes_down", count(f.nodes_down));
      var gpus = section.querySelector('[data-field="gpus"]');
      if (gpus) gpus.classList.toggle("warn-text", f.gpus_allocated !== null && f.gpus_allocated > f.gpus_reserved);
      f.queues.forEach(function (q) {
        var row = section.querySelector('tr[data-queue="' + q.id + '"]');
        if (!row) return;
        set(row, "pending", count(q.pending));
        set(row, "inadmissible", count(q.inadmissible));
        set(row, "wait_1h", wait(q.wait_1h));
        set(row, "wait_24h", wait(q.wait_24h));
        set(row, "evicted", count(q.evicted));
        set(row, "preempted", count(q.preempted));
        set(row, "gpus_allocated", count(q.gpus_allocated));
        row.classList.toggle("row-warn", Boolean(q.inadmissible));
      });
    });
  }

  function load() {
    return fetch(card.dataset.snapshotUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (snap) {
        if (!snap) return;
        render(snap.queues);
        renderWaits(snap.quota_waits);
      });
  }

  function onDelta(msg) {
    if (msg.type !== "scheduler.delta") return;
    render(msg.pools);
    renderWaits(msg.quota_waits);
  }

  new window.GoodputLive({ topics: [card.dataset.topic], onMessage: onDelta, onSnapshot: load });
})();
