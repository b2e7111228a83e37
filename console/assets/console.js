// The console's only script besides htmx (the Content-Security-Policy allows no inline script): selection
// checkboxes, and pausing a list's refresh while the operator has a selection, so a refresh never drops it.
(function () {
  "use strict";

  function selectedIn(root) {
    return root.querySelectorAll("input.sel:checked").length;
  }

  function showCount(form) {
    var out = form.querySelector(".selected");
    if (!out) return;
    var n = selectedIn(form);
    out.textContent = n ? n + " selected (refresh paused)" : "";
  }

  document.addEventListener("change", function (e) {
    var t = e.target;
    if (!(t instanceof HTMLInputElement)) return;
    var form = t.form;
    if (!form) return;
    if (t.classList.contains("sel-all")) {
      form.querySelectorAll("input.sel").forEach(function (c) { c.checked = t.checked; });
    }
    if (t.classList.contains("sel") || t.classList.contains("sel-all")) showCount(form);
  });

  function isPoll(e) {
    var elt = e.detail && e.detail.elt;
    return elt && elt.classList && elt.classList.contains("poll");
  }

  // A refresh replaces the rows: skip it while anything is ticked.
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (isPoll(e) && selectedIn(document) > 0) e.preventDefault();
  });
  // And drop the answer of one already on its way when the operator ticked meanwhile.
  document.addEventListener("htmx:beforeSwap", function (e) {
    if (isPoll(e) && selectedIn(document) > 0) e.detail.shouldSwap = false;
  });
})();
