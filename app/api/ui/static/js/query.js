// The query form: reading it, quoting as it is typed, submitting, explaining a release.

import { ApiError, get, idempotencyKey, post } from "./api.js";
import { $, clearChildren, showError } from "./dom.js";
import { groupErrorText, readGrouping } from "./groups.js";
import { canQuery, state, statusOf } from "./state.js";

const RELEASE_POLL_MS = 700;

// What the rest of the dashboard does after a release (set by installQuery).
const after = { refreshSelected: async () => {} };

export function installQuery(hooks) {
  Object.assign(after, hooks);
}

// "0.1, 0.5" or "10%, 50%": quantiles strictly increasing inside (0, 1).
function parseQuantiles(textValue) {
  const parts = textValue.split(/[\s,;]+/).filter(Boolean);
  if (!parts.length) return { error: "quantiles: give at least one, e.g. 0.5 or 50%" };
  const quantiles = [];
  for (const part of parts) {
    const percent = part.endsWith("%");
    const value = Number(percent ? part.slice(0, -1) : part);
    if (!Number.isFinite(value)) return { error: `quantiles: "${part}" is not a number` };
    quantiles.push(percent ? value / 100 : value);
  }
  if (quantiles.some((q) => !(q > 0 && q < 1))) return { error: "quantiles: each must lie strictly between 0 and 1 (or 0% and 100%)" };
  if (quantiles.some((q, i) => i > 0 && q <= quantiles[i - 1])) return { error: "quantiles: list them in strictly increasing order" };
  return { quantiles };
}

function readQuery() {
  const parsed = parseQuantiles($("query-quantiles").value);
  if (parsed.error) return { error: parsed.error };
  const quantiles = parsed.quantiles;
  const epsilon = $("query-epsilon").value.trim();
  if (!/^\d*\.?\d+([eE][-+]?\d+)?$/.test(epsilon)) return { error: "ε: a positive decimal number" };
  const body = { quantiles, epsilon, method: $("query-method").value };
  if (!$("query-column-field").hidden && $("query-column").value) body.column = $("query-column").value;
  const delta = $("query-delta").value.trim();
  if (delta) {
    if (!/^\d*\.?\d+([eE][-+]?\d+)?$/.test(delta)) return { error: "δ: a positive decimal number" };
    body.delta = delta;
  }
  const groupError = readGrouping(body);
  if (groupError) return { error: groupError };
  return { body };
}

let quoteTimer = null;
let quoteSeq = 0;
export function scheduleQuote() {
  if (!state.features.quote || !canQuery()) return;
  clearTimeout(quoteTimer);
  quoteTimer = setTimeout(() => fetchQuote().catch(() => {}), 300);
}

function expectedText(e) {
  // One {quantile, mean, bound90, bound90_each} per quantile, in missed points (data points
  // between the true quantile and the estimate); null when unknown. bound90 bounds the
  // average over the release's quantiles, bound90_each any one estimate (the error bars).
  if (e === undefined || e === null) return null;
  if (!Array.isArray(e) || !e.length || typeof e[0] !== "object") return JSON.stringify(e);
  const mean = e.reduce((s, x) => s + x.mean, 0) / e.length;
  const bound = Math.max(...e.map((x) => x.bound90));
  const each = e.map((x) => x.bound90_each).filter((b) => typeof b === "number");
  const one = each.length ? `, any one estimate ≤ ${Math.max(...each).toPrecision(3)}` : "";
  return `≈ ${mean.toPrecision(3)} missed points per quantile (90 %: their average ≤ ${bound.toPrecision(3)}${one})`;
}

// The explanation of one release (GET /v1/releases/{id}/explanation), as a short list.
export async function explain(id) {
  const { body: e } = await get(`/v1/releases/${id}/explanation`);
  const box = $("explanation");
  clearChildren(box);
  const h = document.createElement("h4");
  h.textContent = `Release ${id.slice(0, 8)}… explained`;
  const d = e.data;
  const rows = [
    ["Method", `${e.method.name}: ${e.method.description}`],
    ["Guarantee", `${e.method.guarantee.replace("_", " ")} under ${d.neighbors} neighbours` +
      (d.privacy_unit ? `, per ${d.privacy_unit} (at most ${d.max_rows_per_unit} rows each)` : "")],
    ["Accounting", d.accounting === "zcdp" ? `zCDP at δ = ${d.accounting_delta}: ${e.method.zcdp || "refused"}` : "pure: ε and δ sum"],
    ["Data", `column ${d.column}, public bounds [${d.lower}, ${d.upper}], grid step ${d.granularity}`],
    ["auto today", e.auto_today || "no method fits this query today"],
    ["Alternatives", e.alternatives.map((a) => `${a.method} ${expectedShort(a.expected_error)}`).join(" · ")],
  ];
  const dl = document.createElement("dl");
  for (const [k, v] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dl.append(dt, dd);
  }
  const notes = document.createElement("ul");
  for (const line of e.reading) {
    const li = document.createElement("li");
    li.textContent = line;
    notes.append(li);
  }
  box.append(h, dl, notes);
  box.hidden = false;
}


// "≈ 3.2 pts" (mean missed points per quantile) for the releases table.
export function expectedShort(e) {
  if (!Array.isArray(e) || !e.length || typeof e[0] !== "object") return "unknown";
  const mean = e.reduce((s, x) => s + x.mean, 0) / e.length;
  return `≈ ${mean.toPrecision(2)} pts`;
}

async function fetchQuote() {
  const box = $("quote");
  const { body, error } = readQuery();
  if (!state.selectedId) { box.hidden = true; return; }
  if (error) {
    // say what is wrong as it is typed, and keep the button off until it is fixed
    ++quoteSeq;
    clearChildren(box);
    box.textContent = error;
    box.setAttribute("data-invalid", "true");
    box.hidden = false;
    $("query-submit").disabled = true;
    return;
  }
  box.removeAttribute("data-invalid");
  const seq = ++quoteSeq;
  try {
    const { body: q } = await post(`/v1/datasets/${state.selectedId}/quote`, body);
    if (seq !== quoteSeq) return;
    clearChildren(box);
    const amount = (a) => (a && typeof a === "object" && "epsilon" in a ? `ε ${a.epsilon}, δ ${a.delta}` : a);
    const parts = [
      ["Method", q.method],
      ["Cost", amount(q.cost)],
      ["Remaining after", amount(q.remaining_after)],
      ["Affordable", q.affordable === undefined ? null : q.affordable ? "yes" : "no"],
      ["Expected error", expectedText(q.expected_error)],
      ["Expected error by group size", groupErrorText(q.group_error)],
      ["Warnings", Array.isArray(q.warnings) && q.warnings.length ? q.warnings.join("; ") : null],
    ];
    const dl = document.createElement("dl");
    for (const [k, v] of parts) {
      if (v === null || v === undefined) continue;
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = String(v);
      dl.append(dt, dd);
    }
    const h = document.createElement("strong");
    h.textContent = "Quote (nothing spent yet)";
    box.append(h, dl);
    if (q.affordable === false) box.append(unaffordableReason(q, body));
    box.hidden = false;
    box.classList.toggle("unaffordable", q.affordable === false);
    $("query-submit").disabled = q.affordable === false;
  } catch (err) {
    if (seq !== quoteSeq) return;
    clearChildren(box);
    if (err instanceof ApiError && (err.status === 404 || err.status === 405)) {
      // the server lists the endpoint but does not serve it: stop quoting, quietly
      state.features.quote = false;
      box.hidden = true;
      $("query-submit").disabled = false;
      return;
    }
    box.textContent = err instanceof ApiError ? `Quote: ${err.detail}` : "Quote unavailable";
    box.hidden = false;
    $("query-submit").disabled = false;
  }
}

// Why a quote is not affordable, and the largest ε that is (from the public budget figures).
function unaffordableReason(q, body) {
  const p = document.createElement("p");
  p.setAttribute("data-testid", "unaffordable-reason");
  const b = state.budget;
  if (b && b.restore_hold_since !== undefined && q.warnings && q.warnings.some((w) => w.includes("on hold"))) {
    p.textContent = "Not affordable: the budget is on hold after a restore.";
    return p;
  }
  let largest = null;
  if (b && b.accounting === "zcdp" && b.rho && q.rho && Number(q.rho) > 0) {
    // rho grows with the square of epsilon for these methods
    const perEps2 = Number(q.rho) / (Number(body.epsilon) ** 2);
    largest = Math.sqrt(Number(b.rho.remaining) / perEps2);
  } else if (b && q.cost && Number(q.cost.epsilon) > 0) {
    largest = Number(b.remaining.epsilon) * (Number(body.epsilon) / Number(q.cost.epsilon));
  }
  const left = b ? (b.accounting === "zcdp" && b.rho ? `ρ ${b.rho.remaining}` : `ε ${b.remaining.epsilon}, δ ${b.remaining.delta}`) : "unknown";
  p.textContent = `Not affordable: the dataset has ${left} left` +
    (largest !== null ? `; the largest ε this query can use is about ${Number(largest.toPrecision(3))}` : "") +
    " (an API key's own cap can also refuse it).";
  return p;
}

export async function submitQuery(event) {
  event.preventDefault();
  showError(null);
  const { body, error } = readQuery();
  const out = $("query-result");
  if (error) { out.textContent = error; return; } // replaces any earlier "Released: …"
  const id = state.selectedId;
  const submit = $("query-submit");
  submit.disabled = true;
  const headers = { "Idempotency-Key": idempotencyKey() };
  if ($("query-async").checked) headers.Prefer = "respond-async";
  try {
    out.textContent = "Submitting…";
    // Retries of this submit (503) reuse the same Idempotency-Key: charged at most once.
    let answer;
    for (let attempt = 0; ; attempt++) {
      try {
        answer = await post(`/v1/datasets/${id}/quantiles`, body, { headers });
        break;
      } catch (err) {
        if (!(err instanceof ApiError) || err.status !== 503 || attempt >= 2) throw err;
        await new Promise((r) => setTimeout(r, 500 * (attempt + 1)));
      }
    }
    let release = answer.body;
    if (answer.status === 202 || statusOf(release) === "pending") {
      out.textContent = "Pending: the mechanism runs on the server…";
      const location = answer.headers.get("Location") || `/v1/releases/${release.id}`;
      release = await pollRelease(location);
    }
    state.plottedId = release.id;
    out.textContent = statusOf(release) === "failed"
      ? `Release failed (its cost stays charged).`
      : release.groups
        ? `Released: ${release.groups.length} groups by ${release.group_by} (table below)`
        : `Released: ${release.estimates.join(", ")}`;
    await after.refreshSelected({ force: true });
    scheduleQuote();
  } catch (err) {
    out.textContent = "";
    showError(err);
  } finally {
    submit.disabled = false;
  }
}

async function pollRelease(url) {
  for (;;) {
    const { body } = await get(url, { conditional: true });
    if (statusOf(body) !== "pending") return body;
    await new Promise((r) => setTimeout(r, RELEASE_POLL_MS));
  }
}
