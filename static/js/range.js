// The time range every page with charts shares (templates/_range_control.html): a preset
// (?range=1h) or a custom window (?from=2024-05-01T02:10:00Z&to=2024-05-01T02:40:00Z, UTC), kept
// in the page's URL so a link or a reload shows the same view. Dragging across a chart zooms to
// the dragged span: it becomes the custom window, in the URL, read again from the server (which
// picks raw samples, minute or hour rollups for it). A window the server refuses is shown beside
// the control with the reason it gave (400 naming from, to or range).
//
// A page makes one: var range = new GoodputRange({ onChange: load }); then fetches
// range.fetchJson(url) instead of fetch(url), calls range.zoomOn(chartIds) once its charts are
// drawn, and skips its live chart appends while range.isCustom() (a custom window stays put).
(function () {
  "use strict";

  function el(id) { return document.getElementById(id); }
  function isoZ(ms) { return new Date(ms).toISOString().slice(0, 19) + "Z"; }
  // <input type="datetime-local"> holds wall-clock text: the console's times are UTC.
  function toInput(ms) { return isNaN(ms) ? "" : new Date(ms).toISOString().slice(0, 19); }
  function fromInput(text) { return text ? Date.parse(text + (text.length === 16 ? ":00" : "") + "Z") : NaN; }
  // Plotly's date axes report wall-clock text ("2024-05-01 02:10:33.512"); the charts draw UTC.
  function plotlyMs(value) {
    if (typeof value === "number") return value;
    var text = String(value).replace(" ", "T");
    return Date.parse(/(Z|[+-]\d\d:?\d\d)$/.test(text) ? text : text + "Z");
  }
  function clock(ms) {
    var d = new Date(ms).toISOString();
    return d.slice(0, 10) + " " + d.slice(11, 16);
  }

  function RangeControl(opts) {
    this.onChange = opts.onChange;
    this.select = el("range");
    this.box = el("range-custom");
    this.from = null;  // the custom window's ends as the URL gives them (text); null for a preset
    this.to = null;
    this.fallback = this.select.value;  // the page's default preset
    var self = this;
    this.readUrl();
    this.select.addEventListener("change", function () {
      if (self.select.value === "custom") {
        // Start from the window on screen; nothing is read until Apply.
        var now = Date.now();
        el("range-from").value = el("range-from").value || toInput(now - 3600000);
        el("range-to").value = el("range-to").value || toInput(now);
        self.box.hidden = false;
        return;
      }
      self.from = self.to = null;
      self.box.hidden = true;
      self.push();
    });
    el("range-apply").addEventListener("click", function () {
      var start = fromInput(el("range-from").value), end = fromInput(el("range-to").value);
      if (isNaN(start) || isNaN(end)) { self.error("Give both from and to."); return; }
      self.set(start, end);
    });
    window.addEventListener("popstate", function () { self.readUrl(); self.reload(); });
  }

  // Read the page again for the new window.
  RangeControl.prototype.reload = function () {
    Promise.resolve(this.onChange()).catch(function (err) { console.error("snapshot failed", err); });
  };

  // The URL's window onto the control: from / to (custom) or range (a preset), else the default.
  RangeControl.prototype.readUrl = function () {
    var params = new URLSearchParams(window.location.search);
    this.error("");
    if (params.get("from") !== null || params.get("to") !== null) {
      this.from = params.get("from") || "";
      this.to = params.get("to") || "";
      this.select.value = "custom";
      el("range-from").value = toInput(Date.parse(this.from));
      el("range-to").value = toInput(Date.parse(this.to));
      this.box.hidden = false;
      return;
    }
    this.from = this.to = null;
    this.box.hidden = true;
    var key = params.get("range");
    var known = key !== null && Array.prototype.some.call(this.select.options, function (o) { return o.value === key && key !== "custom"; });
    this.select.value = known ? key : this.fallback;
  };

  RangeControl.prototype.isCustom = function () { return this.from !== null; };

  // The query the page's read takes: from=...&to=... or range=... ("" for a page's own default).
  RangeControl.prototype.query = function () {
    if (this.isCustom()) return "from=" + encodeURIComponent(this.from) + "&to=" + encodeURIComponent(this.to);
    return this.select.value ? "range=" + encodeURIComponent(this.select.value) : "";
  };

  // What the window is called in the page's text ("over 24h", "over 2024-05-01 02:10 – 02:40 UTC").
  RangeControl.prototype.label = function () {
    if (!this.isCustom()) return this.select.value || "";
    var a = clock(Date.parse(this.from)), b = clock(Date.parse(this.to));
    return a + " – " + (a.slice(0, 10) === b.slice(0, 10) ? b.slice(11) : b) + " UTC";
  };

  // A custom window [start, end) in ms: into the URL (a new history entry) and read.
  RangeControl.prototype.set = function (start, end) {
    if (!(end > start)) { this.error("to must be after from."); return; }
    this.from = isoZ(start);
    this.to = isoZ(Math.ceil(end / 1000) * 1000);
    this.select.value = "custom";
    el("range-from").value = toInput(Date.parse(this.from));
    el("range-to").value = toInput(Date.parse(this.to));
    this.box.hidden = false;
    this.push();
  };

  RangeControl.prototype.push = function () {
    var params = new URLSearchParams(window.location.search);
    ["range", "from", "to"].forEach(function (k) { params.delete(k); });
    if (this.isCustom()) { params.set("from", this.from); params.set("to", this.to); }
    else if (this.select.value && this.select.value !== this.fallback) params.set("range", this.select.value);
    var text = params.toString();
    window.history.pushState(null, "", window.location.pathname + (text ? "?" + text : "") + window.location.hash);
    this.error("");
    this.reload();
  };

  RangeControl.prototype.error = function (message) {
    var box = el("range-error");
    box.textContent = message;
    box.hidden = !message;
  };

  // fetch(url + the window) as JSON; a refused window (400) is shown beside the control, and the
  // promise never settles.
  RangeControl.prototype.fetchJson = function (url) {
    var self = this;
    var q = this.query();
    return fetch(url + (q ? (url.indexOf("?") < 0 ? "?" : "&") + q : ""), { credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 400) {
          return r.json().then(function (body) {
            self.error(Object.keys(body).map(function (k) { return k + ": " + body[k]; }).join(" "));
            // Nothing to draw, and nothing failed: the page keeps what it shows, the reason is
            // beside the control, and the next window (or reconnect) reads again.
            return new Promise(function () {});
          });
        }
        if (!r.ok) throw new Error("snapshot " + r.status);
        self.error("");
        return r.json();
      });
  };

  // Dragging across one of these charts (Plotly's zoom) makes the dragged span the window.
  RangeControl.prototype.zoomOn = function (ids) {
    var self = this;
    ids.forEach(function (id) {
      var gd = typeof id === "string" ? el(id) : id;
      if (!gd || gd.goodputZoom || !gd.on) return;
      gd.goodputZoom = true;
      gd.on("plotly_relayout", function (ev) {
        // A drag reports both ends; the page's own relayouts (following live data) send
        // "xaxis.range" whole, and a double-click autorange neither.
        if (ev["xaxis.range[0]"] === undefined || ev["xaxis.range[1]"] === undefined) return;
        self.set(plotlyMs(ev["xaxis.range[0]"]), plotlyMs(ev["xaxis.range[1]"]));
      });
    });
  };

  window.GoodputRange = RangeControl;
})();
