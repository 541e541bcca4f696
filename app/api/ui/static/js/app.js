// The dpquant dashboard: plain ES modules, no build step, no external origin.
// Every API-provided string is written with textContent (never innerHTML); the helpers,
// the state, the query form and the admin's forms are in dom.js, state.js, query.js and admin.js.

import { ApiError, clearKey, get, getKey, setKey } from "./api.js";
import { installAdmin, loadKeys, renderKeyScopes } from "./admin.js";
import { drawSpending, drawStepCdf, zcdpEpsilon } from "./charts.js";
import { $, cell, clearChildren, say, showError, text, when } from "./dom.js";
import { fillGroupPicker, groupShort, renderGroups, syncKeys } from "./groups.js";
import { explain, expectedShort, installQuery, scheduleQuote, submitQuery } from "./query.js";
import { canQuery, isAdmin, state, statusOf } from "./state.js";

const POLL_MS = 5000;

// ---------------------------------------------------------------- features

async function detectFeatures() {
  // The OpenAPI document says which endpoints exist, so nothing is probed with a 404.
  try {
    const { body } = await get("/openapi.json");
    const paths = (body && body.paths) || {};
    state.features.quote = Boolean(paths["/v1/datasets/{dataset_id}/quote"] &&
      paths["/v1/datasets/{dataset_id}/quote"].post);
    state.features.methodsEndpoint = Boolean(paths["/v1/methods"] && paths["/v1/methods"].get);
    state.features.me = Boolean(paths["/v1/keys/me"] && paths["/v1/keys/me"].get);
    const query = body.components && body.components.schemas && body.components.schemas.QuantileQuery;
    const method = query && query.properties && query.properties.method;
    const names = method && (method.enum || (method.anyOf || []).flatMap((s) => s.enum || []));
    if (names && names.length) state.features.methods = names;
    state.features.defaultMethod = (method && method.default) || "jointexp";
  } catch {
    // keep the defaults
  }
  if (state.features.methodsEndpoint) {
    try {
      const { body } = await get("/v1/methods");
      const items = Array.isArray(body) ? body : (body && (body.items || body.methods)) || [];
      const names = items.map((m) => (typeof m === "string" ? m : m && m.name)).filter(Boolean);
      const withAuto = state.features.methods.includes("auto") && !names.includes("auto");
      if (names.length) state.features.methods = withAuto ? ["auto", ...names] : names;
    } catch {
      // the list from the OpenAPI document stays
    }
  }
  const select = $("query-method");
  clearChildren(select);
  for (const name of state.features.methods) {
    const opt = document.createElement("option");
    opt.value = name;
    opt.textContent = name;
    if (name === state.features.defaultMethod) opt.selected = true;
    select.appendChild(opt);
  }
}

// ---------------------------------------------------------------- sign in / out

async function signIn(key) {
  setKey(key);
  try {
    let me = null;
    if (state.features.me !== false) {
      me = (await get("/v1/keys/me")).body;
    }
    state.me = me || { role: "unknown", dataset_id: null };
  } catch (err) {
    clearKey();
    state.me = null;
    throw err;
  }
  $("api-key").value = "";
  $("signin-form").hidden = true;
  $("whoami").hidden = false;
  $("welcome").hidden = true;
  $("main").hidden = false;
  text($("who-role"), state.me.role);
  renderWho();
  document.body.dataset.role = state.me.role;
  $("query-section").hidden = !canQuery();
  $("admin-section").hidden = !isAdmin();
  $("grant-section").hidden = !isAdmin();
  $("ledger-section").hidden = !isAdmin();
  await loadDatasets();
  renderWho(); // the scope by name, now that the datasets are known
  if (isAdmin()) await loadKeys();
  startPolling();
  say("Ready");
}

// "Signed in as <role> · <subject> · scoped to <dataset name>" (names, not ids).
function renderWho() {
  const me = state.me;
  if (!me) return;
  const nameOf = (id) => {
    const ds = state.datasets.find((d) => d.id === id);
    return ds ? ds.name : `${id.slice(0, 8)}…`;
  };
  const ids = me.datasets || (me.dataset_id ? [me.dataset_id] : []);
  const scope = ids.length ? ` · scoped to ${ids.map(nameOf).join(", ")}` : "";
  text($("who-scope"), (me.subject ? ` · ${me.subject}` : "") + scope);
}

function signOut() {
  clearKey();
  stopPolling();
  Object.assign(state, { me: null, datasets: [], selectedId: null, budget: null, releases: [], ledger: [], keys: [] });
  $("signin-form").hidden = false;
  $("whoami").hidden = true;
  $("welcome").hidden = false;
  $("main").hidden = true;
  $("new-key").hidden = true;
  $("new-key-value").value = "";
  delete document.body.dataset.role;
  showError(null);
  say("Signed out");
}

// ---------------------------------------------------------------- datasets

async function loadDatasets() {
  const items = [];
  let url = "/v1/datasets?limit=200";
  for (let page = 0; page < 10 && url; page++) {
    const { body } = await get(url);
    items.push(...body.items);
    url = body.next_cursor ? `/v1/datasets?limit=200&cursor=${encodeURIComponent(body.next_cursor)}` : null;
  }
  state.datasets = items;
  if (!items.some((d) => d.id === state.selectedId)) state.selectedId = items.length ? items[0].id : null;
  renderDatasets();
  renderKeyScopes();
  if (state.selectedId) await selectDataset(state.selectedId, { quiet: true });
  else $("dataset-panel").hidden = true;
}

function renderDatasets() {
  const body = $("datasets-body");
  clearChildren(body);
  $("datasets-empty").hidden = state.datasets.length > 0;
  for (const ds of state.datasets) {
    const row = document.createElement("tr");
    row.dataset.testid = "dataset-row";
    row.setAttribute("data-testid", "dataset-row");
    row.dataset.id = ds.id;
    if (ds.id === state.selectedId) row.className = "selected";
    const name = document.createElement("td");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link";
    button.textContent = ds.name;
    button.setAttribute("aria-pressed", ds.id === state.selectedId ? "true" : "false");
    button.addEventListener("click", () => selectDataset(ds.id).catch(showError));
    name.appendChild(button);
    row.appendChild(name);
    cell(row, ds.budget_remaining ? ds.budget_remaining.epsilon : null, "num");
    body.appendChild(row);
  }
}

async function selectDataset(id, { quiet = false } = {}) {
  if (state.selectedId !== id) {
    state.plottedId = null;
    state.ledger = [];
    state.budget = null;
    for (const cellId of ["granted-eps", "granted-delta", "spent-eps", "spent-delta", "remaining-eps", "remaining-delta"]) {
      $(cellId).textContent = "";
    }
  }
  state.selectedId = id;
  renderDatasets();
  const ds = state.datasets.find((d) => d.id === id);
  if (!ds) return;
  $("dataset-panel").hidden = false;
  text($("ds-title"), ds.name);
  text($("ds-description"), ds.description || "");
  const facts = $("ds-facts");
  clearChildren(facts);
  const columns = ds.columns || [];
  const numeric = columns.filter((c) => c.type !== "categorical");
  const rows = columns.length > 1 || (columns[0] && columns[0].name !== "value")
    ? columns.map((c) => [
        `Column ${c.name}`,
        c.type === "categorical"
          ? `categorical${c.keys ? ` (${c.keys.length} public keys)` : ""}`
          : `${c.type}, [${c.lower}, ${c.upper}], step ${c.granularity}`,
      ])
    : [["Bounds", `[${ds.lower}, ${ds.upper}]`], ["Grid step", ds.granularity]];
  rows.push(["Neighbours", ds.neighbors]);
  rows.push([
    "Privacy unit",
    ds.privacy_unit ? `${ds.privacy_unit}, at most ${ds.max_rows_per_unit} rows each` : "one row",
  ]);
  rows.push([
    "Accounting",
    ds.accounting === "zcdp" ? `zCDP (guarantee stated at δ = ${ds.accounting_delta})` : "pure (ε and δ sum)",
  ]);
  if (ds.restore_hold_since) {
    rows.push(["Budget on hold", `restored from a backup of ${when(ds.restore_hold_since)}: an admin must confirm the spending since`]);
  }
  rows.push(["Created", when(ds.created_at)]);
  const picker = $("query-column");
  clearChildren(picker);
  for (const c of numeric) {
    const option = document.createElement("option");
    option.value = c.name;
    option.textContent = c.name;
    picker.append(option);
  }
  $("query-column-field").hidden = numeric.length < 2;
  fillGroupPicker(ds);
  if ("n" in ds) {
    const outside = ds.n_outside_bounds === undefined || ds.n_outside_bounds === null ? "" : ` (${ds.n_outside_bounds} outside bounds)`;
    rows.push(["Values", ds.n === null ? "none uploaded" : `${ds.n}${outside}`]);
  }
  if ("frozen_at" in ds) rows.push(["Frozen", ds.frozen_at ? when(ds.frozen_at) : "no"]);
  for (const [k, v] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    text(dd, v);
    facts.append(dt, dd);
  }
  await refreshSelected({ force: true });
  if (!quiet) say(`Dataset ${ds.name}`);
  scheduleQuote();
}

// ---------------------------------------------------------------- budget, releases, ledger

async function refreshSelected({ force = false } = {}) {
  const id = state.selectedId;
  if (!id) return;
  const [b, r] = await Promise.all([
    get(`/v1/datasets/${id}/budget`, { conditional: true }),
    get(`/v1/datasets/${id}/releases?limit=100`, { conditional: true }),
  ]);
  if (id !== state.selectedId) return;
  let changed = force || b.changed || r.changed;
  state.budget = b.body;
  state.releases = r.body.items;
  if (isAdmin() && (force || b.changed)) {
    state.ledger = await loadLedger(id);
    changed = true;
  }
  if (changed) {
    renderBudget();
    renderReleases();
    renderLedger();
    const ds = state.datasets.find((d) => d.id === id);
    if (ds && state.budget) {
      ds.budget_remaining = state.budget.remaining;
      renderDatasets();
    }
  }
}

async function loadLedger(id) {
  const items = [];
  let url = `/v1/datasets/${id}/ledger?limit=500`;
  for (let page = 0; page < 10 && url; page++) {
    const { body } = await get(url);
    items.push(...body.items);
    url = body.next_cursor ? `/v1/datasets/${id}/ledger?limit=500&cursor=${encodeURIComponent(body.next_cursor)}` : null;
  }
  return items;
}

function renderBudget() {
  const b = state.budget;
  if (!b) return;
  text($("granted-eps"), b.granted.epsilon);
  text($("granted-delta"), b.granted.delta);
  text($("spent-eps"), b.spent.epsilon);
  text($("spent-delta"), b.spent.delta);
  text($("remaining-eps"), b.remaining.epsilon); // exactly as the API writes it
  text($("remaining-delta"), b.remaining.delta);
  const zcdp = b.accounting === "zcdp";
  $("guarantee-row").hidden = !zcdp;
  $("rho-figures").hidden = !zcdp;
  if (zcdp) {
    text($("guarantee-eps"), b.guarantee.epsilon);
    text($("guarantee-delta"), b.guarantee.delta);
    text($("rho-figures"), `zCDP accounting: ρ granted ${b.rho.granted}, spent ${b.rho.spent}, remaining ${b.rho.remaining}. Granted ε is the target; spent ε sums what queries asked (what summing ε would have charged).`);
  }
  const left = b.releases_left;
  text($("releases-left"), left && left.count !== null
    ? `Releases left at ε ${left.epsilon} (${left.method}): ${left.count}`
    : "");
  if (zcdp) {
    renderGuaranteeChart(b);
    return;
  }
  let points;
  let source;
  if (isAdmin() && state.ledger.length) {
    source = "from the ledger: grants and debits";
    const rows = [...state.ledger].sort((a, b2) => a.id - b2.id);
    let spent = 0;
    let granted = 0;
    points = rows.map((e) => {
      if (e.kind === "grant") granted += Number(e.epsilon);
      else spent += Number(e.epsilon);
      return { t: new Date(e.created_at), spent, granted };
    });
  } else {
    source = "from the costs of the dataset's releases visible to this key; granted is today's total";
    const rows = [...state.releases].sort((a, b2) => new Date(a.created_at) - new Date(b2.created_at));
    let spent = 0;
    points = rows.map((r) => {
      spent += Number(r.cost ? r.cost.epsilon : r.epsilon);
      return { t: new Date(r.created_at), spent, granted: null };
    });
    if (points.length) points.unshift({ t: new Date(points[0].t.getTime() - 1000), spent: 0, granted: null });
  }
  drawSpending($("budget-chart"), { points, granted: Number(b.granted.epsilon), source });
  text($("budget-source"), `Spending chart ${source}.`);
}

// A zCDP table: the guarantee ε (at the table's δ) of the ρ spent so far, over time. Each
// point converts the cumulative ρ as the server does (dp-accounting's RDP conversion over the
// same orders); the last point is the server's own figure.
function renderGuaranteeChart(b) {
  const delta = Number(b.guarantee.delta) || Number(state.datasets.find((d) => d.id === state.selectedId)?.accounting_delta) || 1e-6;
  let rows;
  let source;
  if (isAdmin() && state.ledger.length) {
    source = "from the ledger's debits (ρ), converted to ε at the table's δ";
    rows = [...state.ledger].filter((e) => e.kind === "debit").sort((a, b2) => a.id - b2.id)
      .map((e) => ({ t: new Date(e.created_at), rho: Number(e.rho || 0) }));
  } else {
    source = "from the ρ of the releases visible to this key, converted to ε at the table's δ";
    rows = [...state.releases].sort((a, b2) => new Date(a.created_at) - new Date(b2.created_at))
      .map((r) => ({ t: new Date(r.created_at), rho: r.rho ? Number(r.rho.cost) : 0 }));
  }
  let rho = 0;
  const points = rows.map((r) => {
    rho += r.rho;
    return { t: r.t, spent: zcdpEpsilon(rho, delta), granted: null };
  });
  if (points.length) points.unshift({ t: new Date(points[0].t.getTime() - 1000), spent: 0, granted: null });
  drawSpending($("budget-chart"), { points, granted: Number(b.granted.epsilon), source, label: "guarantee ε" });
  text($("budget-source"), `Guarantee chart ${source}.`);
}

const RELEASE_COLUMNS = ["When", "Status", "Method", "Quantiles", "ε", "δ", "Estimates", "Expected error"];

function renderReleases() {
  const body = $("releases-body");
  clearChildren(body);
  $("releases-empty").hidden = state.releases.length > 0;
  const shown = (r) => r.estimates || (r.groups && r.groups.some((g) => g.estimates));
  const done = state.releases.filter((r) => statusOf(r) === "done" && shown(r));
  if (!state.releases.some((r) => r.id === state.plottedId) && done.length) state.plottedId = done[0].id;
  for (const r of state.releases) {
    const row = document.createElement("tr");
    row.setAttribute("data-testid", "release-row");
    row.dataset.id = r.id;
    row.dataset.status = statusOf(r);
    if (r.id === state.plottedId) row.className = "selected";
    const first = document.createElement("td");
    if (shown(r)) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "link";
      b.textContent = when(r.created_at);
      b.title = "Plot this release";
      b.setAttribute("aria-label", `Plot the release of ${when(r.created_at)}`);
      b.addEventListener("click", () => { state.plottedId = r.id; renderReleases(); });
      first.appendChild(b);
    } else {
      first.textContent = when(r.created_at);
    }
    row.appendChild(first);
    const st = cell(row, statusOf(r));
    st.className = `badge ${statusOf(r)}`;
    cell(row, r.method);
    cell(row, r.quantiles.join(", "), "mono wrap");
    cell(row, r.epsilon, "num");
    cell(row, r.delta, "num");
    const answer = r.groups && shown(r) ? `${r.groups.length} groups by ${r.group_by} (plot to see them)`
      : r.estimates ? r.estimates.join(", ") : statusOf(r) === "failed" ? "failed (charged)" : "pending…";
    const answerCell = cell(row, answer, "mono wrap estimates");
    if (r.estimates && Array.isArray(r.intervals) && r.intervals.length) {
      // the error bars in the data's units, on a line of their own under the estimates
      const bars = document.createElement("div");
      bars.className = "bars small muted";
      bars.setAttribute("data-testid", "release-bars");
      bars.textContent = "90 % bars: " + r.intervals.map((b) => `[${b.low}, ${b.high}]`).join(", ");
      bars.title = "Approximate error bars in the data's units, from the expected error and the "
        + "release's own estimates (no extra budget); see “explain”";
      answerCell.appendChild(bars);
    }
    const expected = cell(row, r.group_error ? groupShort(r.group_error) : expectedShort(r.expected_error), "wrap");
    if (r.warnings && r.warnings.length) {
      expected.textContent += " ⚠";
      expected.title = r.warnings.join("\n");
      expected.setAttribute("aria-label", `${expected.textContent}: ${r.warnings.join("; ")}`);
    }
    if (statusOf(r) !== "pending") {
      const why = document.createElement("button");
      why.type = "button";
      why.className = "link small";
      why.textContent = "explain";
      why.setAttribute("data-testid", "explain");
      why.setAttribute("aria-label", `Explain the release of ${when(r.created_at)}`);
      why.addEventListener("click", () => explain(r.id).catch(showError));
      expected.append(" ", why);
    }
    // labels for the stacked layout phones get (style.css)
    [...row.children].forEach((td, i) => { td.dataset.label = RELEASE_COLUMNS[i] || ""; });
    body.appendChild(row);
  }
  const ds = state.datasets.find((d) => d.id === state.selectedId);
  const plotted = state.releases.find((r) => r.id === state.plottedId);
  renderGroups(plotted, ds);
  $("cdf-chart").closest("figure").hidden = Boolean(plotted && plotted.groups);
  drawStepCdf($("cdf-chart"), {
    quantiles: plotted ? plotted.quantiles : [],
    estimates: plotted && !plotted.groups ? plotted.estimates : null,
    lower: ds ? ds.lower : 0,
    upper: ds ? ds.upper : 1,
    title: plotted ? `Release ${plotted.id} (${plotted.method}, ε ${plotted.epsilon})` : "",
    intervals: plotted && !plotted.groups ? plotted.intervals : null,
  });
}

function renderLedger() {
  const body = $("ledger-body");
  clearChildren(body);
  for (const e of state.ledger) {
    const row = document.createElement("tr");
    cell(row, e.id, "num");
    cell(row, when(e.created_at));
    cell(row, e.kind);
    cell(row, e.epsilon, "num");
    cell(row, e.delta, "num");
    cell(row, e.rho && e.rho !== "0" ? e.rho : "", "num");
    cell(row, e.reason || (e.release_id ? `release ${e.release_id.slice(0, 8)}…` : ""));
    body.appendChild(row);
  }
}

// ---------------------------------------------------------------- polling

function startPolling() {
  stopPolling();
  state.timer = setInterval(() => {
    if (document.hidden || !state.selectedId) return;
    refreshSelected().catch((err) => {
      if (err instanceof ApiError && err.status === 401) signOut();
    });
  }, POLL_MS);
}

function stopPolling() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

// ---------------------------------------------------------------- wiring

async function main() {
  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(null);
    const key = $("api-key").value.trim();
    if (!key) return;
    try {
      await signIn(key);
    } catch (err) {
      showError(err instanceof ApiError && err.status === 401 ? new Error("unknown, revoked or expired key or token") : err);
    }
  });
  $("sign-out").addEventListener("click", signOut);
  $("query-form").addEventListener("submit", submitQuery);
  for (const id of ["query-quantiles", "query-epsilon", "query-delta", "query-method", "query-column",
    "query-group", "query-keys", "query-hints"]) {
    $(id).addEventListener("input", scheduleQuote);
  }
  $("query-group").addEventListener("change", () => { syncKeys(); scheduleQuote(); });
  installAdmin({ loadDatasets, refreshSelected });
  installQuery({ refreshSelected });
  await detectFeatures();
  document.body.dataset.ready = "true";
  const key = getKey();
  if (key) {
    try { await signIn(key); } catch { signOut(); }
  }
}

main();
