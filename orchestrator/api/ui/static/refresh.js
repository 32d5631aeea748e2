// Progressive enhancement: with JavaScript on, offer to reload the page every N seconds (the
// choice is remembered in this browser). Every page works without it.
(function () {
  "use strict";
  var box = document.querySelector("[data-refresh]");
  var input = document.getElementById("auto-refresh");
  if (!box || !input) { return; }
  var seconds = parseInt(box.getAttribute("data-refresh"), 10) || 30;
  var key = "burst-ui-refresh";
  var timer = null;
  function schedule() {
    if (timer) { clearTimeout(timer); timer = null; }
    if (input.checked) { timer = setTimeout(function () { window.location.reload(); }, seconds * 1000); }
  }
  try { input.checked = window.localStorage.getItem(key) === "on"; } catch (e) { input.checked = false; }
  input.addEventListener("change", function () {
    try { window.localStorage.setItem(key, input.checked ? "on" : "off"); } catch (e) { /* private mode */ }
    schedule();
  });
  box.hidden = false;
  schedule();
}());
