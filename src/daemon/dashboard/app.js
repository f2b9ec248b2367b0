// The dashboard's one script (served as /ui/app.js, the only script its
// policy allows). Pages read without it; with it, they stay current:
// /ui/live keeps every [data-k] cell of the bundle rows (or of one bundle's
// facts) filled, and a bundle's /logs stream adds its log lines and events.
(function () {
  var page = document.body.dataset;
  if (!page.live) return;
  function fill(root, row) {
    root.querySelectorAll("[data-k]").forEach(function (cell) {
      var k = cell.getAttribute("data-k");
      if (row[k] !== undefined && cell.textContent !== row[k]) {
        cell.textContent = row[k];
        if (k === "state") cell.className = "state " + row[k];
      }
    });
  }
  new EventSource("/ui/live").addEventListener("status", function (e) {
    JSON.parse(e.data).forEach(function (row) {
      if (page.row) {
        var facts = document.getElementById("facts");
        if (row.id === page.row && facts) fill(facts, row);
      } else {
        var tr = document.getElementById(row.id);
        if (tr) fill(tr, row);
      }
    });
  });
  if (!page.base) return;
  var log = document.getElementById("log");
  var events = document.getElementById("events");
  var stream = new EventSource(page.base + "/logs");
  stream.addEventListener("log", function (e) {
    log.appendChild(document.createTextNode(e.data + "\n"));
    log.scrollTop = log.scrollHeight;
  });
  stream.addEventListener("lifecycle", function (e) {
    var d = JSON.parse(e.data);
    var tr = document.createElement("tr");
    ["time", "kind", "state", "message"].forEach(function (k) {
      var td = document.createElement("td");
      td.textContent = d[k];
      tr.appendChild(td);
    });
    var first = events.rows[1];
    if (first) first.parentNode.insertBefore(tr, first);
    else (events.tBodies[0] || events).appendChild(tr);
  });
})();
