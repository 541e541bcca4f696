// The dashboard's only door to the server: the /v1 API with the pasted key.
//
// The key lives in sessionStorage (this tab only) and travels in the Authorization header;
// it is never put in a URL and never logged. GETs of ETag-bearing resources send
// If-None-Match and reuse the cached body on 304, like any polling client should.

const KEY_STORAGE = "dpquant.apiKey";

export function getKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_STORAGE, key);
}

export function clearKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  etags.clear();
}

/** An error answer of the API: status, the body's `type` and `detail`. */
export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && typeof body.detail === "string" ? body.detail : `HTTP ${status}`;
    super(detail);
    this.name = "ApiError";
    this.status = status;
    this.type = body && body.type ? body.type : "http_error";
    this.detail = detail;
    this.body = body;
  }
}

const etags = new Map(); // url -> {etag, body}

/**
 * One API call. Options: body (JSON), headers, conditional (If-None-Match + cached body on
 * 304), raw (a Blob/ArrayBuffer body sent as is with headers["Content-Type"]).
 * Resolves to {status, body, changed, headers}; rejects with ApiError on 4xx/5xx.
 */
export async function request(method, url, options = {}) {
  const { body, headers = {}, conditional = false, raw } = options;
  const key = getKey();
  const sent = { Accept: "application/json", ...headers };
  if (key) sent.Authorization = `Bearer ${key}`;
  let payload;
  if (raw !== undefined) {
    payload = raw;
  } else if (body !== undefined) {
    sent["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const cached = conditional ? etags.get(url) : undefined;
  if (cached) sent["If-None-Match"] = cached.etag;
  const response = await fetch(url, {
    method,
    headers: sent,
    body: payload,
    cache: "no-store", // our own ETag cache decides; the browser's would hide the 304s
    credentials: "omit",
    redirect: "error",
    referrerPolicy: "no-referrer",
  });
  if (response.status === 304 && cached) {
    return { status: 304, body: cached.body, changed: false, headers: response.headers };
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { type: "http_error", detail: `unexpected answer (HTTP ${response.status})` };
    }
  }
  if (!response.ok) throw new ApiError(response.status, data);
  if (conditional) {
    const etag = response.headers.get("ETag");
    if (etag) etags.set(url, { etag, body: data });
  }
  return { status: response.status, body: data, changed: true, headers: response.headers };
}

export const get = (url, options) => request("GET", url, options);
export const post = (url, body, options = {}) => request("POST", url, { ...options, body });

/** A fresh Idempotency-Key: one per intended release, reused if the same submit is retried. */
export function idempotencyKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
