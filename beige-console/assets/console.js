// The console's own script (spec/people.md §3): small conveniences on top of htmx.
// Everything works without it; nothing here renders text from the server or evaluates
// code. No inline handlers anywhere: listeners are attached here.
(function () {
  "use strict";

  // After a prompt is sent: empty the composer and keep it focused.
  document.addEventListener("htmx:afterRequest", function (evt) {
    var form = evt.detail && evt.detail.elt;
    if (!form || !form.classList || !form.classList.contains("composer")) {
      return;
    }
    if (evt.detail.successful) {
      form.reset();
      var box = form.querySelector("textarea");
      if (box) {
        box.focus();
      }
    }
  });

  // Keep the newest part of a running turn in view, unless the user scrolled away.
  document.addEventListener("htmx:sseMessage", function (evt) {
    var turn = evt.target && evt.target.closest ? evt.target.closest(".turn") : null;
    if (!turn) {
      return;
    }
    var nearBottom =
      window.innerHeight + window.scrollY >= document.body.scrollHeight - 160;
    if (nearBottom) {
      turn.scrollIntoView({ block: "end" });
    }
  });

  // Ctrl+Enter (or Cmd+Enter) in the composer sends the message.
  document.addEventListener("keydown", function (evt) {
    var box = evt.target;
    if (evt.key !== "Enter" || !(evt.ctrlKey || evt.metaKey)) {
      return;
    }
    if (!box || box.tagName !== "TEXTAREA" || !box.form) {
      return;
    }
    evt.preventDefault();
    if (box.form.requestSubmit) {
      box.form.requestSubmit();
    } else {
      box.form.submit();
    }
  });

  // A refused htmx request (403, 404, 429) shows the server's words instead of nothing.
  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail && evt.detail.xhr;
    if (!xhr) {
      return;
    }
    var main = document.getElementById("main");
    if (!main) {
      return;
    }
    var note = document.getElementById("console-error");
    if (!note) {
      note = document.createElement("p");
      note.id = "console-error";
      note.className = "error";
      note.setAttribute("role", "alert");
      main.insertBefore(note, main.firstChild);
    }
    var doc = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
    var msg = doc.querySelector(".error");
    note.textContent =
      (msg ? msg.textContent : "") || "The request failed (" + xhr.status + ").";
  });
})();
