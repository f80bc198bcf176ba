// agentstream console: live refresh over server-sent events and forms sent without a reload.
// Served as a file (the content-security policy forbids inline script). Every fragment it inserts
// is rendered and escaped by the server; this script never builds HTML from text.
"use strict";

(function () {
  const FETCH_HEADERS = { "X-Console-Fetch": "1" };
  const RETRY_REFUSED_MS = 30000;
  let running = null;
  let again = false;

  async function refreshAll() {
    for (const element of document.querySelectorAll("[data-refresh]")) {
      const response = await fetch(element.dataset.refresh, { headers: FETCH_HEADERS, credentials: "same-origin" });
      if (response.ok) element.innerHTML = await response.text();
    }
    for (const element of document.querySelectorAll("[data-prepend]")) {
      const url = element.dataset.prepend + "&after=" + encodeURIComponent(element.dataset.after || "0");
      const response = await fetch(url, { headers: FETCH_HEADERS, credentials: "same-origin" });
      if (!response.ok) continue;
      const html = await response.text();
      if (html.trim()) element.insertAdjacentHTML("afterbegin", html);
      const cursor = response.headers.get("X-Journal-Cursor");
      if (cursor) element.dataset.after = cursor;
    }
  }

  // One refresh at a time; changes during one cause exactly one more.
  function schedule() {
    if (running) {
      again = true;
      return;
    }
    running = refreshAll()
      .catch(() => {})
      .finally(() => {
        running = null;
        if (again) {
          again = false;
          schedule();
        }
      });
  }

  function follow() {
    const url = document.body.dataset.live;
    if (!url || !window.EventSource) return;
    const source = new EventSource(url);
    source.addEventListener("change", schedule);
    source.addEventListener("signed-out", () => {
      source.close();
      window.location.assign("/console/login");
    });
    // A refused stream (429: too many open, e.g. many tabs) is not retried by the browser: try
    // again later ourselves, when a slot may be free.
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED) setTimeout(follow, RETRY_REFUSED_MS);
    });
  }

  async function send(form) {
    const status = form.querySelector("[data-form-status]");
    // A form that can attach a file goes as multipart (the browser writes the boundary).
    const data = new FormData(form);
    const multipart = form.enctype === "multipart/form-data";
    const response = await fetch(form.action, {
      method: "POST",
      body: multipart ? data : new URLSearchParams(data),
      headers: FETCH_HEADERS,
      credentials: "same-origin",
    });
    let body = {};
    try {
      body = await response.json();
    } catch (error) {
      body = {};
    }
    if (status) status.textContent = response.ok ? body.detail || "sent" : "refused: " + (body.detail || response.status);
    if (response.ok) {
      const text = form.querySelector("textarea");
      if (text) text.value = "";
      const file = form.querySelector("input[type=file]");
      if (file) file.value = "";
      schedule();
    }
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-async")) return;
    event.preventDefault();
    send(form).catch((error) => {
      const status = form.querySelector("[data-form-status]");
      if (status) status.textContent = "not sent: " + error;
    });
  });

  document.addEventListener("DOMContentLoaded", follow);
})();
