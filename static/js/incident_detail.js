// Incident page: when the incident changes elsewhere (a finding joins or clears, someone acts,
// the hold-down resolves it), reload to show it, unless the user is in the middle of typing;
// then say so instead of throwing their text away.
(function () {
  "use strict";
  var page = JSON.parse(document.getElementById("incident-live").textContent);
  var rendered = Date.parse(page.updated_at);
  var dirty = false;
  document.addEventListener("input", function () { dirty = true; });
  // Once a form is on its way, the change it makes comes back as a delta before the answer
  // arrives; reloading then would abort the user's own navigation and lose its answer.
  var leaving = false;
  document.addEventListener("submit", function () { leaving = true; });
  window.addEventListener("pagehide", function () { leaving = true; });
  var banner = document.getElementById("incident-changed");
  // A select marked data-autosubmit sends its form on change (a listener, not an inline
  // onchange: the Content-Security-Policy allows no inline script).
  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("select[data-autosubmit]")) { leaving = true; event.target.form.submit(); }
  });

  function onDelta(msg) {
    if (msg.type !== "incidents.delta" || leaving) return;
    msg.incidents.forEach(function (row) {
      if (row.id !== page.id || Date.parse(row.updated_at) <= rendered) return;
      if (dirty) { banner.hidden = false; } else { window.location.reload(); }
    });
  }
  new window.GoodputLive({ topics: ["incidents"], onMessage: onDelta, onSnapshot: function () { return Promise.resolve(); } });
})();
