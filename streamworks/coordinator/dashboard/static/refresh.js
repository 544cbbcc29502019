// Live refresh of the dashboard: every few seconds, fetch the panels as an HTML
// fragment and swap them in (no full reload; nothing to build). The session cookie
// goes with the request (same origin); a 401 means the session ended: reload, which
// shows the login form. Paused while the tab is hidden.
(function () {
  "use strict";
  var panels = document.getElementById("panels");
  var live = document.getElementById("live");
  if (!panels) { return; }
  var period = parseInt(panels.getAttribute("data-refresh-ms"), 10) || 2000;
  var src = panels.getAttribute("data-src");
  var busy = false;

  function mark(state) {
    if (live) { live.className = "live " + state; live.textContent = state === "ok" ? "live" : state; }
  }

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(src, { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.status === 401) { window.location.reload(); return null; }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) {
          panels.innerHTML = html;
          panels.setAttribute("data-refreshed", String(Date.now()));
          mark("ok");
        }
      })
      .catch(function () { mark("disconnected"); })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, period);
  document.addEventListener("visibilitychange", refresh);
})();
