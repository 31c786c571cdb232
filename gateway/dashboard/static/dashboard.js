/* hermes-gateway dashboard 1.0.0: live updates over server-sent events. Plain JavaScript, no build step, no
   dependencies; the pages work without it (reload to refresh). Server-rendered fragments come from the gateway's
   own templates (escaped there). */
(function () {
  "use strict";

  var url = document.body.getAttribute("data-events");
  if (!url || !window.EventSource) {
    return;
  }

  function each(selector, fn) {
    Array.prototype.forEach.call(document.querySelectorAll(selector), fn);
  }

  function setStatus(el, status) {
    el.textContent = status;
    el.setAttribute("data-run-status", status);
  }

  var source = new EventSource(url);

  source.addEventListener("overview", function (event) {
    var data = JSON.parse(event.data);
    Object.keys(data.stats).forEach(function (key) {
      each('[data-stat="' + key + '"]', function (el) { el.textContent = String(data.stats[key]); });
    });
    data.adapters.forEach(function (adapter) {
      each('[data-adapter="' + adapter.platform + '"]', function (card) {
        card.setAttribute("data-state", adapter.state);
        var state = card.querySelector(".state");
        var error = card.querySelector(".last-error");
        if (state) { state.textContent = adapter.state; }
        if (error) { error.textContent = adapter.last_error; }
      });
    });
    Object.keys(data.fragments || {}).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { el.innerHTML = data.fragments[id]; }
    });
  });

  source.addEventListener("runs", function (event) {
    var statuses = JSON.parse(event.data);
    Object.keys(statuses).forEach(function (id) {
      each('tr[data-run-id="' + id + '"] [data-run-status]', function (el) { setStatus(el, statuses[id]); });
    });
  });

  source.addEventListener("run", function (event) {
    var data = JSON.parse(event.data);
    var status = document.getElementById("run-status");
    if (status) { setStatus(status, data.status); }
    var live = document.getElementById("run-live");
    if (live) { live.innerHTML = data.html; }
  });
})();
