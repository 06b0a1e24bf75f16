// Building and updating page elements.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

export function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

export function fact(label, value, small) {
  return el("div", { class: "fact" }, el("div", { class: "label" }, label), el("div", { class: small ? "value small" : "value" }, value));
}

// A run's state (running, hung, finished, failed, silent) as a coloured badge; its detail on hover.
export const stateBadge = (run) => el("span", { class: `state state-${run.state}`, title: run.state_detail }, run.state);

// Shows `text` in the element with this id, or hides it when text is empty.
export function say(id, text) {
  const node = document.getElementById(id);
  node.textContent = text || "";
  node.hidden = !text;
}

export const PLOT_CONFIG = { displaylogo: false, responsive: true };

// plotly.js (4.8 MB, ~0.8 s of the browser's main thread to run) is loaded by the first call here,
// which a page makes once it has asked for its data: the requests go out first, the library loads
// while the service answers them, and each chart waits for it.
let plotlyLoaded = null;
export function plotly() {
  plotlyLoaded ??= new Promise((resolve, reject) => {
    if (window.Plotly) return resolve(window.Plotly);
    const tag = el("script", { src: "/vendor/plotly.min.js" });
    tag.addEventListener("load", () => resolve(window.Plotly));
    tag.addEventListener("error", () => reject(new Error("the chart library did not load")));
    document.head.append(tag);
  });
  return plotlyLoaded;
}

// Draws (or redraws) the chart in element `id`, once plotly is there; resolves when it is drawn.
export function plot(id, traces, layout) {
  return plotly().then((Plotly) => Plotly.react(id, traces, layout, PLOT_CONFIG));
}

// A re-run (config compare_with: the run it changes) links to the two side by side, the earlier one first.
export function comparedLink(before, after) {
  const href = `/compare?${new URLSearchParams({ a: before, b: after })}`;
  return el("a", { class: "compare-pair", href, title: `${before} (before) and ${after} (after), side by side` }, "compare with the run before");
}
