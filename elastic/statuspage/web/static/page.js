// The status page refreshes its changing part every sample period: it fetches the part,
// rendered by the server, and swaps it in, so the page never reloads as a whole. A page whose
// login has lapsed reloads, which leads to the login form.
"use strict";
(function () {
  const main = document.getElementById("main");
  const conn = document.getElementById("conn");
  if (!main) {
    return;
  }
  const every = Math.max(200, Number(main.dataset.refresh) || 1000);
  let inFlight = false;
  async function refresh() {
    if (inFlight) {
      return;
    }
    inFlight = true;
    try {
      const r = await fetch("fragment", { cache: "no-store", credentials: "same-origin" });
      if (r.status === 401) {
        location.reload();
        return;
      }
      if (!r.ok) {
        throw new Error(r.status + " " + r.statusText);
      }
      main.innerHTML = await r.text();
      conn.textContent = "";
      conn.className = "";
    } catch (e) {
      conn.textContent = "not updating: " + e.message;
      conn.className = "lost";
    } finally {
      inFlight = false;
    }
  }
  setInterval(refresh, every);
})();
