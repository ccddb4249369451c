// The live hub client: one websocket per page, topic subscriptions, reconnect with backoff.
// After every (re)connect the page's onSnapshot runs first: channel layers may drop messages,
// so a fresh HTTP snapshot is the source of truth and deltas only move it forward.
(function () {
  "use strict";

  function LiveClient(opts) {
    this.topics = opts.topics;
    this.onMessage = opts.onMessage;
    this.onSnapshot = opts.onSnapshot;
    this.statusEl = document.getElementById("live-status");
    this.attempt = 0;
    this.connect();
  }

  LiveClient.prototype.setStatus = function (state, title) {
    if (!this.statusEl) return;
    this.statusEl.className = "live-dot " + state;
    this.statusEl.title = title;
  };

  LiveClient.prototype.connect = function () {
    var self = this;
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + "/ws/live/");
    this.ws = ws;
    ws.onopen = function () {
      self.attempt = 0;
      self.setStatus("on", "Live: connected");
      ws.send(JSON.stringify({ action: "subscribe", topics: self.topics }));
      Promise.resolve(self.onSnapshot()).catch(function (err) { console.error("snapshot failed", err); });
    };
    ws.onmessage = function (event) {
      var msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      if (msg.type === "error") { console.warn("live:", msg.error); return; }
      if (msg.type !== "subscribed") self.onMessage(msg);
    };
    ws.onclose = function (event) {
      if (event.code === 4401 || event.code === 4403) {
        self.setStatus("off", "Live updates refused: sign in again");
        return;
      }
      self.setStatus("off", "Live: reconnecting…");
      var delay = Math.min(10000, 500 * Math.pow(2, self.attempt++)) * (0.75 + Math.random() / 2);
      setTimeout(function () { self.connect(); }, delay);
    };
  };

  window.GoodputLive = LiveClient;
})();
