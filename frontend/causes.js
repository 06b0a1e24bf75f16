// The causes of a bubble the analysis names, with the label and colour every page shows them with, as the
// service serves them (api.bubbleCauses, GET bubble-causes: analysis.CAUSE_KINDS, backend/web/bubble_causes.py).
// loadCauses() before drawing: asked once per page; when it fails, the names stand in (grey) and the next
// draw asks again.
import { api } from "./api.js";

let served = new Map();
let pending = null;

export function loadCauses() {
  if (!pending) {
    pending = api.bubbleCauses().then((answer) => {
      served = new Map(answer.causes.map((c) => [c.name, c]));
    }).catch(() => {
      pending = null; // not fatal: the analysis is drawn with the names, and the next draw asks again
    });
  }
  return pending;
}

export const cause = (name) => served.get(name) || { name, label: name.replaceAll("_", " "), color: "#777" };
