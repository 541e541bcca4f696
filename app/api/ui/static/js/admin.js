// The admin's forms: datasets, keys, grants, uploads.

import { post, request, get } from "./api.js";
import { $, cell, clearChildren, say, showError, when } from "./dom.js";
import { state } from "./state.js";

// What the rest of the dashboard does after an admin's change (set by installAdmin).
const after = { loadDatasets: async () => {}, refreshSelected: async () => {} };

export function renderKeyScopes() {
  const select = $("key-scope");
  const current = select.value;
  clearChildren(select);
  const all = document.createElement("option");
  all.value = "";
  all.textContent = "all datasets";
  select.appendChild(all);
  for (const ds of state.datasets) {
    const opt = document.createElement("option");
    opt.value = ds.id;
    opt.textContent = ds.name;
    select.appendChild(opt);
  }
  select.value = current;
}

export async function loadKeys() {
  const { body } = await get("/v1/keys");
  state.keys = body.items;
  const tbody = $("keys-body");
  clearChildren(tbody);
  const names = new Map(state.datasets.map((d) => [d.id, d.name]));
  for (const k of state.keys) {
    const row = document.createElement("tr");
    cell(row, k.prefix, "mono");
    cell(row, k.role);
    cell(row, k.dataset_id ? names.get(k.dataset_id) || `${k.dataset_id.slice(0, 8)}…` : "all");
    cell(row, k.kind === "oidc" ? `${k.name} (sign-on)` : k.name);
    cell(row, k.max_epsilon ? `ε ${k.spent_epsilon} of ${k.max_epsilon}` : `ε ${k.spent_epsilon}`, "num");
    cell(row, when(k.created_at));
    cell(row, k.revoked_at ? when(k.revoked_at) : "");
    const action = document.createElement("td");
    if (!k.revoked_at && (!state.me || k.id !== state.me.id)) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "secondary small";
      b.textContent = "Revoke";
      b.setAttribute("aria-label", `Revoke key ${k.prefix}`);
      b.addEventListener("click", async () => {
        if (!window.confirm(`Revoke key ${k.prefix}? It stops working at once.`)) return;
        try {
          await request("DELETE", `/v1/keys/${k.id}`);
          await loadKeys();
          say(`Key ${k.prefix} revoked`);
        } catch (err) { showError(err); }
      });
      action.appendChild(b);
    }
    row.appendChild(action);
    tbody.appendChild(row);
  }
}

async function createDataset(event) {
  event.preventDefault();
  showError(null);
  const body = {
    name: $("ds-name").value.trim(),
    description: $("ds-desc").value,
    lower: Number($("ds-lower").value),
    upper: Number($("ds-upper").value),
    neighbors: $("ds-neighbors").value,
    epsilon: $("ds-epsilon").value.trim() || "0",
    delta: $("ds-delta").value.trim() || "0",
  };
  const g = $("ds-granularity").value.trim();
  if (g) body.granularity = Number(g);
  if ($("ds-integer").checked) {
    // one integer column named value: the grid defaults to step 1
    body.columns = [{ name: "value", type: "integer", lower: body.lower, upper: body.upper }];
    if (body.granularity !== undefined) body.columns[0].granularity = body.granularity;
    delete body.lower;
    delete body.upper;
    delete body.granularity;
  }
  const hint = $("ds-size-hint").value.trim();
  if (hint) body.size_hint = Number(hint);
  if ($("ds-accounting").value === "zcdp") body.accounting = "zcdp";
  try {
    const { body: ds } = await post("/v1/datasets", body);
    state.selectedId = ds.id;
    $("ds-name").value = "";
    await after.loadDatasets();
    say(`Dataset ${ds.name} created`);
  } catch (err) { showError(err); }
}

async function createKey(event) {
  event.preventDefault();
  showError(null);
  const body = { role: $("key-role").value, name: $("key-name").value };
  const scope = $("key-scope").value;
  if (scope && body.role !== "admin") body.dataset_id = scope;
  const capEps = $("key-max-epsilon").value.trim();
  if (capEps) body.max_epsilon = capEps;
  const capDelta = $("key-max-delta").value.trim();
  if (capDelta) body.max_delta = capDelta;
  const expires = $("key-expires").value;
  if (expires) body.expires_at = `${expires}T00:00:00Z`;
  try {
    const { body: created } = await post("/v1/keys", body);
    $("new-key-value").value = created.key; // shown once, never logged, never stored
    $("new-key").hidden = false;
    for (const id of ["key-name", "key-max-epsilon", "key-max-delta", "key-expires"]) $(id).value = "";
    await loadKeys();
    say(`Key ${created.prefix} created`);
  } catch (err) { showError(err); }
}

async function grant(event) {
  event.preventDefault();
  showError(null);
  const body = {
    epsilon: $("grant-epsilon").value.trim() || "0",
    delta: $("grant-delta").value.trim() || "0",
    reason: $("grant-reason").value,
  };
  try {
    await post(`/v1/datasets/${state.selectedId}/grants`, body);
    $("grant-reason").value = "";
    await after.refreshSelected({ force: true });
    say("Budget granted");
  } catch (err) { showError(err); }
}

async function upload(event) {
  event.preventDefault();
  showError(null);
  const file = $("upload-file").files[0];
  if (!file) { showError(new Error("choose a file first")); return; }
  const name = file.name.toLowerCase();
  const parquet = [".parquet", ".parq", ".pq"].some((ext) => name.endsWith(ext));
  const type = name.endsWith(".csv") ? "text/csv"
    : parquet ? "application/vnd.apache.parquet"
    : name.endsWith(".json") ? "application/json" : "application/octet-stream";
  const column = $("upload-column").value.trim();
  const url = `/v1/datasets/${state.selectedId}/values${column ? `?column=${encodeURIComponent(column)}` : ""}`;
  try {
    await request("PUT", url, { raw: await file.arrayBuffer(), headers: { "Content-Type": type } });
    await after.loadDatasets();
    say("Values uploaded");
  } catch (err) { showError(err); }
}

// Wire the admin's forms; ``hooks`` reload what a change affects.
export function installAdmin(hooks) {
  Object.assign(after, hooks);
  $("dataset-form").addEventListener("submit", createDataset);
  $("key-form").addEventListener("submit", createKey);
  $("grant-form").addEventListener("submit", grant);
  $("upload-form").addEventListener("submit", upload);
  $("new-key-copy").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText($("new-key-value").value);
      say("Copied");
    } catch {
      $("new-key-value").select();
    }
  });
  $("new-key-hide").addEventListener("click", () => {
    $("new-key-value").value = "";
    $("new-key").hidden = true;
  });
}
