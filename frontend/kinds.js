// Span kinds with their category (compute / communication) and colour, as the service serves them
// (api.spanKinds, GET span-kinds): asked once per page, asked again only after a failure.
import { api } from "./api.js";

let pending = null;

export function spanKinds() {
  if (!pending) {
    pending = api.spanKinds().then(palette).catch((error) => {
      pending = null;
      throw error;
    });
  }
  return pending;
}

function palette(served) {
  const kinds = new Map(served.kinds.map((k) => [k.kind, k]));
  const categories = new Map(served.categories.map((c) => [c.category, c.color]));
  return {
    order: served.kinds.map((k) => k.kind), // the legend's order
    kind: (kind) => kinds.get(kind) || { kind, category: "other", color: "#777" },
    category: (name) => categories.get(name) || "#777",
    // a block's span (a layer of a model or of a pipeline stage), nested in its model's or stage's
    isBlock: (span) => Boolean(span.name) && span.name.includes(served.block_separator)
      && kinds.get(span.kind)?.category === "compute",
  };
}
