// The live hub client: one websocket per page, topic subscriptions, reconnect with backoff.
// After every (re)connect the page's onSnapshot runs once the server has confirmed the
// subscription: channel layers may drop messages, so a fresh HTTP snapshot taken after the
// socket joined its topics is the source of truth and deltas only move it forward.
//
// Reconnects: a socket that was open reconnects at once, after a random 0-1 s (so a process's
// pages do not all knock in the same millisecond); only repeated failures back off (1 s, 2 s, ...
// up to 10 s, each with +-25 % jitter). The count resets once a socket is subscribed again.
//
// The page says plainly what state it is in (#live-banner, above the content):
// - server restarting (close 1012, sent by a web process that is stopping, console/drain.py): no
//   banner; it reconnects within a second, to another process behind the balancer. Only if that
//   fails too does it say it is paused, as below;
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
  var SERVICE_RESTART = 1012;
  var MOVES_BEFORE_PAUSED = 3;
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

  // The first try after a socket was lost is at once, jittered over a second; later ones back off.
  LiveClient.reconnectDelay = function (attempt) {
    if (attempt === 0) return Math.random() * 1000;
    return Math.min(10000, 500 * Math.pow(2, attempt)) * (0.75 + Math.random() / 2);
  };

  LiveClient.prototype.retry = function () {
    var self = this;
    var delay = LiveClient.reconnectDelay(this.attempt++);
    setTimeout(function () { if (!self.stopped) self.connect(); }, delay);
  };

  LiveClient.prototype.moving = function () {
    this.setStatus("on", "Live: the server is restarting; reconnecting…");
  };

  LiveClient.prototype.connect = function () {
    var self = this;
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + "/ws/live/");
    var opened = false;
    var snapshotTaken = false;
    this.ws = ws;
    // The snapshot is read once the server has answered the subscribe (subscribed, or an error
    // naming what it refused): read earlier, a push sent before the socket joined its topics
    // would be in neither the snapshot nor the socket.
    function snapshot() {
      if (snapshotTaken) return;
      snapshotTaken = true;
      Promise.resolve(self.onSnapshot()).catch(function (err) { console.error("snapshot failed", err); });
    }
    ws.onopen = function () {
      opened = true;
      self.connected();
      ws.send(JSON.stringify({ action: "subscribe", topics: self.topics }));
    };
    ws.onmessage = function (event) {
      var msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      if (msg.type === "error") { console.warn("live:", msg.error); snapshot(); return; }
      if (msg.type === "subscribed") { self.attempt = 0; snapshot(); return; }
      self.onMessage(msg);
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
      if (event.code === SERVICE_RESTART && self.attempt < MOVES_BEFORE_PAUSED) {
        // The process is stopping and handed this page on: no banner, reconnect within a second
        // (a balancer that still sends the page to the stopping process gets the same answer;
        // a few of those, with backoff, before the page says it is paused).
        self.moving();
        self.retry();
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
