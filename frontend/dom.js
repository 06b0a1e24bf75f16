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

// A run's state (running, finished, failed, silent) as a coloured badge; its detail on hover.
export const stateBadge = (run) => el("span", { class: `state state-${run.state}`, title: run.state_detail }, run.state);

// Shows `text` in the element with this id, or hides it when text is empty.
export function say(id, text) {
  const node = document.getElementById(id);
  node.textContent = text || "";
  node.hidden = !text;
}

export const PLOT_CONFIG = { displaylogo: false, responsive: true };
