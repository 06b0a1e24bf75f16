"use strict";
// Small helpers shared by the pages.
const bs = {
  async getJson(path) {
    const response = await fetch(path, { headers: { Accept: "application/json" } });
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try { const body = await response.json(); message = body.detail.map((d) => d.msg).join("; "); } catch (_) { /* keep status */ }
      const error = new Error(message);
      error.status = response.status;
      throw error;
    }
    return response.json();
  },
  // Runs `load` now and every `ms` ms, until the page learns its run does not exist (bs.missing).
  poll(load, ms) {
    load();
    const timer = setInterval(() => (bs.missing ? clearInterval(timer) : load()), ms);
  },
  missing: false,
  ms(ns) { return (ns / 1e6).toFixed(1); },
  pct(part, whole) { return whole ? `${((100 * part) / whole).toFixed(1)}%` : "—"; },
  el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    for (const child of children) node.append(child);
    return node;
  },
  cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; },
  // A run's state (running, finished, failed, silent) as a coloured badge; its detail on hover.
  stateBadge(run) {
    return bs.el("span", { class: `state state-${run.state}`, title: run.state_detail }, run.state);
  },
  fact(label, value, small) {
    return bs.el("div", { class: "fact" }, bs.el("div", { class: "label" }, label), bs.el("div", { class: small ? "value small" : "value" }, value));
  },
};
