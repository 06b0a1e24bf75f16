// The causes of a bubble the analysis names, with the label and colour every page shows them with, as the
// service serves them (api.bubbleCauses, GET bubble-causes: analysis.CAUSE_KINDS, backend/web/bubble_causes.py).
// loadCauses() before drawing; asked once per page, asked again only after a failure.
import { api } from "./api.js";

let served = new Map();
let pending = null;

export function loadCauses() {
  if (!pending) {
    pending = api.bubbleCauses().then((answer) => {
      served = new Map(answer.causes.map((c) => [c.name, c]));
    }).catch((error) => {
      pending = null;
      throw error;
    });
  }
  return pending;
}

export const cause = (name) => served.get(name) || { name, label: name.replaceAll("_", " "), color: "#777" };
