// The sweep page's pure parts (no DOM): sorting its runs table and the parameter/metric scatter's data.
import { configText } from "./api.js";

/** Rows sorted by ``key`` (a column: rank, number, state, seed, last, best, or "param:<path>"); rows
 * without a value go last whatever the direction. */
export function sortRows(rows, key, dir) {
  const valueOf = (r) => (key.startsWith("param:") ? r.params[key.slice(6)] : r[key]);
  const cmp = (a, b) => {
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b));
  };
  return [...rows].sort((a, b) => {
    const va = valueOf(a);
    const vb = valueOf(b);
    const na = va === null || va === undefined;
    const nb = vb === null || vb === undefined;
    if (na || nb) return na === nb ? a.index - b.index : na ? 1 : -1;
    return dir * cmp(va, vb) || a.index - b.index;
  });
}

/** The scatter's data: x = the parameter (numbers as they are; other values as the index of their
 * sorted distinct text), y = the ranked value; runs without a value are left out. */
export function scatterData(rows, param) {
  const pts = rows.filter((r) => r.value !== null && r.params[param] !== undefined);
  const numeric = pts.every((r) => typeof r.params[param] === "number");
  const labels = numeric ? null : [...new Set(pts.map((r) => configText(r.params[param])))].sort();
  const xOf = (r) => (numeric ? r.params[param] : labels.indexOf(configText(r.params[param])));
  const sorted = pts.map((r) => [xOf(r), r.value]).sort((a, b) => a[0] - b[0]);
  return { xs: sorted.map((p) => p[0]), ys: sorted.map((p) => p[1]), labels, n: pts.length };
}
