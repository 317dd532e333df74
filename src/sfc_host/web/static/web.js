// sfc-host web view: refreshes the scopes and jobs tables, and keeps a job page live
// through Server-Sent Events (chart colours, tables, deadline countdowns). Everything
// inserted as HTML was rendered and escaped by the server; text set here goes through
// textContent.
"use strict";

const STATES = ["active", "finished", "failed", "held"];
let serverOffset = 0;   // the server's clock minus this browser's (ms)

function refreshing(el) {
  const every = Number(el.dataset.every) || 2000;
  const tick = async () => {
    if (!document.hidden) {
      try {
        const r = await fetch(el.dataset.refresh, { credentials: "same-origin" });
        if (r.ok) el.innerHTML = await r.text();
      } catch (e) {
        // the server is away for a moment: the next tick tries again
      }
    }
    setTimeout(tick, every);
  };
  setTimeout(tick, every);
}

function mark(g, cls) {
  for (const s of STATES) g.classList.toggle(s, s === cls);
}

function recolour(steps, actions, held) {
  const chart = document.getElementById("chart");
  if (!chart) return;
  chart.classList.toggle("held", held);
  const s = new Map(Object.entries(steps));
  const a = new Map(Object.entries(actions));
  for (const g of chart.querySelectorAll("g.step")) mark(g, s.get(g.getAttribute("data-name")));
  for (const g of chart.querySelectorAll("g.action")) mark(g, a.get(g.getAttribute("data-name")));
}

function countdown() {
  const now = Date.now() + serverOffset;
  for (const td of document.querySelectorAll("td.due")) {
    const due = Number(td.dataset.due);
    if (td.dataset.held) {
      // held: work deadlines stand still and move on by the hold's length at release
      td.textContent = ((due - Number(td.dataset.held)) / 1000).toFixed(1) + " s left at release";
    } else {
      const left = (due - now) / 1000;
      td.textContent = left >= 0 ? "in " + left.toFixed(0) + " s" : (-left).toFixed(0) + " s overdue";
    }
  }
}

function live(root) {
  serverOffset = Number(root.dataset.serverMs) - Date.now();
  countdown();
  setInterval(countdown, 1000);
  const status = document.createElement("p");
  status.className = "live-status";
  root.prepend(status);
  const events = new EventSource(root.dataset.live);
  events.onopen = () => { status.textContent = "live"; status.classList.remove("bad"); };
  events.onerror = () => { status.textContent = "reconnecting…"; status.classList.add("bad"); };
  events.onmessage = (ev) => {
    const d = JSON.parse(ev.data);
    if (d.error) {
      status.textContent = d.error;
      status.classList.add("bad");
      return;
    }
    status.textContent = "live";
    status.classList.remove("bad");
    serverOffset = d.server_ms - Date.now();
    for (const [id, html] of Object.entries(d.parts)) {
      const el = document.getElementById(id);
      if (el) el.innerHTML = html;
    }
    recolour(d.steps, d.actions, d.held);
    countdown();
  };
  window.addEventListener("pagehide", () => events.close());
}

document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("[data-refresh]")) refreshing(el);
  const root = document.getElementById("live");
  if (root) live(root);
});
