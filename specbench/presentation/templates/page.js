(function () {
  "use strict";
  function numeric(rows, col) {
    var seen = false;
    for (var i = 0; i < rows.length; i++) {
      var c = rows[i].cells[col];
      if (!c || c.hasAttribute("data-missing")) continue;
      if (!c.hasAttribute("data-v")) return false;
      seen = true;
    }
    return seen;
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
    var up = th.getAttribute("aria-sort") !== "ascending";
    var rows = Array.prototype.slice.call(body.rows);
    var isNum = numeric(rows, col);
    rows.sort(function (a, b) {
      var ca = a.cells[col], cb = b.cells[col];
      var ma = !ca || ca.hasAttribute("data-missing"), mb = !cb || cb.hasAttribute("data-missing");
      if (ma || mb) return ma === mb ? 0 : (ma ? 1 : -1);
      var d = isNum ? parseFloat(ca.getAttribute("data-v")) - parseFloat(cb.getAttribute("data-v"))
                    : ca.textContent.localeCompare(cb.textContent);
      return up ? d : -d;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(th); }
    });
  });
  document.querySelectorAll("input.subtask").forEach(function (box) {
    box.addEventListener("change", function () {
      var table = document.getElementById(box.getAttribute("data-table"));
      table.querySelectorAll("[data-col]").forEach(function (cell) {
        if (cell.getAttribute("data-col") === box.getAttribute("data-col")) cell.classList.toggle("off", !box.checked);
      });
    });
  });
  document.querySelectorAll("select.pick-section").forEach(function (sel) {
    sel.addEventListener("change", function () {
      var block = document.getElementById(sel.getAttribute("data-block"));
      block.querySelectorAll("section.group").forEach(function (s) {
        s.classList.toggle("off", sel.value !== "" && s.id !== sel.value);
      });
    });
  });
})();
