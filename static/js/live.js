// The live hub client: one websocket per page, topic subscriptions, reconnect with backoff.
// After every (re)connect the page's onSnapshot runs first: channel layers may drop messages,
// so a fresh HTTP snapshot is the source of truth and deltas only move it forward.
//
// The page says plainly what state it is in (#live-banner, above the content):
// - socket down: "Live updates paused since HH:MM:SS UTC", while it reconnects with backoff;
// - session gone (close 4401, or a refused handshake whose page now answers 401/403 or a redirect
//   to sign in): it stops reconnecting and links to the sign-in page;
// - too many live pages open for this user (close 4429): it says so and tries again in about a
//   minute, not in a tight loop;
// - more topics than a socket may follow (close 4413): it says so and stops.
(function () {
  "use strict";

  var LOGIN_URL = "/accounts/login/";
  var SIGNED_OUT = 4401;
  var FORBIDDEN = 4403;
  var TOO_MANY_TOPICS = 4413;
  var TOO_MANY_SOCKETS = 4429;
  var SOCKETS_RETRY_MS = 60000;

  function LiveClient(opts) {
    this.topics = opts.topics;
    this.onMessage = opts.onMessage;
    this.onSnapshot = opts.onSnapshot;
    this.statusEl = document.getElementById("live-status");
    this.attempt = 0;
    this.pausedSince = null;
    this.stopped = false;
    this.connect();
  }

  // Times on the console are UTC (the footer says so).
  function clock(date) {
    return date.toISOString().slice(11, 19);
  }

  function banner() {
    var el = document.getElementById("live-banner");
    if (!el) {
      el = document.createElement("div");
      el.id = "live-banner";
      el.setAttribute("role", "status");
      var main = document.querySelector("main") || document.body;
      main.insertBefore(el, main.firstChild);
    }
    return el;
  }

  LiveClient.prototype.setStatus = function (state, title) {
    if (!this.statusEl) return;
    this.statusEl.className = "live-dot " + state;
    this.statusEl.title = title;
  };

  LiveClient.prototype.connected = function () {
    this.pausedSince = null;
    this.setStatus("on", "Live: connected");
    var el = document.getElementById("live-banner");
    if (el) { el.hidden = true; el.textContent = ""; }
  };

  LiveClient.prototype.paused = function () {
    if (!this.pausedSince) this.pausedSince = new Date();
    var text = "Live updates paused since " + clock(this.pausedSince) + " UTC";
    this.setStatus("off", text + "; reconnecting…");
    var el = banner();
    el.className = "live-banner paused";
    el.textContent = text + ": what you see is as of then. Reconnecting…";
    el.hidden = false;
  };

  LiveClient.prototype.signedOut = function (code) {
    this.stopped = true;
    var text = code === FORBIDDEN
      ? "Your account no longer has access to this page, so it has stopped updating."
      : "Your session has ended, so this page has stopped updating.";
    this.setStatus("off", text);
    var el = banner();
    el.className = "live-banner gone";
    el.textContent = text + " ";
    var link = document.createElement("a");
    link.href = LOGIN_URL + "?next=" + encodeURIComponent(window.location.pathname + window.location.search);
    link.textContent = "Sign in again";
    el.appendChild(link);
    el.hidden = false;
  };

  // Refused by a limit: say which, and either wait a while (sockets free up as tabs close) or stop.
  LiveClient.prototype.limited = function (code, reason) {
    var text;
    if (code === TOO_MANY_SOCKETS) {
      text = "Live updates paused: you have too many live pages open (" + (reason || "a limit per user") +
        "). Close some tabs; this page tries again in about a minute.";
    } else {
      this.stopped = true;
      text = "This page follows more live topics than the server allows (" + (reason || "a limit per page") +
        "), so it has stopped updating. Reload it to see the current state.";
    }
    this.setStatus("off", text);
    var el = banner();
    el.className = "live-banner limited";
    el.textContent = text;
    el.hidden = false;
  };

  // A refused handshake reaches the page as a bare failed connect: ask the page itself over
  // HTTP whether the session still holds. Anything else (server down, 5xx) is a pause.
  LiveClient.prototype.checkSession = function () {
    var self = this;
    return fetch(window.location.pathname + window.location.search, {
      method: "HEAD", credentials: "same-origin", redirect: "manual", cache: "no-store",
    }).then(function (response) {
      if (response.type === "opaqueredirect" || response.status === 401) return SIGNED_OUT;
      if (response.status === 403) return FORBIDDEN;
      return null;
    }, function () { return null; }).then(function (code) {
      if (code) self.signedOut(code);
      return code;
    });
  };

  LiveClient.prototype.retry = function () {
    var self = this;
    var delay = Math.min(10000, 500 * Math.pow(2, this.attempt++)) * (0.75 + Math.random() / 2);
    setTimeout(function () { if (!self.stopped) self.connect(); }, delay);
  };

  LiveClient.prototype.connect = function () {
    var self = this;
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + "/ws/live/");
    var opened = false;
    this.ws = ws;
    ws.onopen = function () {
      opened = true;
      self.attempt = 0;
      self.connected();
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
      if (event.code === SIGNED_OUT || event.code === FORBIDDEN) {
        self.signedOut(event.code);
        return;
      }
      if (event.code === TOO_MANY_TOPICS || event.code === TOO_MANY_SOCKETS) {
        self.limited(event.code, event.reason);
        if (!self.stopped) {
          var delay = SOCKETS_RETRY_MS * (0.75 + Math.random() / 2);
          setTimeout(function () { if (!self.stopped) self.connect(); }, delay);
        }
        return;
      }
      self.paused();
      if (opened) {
        self.retry();
        return;
      }
      self.checkSession().then(function (code) { if (!code) self.retry(); });
    };
  };

  window.GoodputLive = LiveClient;
})();
