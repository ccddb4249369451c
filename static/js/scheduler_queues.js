// The capacity page's scheduler queue panel, kept live: the `scheduler` topic's deltas carry the
// figures of the pools that changed; after each (re)connect the plan API's `queues` part is the snapshot.
// Figures are written into the cells the server rendered (data-pool, data-queue, data-value); a
// queue newly mapped to a pool appears on the next page load.
(function () {
  "use strict";

  var card = document.getElementById("pool-queues");
  if (!card || !window.GoodputLive) return;

  // The same rule as fleet.scheduler.panels.duration.
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
      .then(function (snap) { if (snap) render(snap.queues); });
  }

  function onDelta(msg) {
    if (msg.type === "scheduler.delta") render(msg.pools);
  }

  new window.GoodputLive({ topics: [card.dataset.topic], onMessage: onDelta, onSnapshot: load });
})();
