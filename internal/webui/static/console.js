// The node console page: one EventSource is one console session (closed, never reopened, when
// it fails: a new one is a new session, which the operator asks for by reloading); typed lines
// are posted with the page's CSRF token.
(function () {
  "use strict";
  var root = document.getElementById("console");
  if (!root) { return; }
  var out = document.getElementById("console-out");
  var status = document.getElementById("console-status");
  var decoder = new TextDecoder();
  var session = "";
  var keep = 200000;
  var csi = /\x1b\[[0-9;?]*[ -\/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]/g;
  function append(text) {
    var stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    out.textContent += text.replace(csi, "").replace(/\r\n/g, "\n").replace(/\r/g, "");
    if (out.textContent.length > keep) { out.textContent = out.textContent.slice(-keep * 3 / 4); }
    if (stick) { out.scrollTop = out.scrollHeight; }
  }
  var es = new EventSource(root.dataset.stream);
  es.addEventListener("session", function (e) { session = e.data; });
  es.addEventListener("status", function (e) {
    status.textContent = e.data;
    if (e.data.indexOf("closed") === 0) { es.close(); }
  });
  es.addEventListener("data", function (e) {
    var bin = atob(e.data);
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    append(decoder.decode(bytes, { stream: true }));
  });
  es.onerror = function () {
    if (es.readyState !== EventSource.CLOSED) {
      es.close();
      status.textContent = "The console's stream was cut: reload the page to open a new session.";
    }
  };
  function send(data) {
    if (!session) { status.textContent = "Not connected yet."; return; }
    var body = new URLSearchParams({ csrf: root.dataset.csrf, session: session, data: data });
    fetch(root.dataset.input, { method: "POST", body: body, credentials: "same-origin" }).then(function (r) {
      if (!r.ok) { return r.text().then(function (t) { status.textContent = "Input refused: " + t; }); }
    });
  }
  var form = document.getElementById("console-form");
  if (form) {
    var line = document.getElementById("console-line");
    form.addEventListener("submit", function (e) { e.preventDefault(); send(line.value + "\r"); line.value = ""; });
    document.getElementById("console-ctrlc").addEventListener("click", function () { send("\x03"); });
  }
})();
