// The causes of a bubble the analysis names (analysis/attribution.py), as every page labels and colours them.
const CAUSES = {
  schedule_inherent: { label: "schedule-inherent", color: "#9aa3b2" },
  stage_imbalance: { label: "stage imbalance", color: "#f08c2e" },
  communication_wait: { label: "communication wait", color: "#8e5bd0" },
  mesh_collective_wait: { label: "waits in dp/tp collectives", color: "#2a9d8f" },
  straggler_jitter: { label: "straggler / jitter", color: "#d0457a" },
};
export const cause = (name) => CAUSES[name] || { label: name.replaceAll("_", " "), color: "#777" };
