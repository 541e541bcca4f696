// DOM helpers: every API-provided string is written with textContent (never innerHTML).

import { ApiError } from "./api.js";

export const $ = (id) => document.getElementById(id);

let statusTimer = null;
export function say(text) {
  $("status").textContent = text;
  clearTimeout(statusTimer);
  if (text) statusTimer = setTimeout(() => { $("status").textContent = ""; }, 6000);
}

export function showError(err) {
  const box = $("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  const text = err instanceof ApiError ? `${err.type}: ${err.detail}` : String(err.message || err);
  box.textContent = text;
  box.hidden = false;
}

export function text(node, value) { node.textContent = value === null || value === undefined ? "—" : String(value); return node; }

export function cell(row, value, cls) {
  const td = document.createElement("td");
  text(td, value);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

const pad = (n) => String(n).padStart(2, "0");

export function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function clearChildren(node) { while (node.firstChild) node.removeChild(node.firstChild); }
