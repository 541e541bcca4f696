// What the dashboard knows: the signed-in key, the server's features, the selected dataset.

export const FALLBACK_METHODS = [
  "jointexp",
  "indexp",
  "appindexp",
  "smooth",
  "csmooth",
  "aq",
  "jointexp_smooth",
];

export const state = {
  me: null, // {id, role, dataset_id}
  features: { quote: false, methodsEndpoint: false, methods: FALLBACK_METHODS },
  datasets: [],
  selectedId: null,
  budget: null,
  releases: [],
  plottedId: null,
  ledger: [],
  keys: [],
  timer: null,
};

export function isAdmin() { return state.me && state.me.role === "admin"; }
// "unknown": a server without GET /v1/keys/me; the form is shown and the server decides.
export function canQuery() { return state.me && ["admin", "analyst", "unknown"].includes(state.me.role); }

// A release's status ("done" from servers before asynchronous releases stored only those).
export function statusOf(release) { return release.status || "done"; }
