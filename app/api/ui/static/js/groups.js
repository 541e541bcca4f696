// Grouped releases: the group selector of the query form, and a grouped release shown as a
// table (group x quantile) with small multiples of the per-group step CDFs.

import { drawStepCdf, formatNumber } from "./charts.js";
import { $, clearChildren } from "./dom.js";

// The categorical columns of the selected dataset fill the "Group by" picker.
export function fillGroupPicker(ds) {
  const picker = $("query-group");
  clearChildren(picker);
  const none = document.createElement("option");
  none.value = "";
  none.textContent = "no grouping";
  picker.append(none);
  const categorical = (ds.columns || []).filter((c) => c.type === "categorical");
  for (const c of categorical) {
    const option = document.createElement("option");
    option.value = c.name;
    option.textContent = c.name;
    option.dataset.keys = c.keys ? c.keys.join(", ") : "";
    picker.append(option);
  }
  $("query-group-field").hidden = categorical.length === 0;
  syncKeys();
}

// The keys field: shown with a group; its placeholder names the declared keys (public).
export function syncKeys() {
  const picker = $("query-group");
  const chosen = picker.selectedOptions[0];
  const grouped = Boolean(picker.value);
  $("query-keys-field").hidden = !grouped;
  $("query-hints-field").hidden = !grouped;
  const declared = chosen && chosen.dataset.keys;
  $("query-keys").placeholder = declared ? `declared: ${declared}` : "required: the keys to answer";
}

// group_by and keys for the query body (keys: comma-separated; empty: the declared ones).
export function readGrouping(body) {
  if ($("query-group-field").hidden || !$("query-group").value) return null;
  body.group_by = $("query-group").value;
  const keys = $("query-keys").value.split(",").map((k) => k.trim()).filter(Boolean);
  if (keys.length) {
    if (new Set(keys).size !== keys.length) return "keys: list each key once";
    body.keys = keys;
  }
  const hints = {};
  for (const entry of $("query-hints").value.split(",").map((h) => h.trim()).filter(Boolean)) {
    const cut = entry.lastIndexOf("=");
    const key = cut > 0 ? entry.slice(0, cut).trim() : "";
    const rows = cut > 0 ? entry.slice(cut + 1).trim() : "";
    if (!key || !/^[1-9][0-9]{0,11}$/.test(rows)) {
      return `size hints: write key=rows with a whole number of rows, e.g. north=1200 (not "${entry}")`;
    }
    if (key in hints) return `size hints: ${key} is given twice`;
    hints[key] = Number(rows);
  }
  if (Object.keys(hints).length) body.size_hints = hints;
  return null;
}

// "By group size: 100 rows ≈ 12 pts · 1000 rows ≈ 15 pts; fewer than 240 rows: mostly noise",
// then the hinted keys: "north (hint 1200 rows) ≈ 14 pts"
export function groupErrorText(g) {
  if (!g || !g.by_size) return null;
  const ladder = g.by_size.filter((r) => r.size >= 100 && r.size <= 100000)
    .map((r) => `${r.size} rows ≈ ${Number(r.mean.toPrecision(2))} pts`).join(" · ");
  const hinted = (g.by_key || []).slice(0, 10)
    .map((r) => `${r.key} (hint ${r.size} rows) ≈ ${Number(r.mean.toPrecision(2))} pts`).join(" · ");
  return ladder + (g.min_size ? `; groups under ${g.min_size} rows: mostly noise` : "") +
    (hinted ? `; ${hinted}` : "");
}

// "≈ 8.9 pts at 1000 rows" for the releases table (the group sizes themselves are private).
export function groupShort(g) {
  const row = g && g.by_size && g.by_size.find((r) => r.size === 1000);
  return row ? `≈ ${Number(row.mean.toPrecision(2))} pts at 1000 rows` : "unknown";
}

// A release may answer up to 10^4 groups: the table shows at most TABLE_MAX of them and the
// small multiples at most MULTIPLES_MAX, in the release's order; the filter finds the others.
export const TABLE_MAX = 200;
export const MULTIPLES_MAX = 24;
let shown = null; // { release, ds } of the grouped release on screen

// A grouped release: a table of estimates and one small step CDF per group.
export function renderGroups(release, ds) {
  const box = $("groups-view");
  const grouped = release && release.groups && release.groups.some((g) => g.estimates);
  box.hidden = !grouped;
  if (!grouped) {
    shown = null;
    return;
  }
  const filter = $("groups-filter");
  if (!shown || shown.release.id !== release.id) filter.value = "";
  if (!filter.dataset.wired) {
    filter.dataset.wired = "1";
    filter.addEventListener("input", () => shown && drawGroups(shown.release, shown.ds));
  }
  shown = { release, ds };
  filter.parentElement.hidden = release.groups.length <= MULTIPLES_MAX;
  $("groups-title").textContent =
    `${release.groups.length} groups by ${release.group_by} (${release.method}, ε ${release.epsilon} for all)`;
  const head = $("groups-head");
  clearChildren(head);
  const tr = document.createElement("tr");
  for (const label of [release.group_by, ...release.quantiles.map((q) => `q ${q}`)]) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = label;
    tr.append(th);
  }
  head.append(tr);
  drawGroups(release, ds);
}

function drawGroups(release, ds) {
  const needle = $("groups-filter").value.trim().toLowerCase();
  const matching = needle
    ? release.groups.filter((g) => String(g.key).toLowerCase().includes(needle))
    : release.groups;
  const rows = matching.slice(0, TABLE_MAX);
  const total = release.groups.length;
  const what = needle ? `${matching.length} of ${total} groups match` : `${total} groups`;
  $("groups-shown").textContent = matching.length > TABLE_MAX || matching.length > MULTIPLES_MAX
    ? `${what}: the table shows the first ${Math.min(TABLE_MAX, matching.length)}, ` +
      `the charts the first ${Math.min(MULTIPLES_MAX, matching.length)}`
    : what;
  const body = $("groups-body");
  clearChildren(body);
  const multiples = $("groups-multiples");
  clearChildren(multiples);
  rows.forEach((g, i) => {
    const row = document.createElement("tr");
    row.setAttribute("data-testid", "group-row");
    const key = document.createElement("th");
    key.scope = "row";
    key.textContent = g.key;
    row.append(key);
    (g.estimates || []).forEach((e, j) => {
      const td = document.createElement("td");
      td.className = "num mono";
      td.textContent = formatNumber(e);
      const bar = g.intervals && g.intervals[j];
      if (bar) {
        const span = document.createElement("span");
        span.className = "bar muted small";
        span.setAttribute("data-testid", "group-bar");
        span.textContent = `[${formatNumber(bar.low)}, ${formatNumber(bar.high)}]`;
        td.title = `90 % bar at the size hint ${g.expected_error ? g.expected_error.size : ""} rows`;
        td.append(span);
      }
      row.append(td);
    });
    body.append(row);
    if (i >= MULTIPLES_MAX) return;
    const fig = document.createElement("figure");
    fig.className = "multiple";
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 480 240");
    svg.setAttribute("role", "img");
    svg.setAttribute("data-testid", "group-cdf");
    svg.setAttribute("aria-label", `Step CDF of group ${g.key}`);
    drawStepCdf(svg, { quantiles: release.quantiles, estimates: g.estimates,
      lower: ds ? ds.lower : 0, upper: ds ? ds.upper : 1, title: `Group ${g.key}`,
      intervals: g.intervals || null });
    const caption = document.createElement("figcaption");
    caption.textContent = g.key;
    fig.append(svg, caption);
    multiples.append(fig);
  });
}
