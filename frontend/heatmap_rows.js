// The straggler heat map's rows. Up to FOLD_PAST_ROWS ranks, a row per rank. Past it a row is thinner
// than a pixel and a lone slow rank vanishes, so ranks are folded like the timeline folds replicas: each
// stage's ranks, in rank order, in runs of `size` (about FOLDED_ROWS rows in all), each cell the slowest
// of its run, so a slow rank still reddens its row and a slow stage is still a band.
export const FOLD_PAST_ROWS = 1024;
const FOLDED_ROWS = 256;

// Rows as lists of the view's row indexes (view.ranks order), and how many ranks a folded row holds.
export function heatmapRows(view) {
  const count = view.ranks.length;
  if (count <= FOLD_PAST_ROWS) return { rows: view.ranks.map((_, i) => [i]), size: 1 };
  const byStage = new Map();
  view.ranks.forEach((_, i) => {
    const stage = view.stages[i];
    if (!byStage.has(stage)) byStage.set(stage, []);
    byStage.get(stage).push(i);
  });
  const size = Math.ceil(count / FOLDED_ROWS);
  const stages = [...byStage.keys()].sort((a, b) => (a ?? -1) - (b ?? -1)); // unknown stage first
  const rows = [];
  for (const stage of stages) {
    const members = byStage.get(stage).sort((a, b) => view.ranks[a] - view.ranks[b]);
    for (let k = 0; k < members.length; k += size) rows.push(members.slice(k, k + size));
  }
  return { rows, size };
}

// The member with the highest ratio in column j (null: none of them reported the step).
export function slowestIn(members, ratios, j) {
  let best = null;
  for (const i of members) {
    const ratio = ratios[i][j];
    if (ratio !== null && (best === null || ratio > ratios[best][j])) best = i;
  }
  return best;
}

// The median of the members' ratios in column j (null: none reported).
export function medianIn(members, ratios, j) {
  const present = members.map((i) => ratios[i][j]).filter((r) => r !== null).sort((a, b) => a - b);
  if (!present.length) return null;
  const mid = Math.floor(present.length / 2);
  return present.length % 2 ? present[mid] : (present[mid - 1] + present[mid]) / 2;
}
