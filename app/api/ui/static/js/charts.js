// Small inline-SVG charts (no library): a step CDF of released quantiles and a budget
// spending chart. Everything is built with DOM calls and textContent, never innerHTML.

const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function clear(svg) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
}

/** About `count` round tick values covering [lo, hi]. */
export function ticks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

export function formatNumber(v) {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  return String(Number(v.toPrecision(6)));
}

function frame(svg, width, height) {
  clear(svg);
  const m = { left: 54, right: 22, top: 26, bottom: 34 };
  return { m, w: width - m.left - m.right, h: height - m.top - m.bottom };
}

function message(svg, width, height, text) {
  clear(svg);
  const t = el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, svg);
  t.textContent = text;
}

function axes(svg, f, xs, ys, xScale, yScale, xFmt, yFmt, labels) {
  const g = el("g", { class: "axes" }, svg);
  for (const y of ys) {
    const py = yScale(y);
    el("line", { x1: f.m.left, x2: f.m.left + f.w, y1: py, y2: py, class: "grid" }, g);
    const t = el("text", { x: f.m.left - 6, y: py + 4, "text-anchor": "end" }, g);
    t.textContent = yFmt(y);
  }
  let previous = null;
  for (const x of xs) {
    const px = xScale(x);
    const label = xFmt(x);
    if (label === previous) continue; // short time spans: no repeated labels
    previous = label;
    el("line", { x1: px, x2: px, y1: f.m.top + f.h, y2: f.m.top + f.h + 4, class: "tick" }, g);
    const edge = px > f.m.left + f.w - 20 ? "end" : "middle"; // keep the last label inside
    const t = el("text", { x: px, y: f.m.top + f.h + 16, "text-anchor": edge }, g);
    t.textContent = label;
  }
  el("line", { x1: f.m.left, x2: f.m.left + f.w, y1: f.m.top + f.h, y2: f.m.top + f.h, class: "axis" }, g);
  el("line", { x1: f.m.left, x2: f.m.left, y1: f.m.top, y2: f.m.top + f.h, class: "axis" }, g);
  if (labels.x) {
    const t = el("text", { x: f.m.left + f.w / 2, y: f.m.top + f.h + 30, "text-anchor": "middle", class: "label" }, g);
    t.textContent = labels.x;
  }
  if (labels.y) {
    const t = el("text", { x: 12, y: f.m.top + f.h / 2, "text-anchor": "middle", class: "label",
      transform: `rotate(-90 12 ${f.m.top + f.h / 2})` }, g);
    t.textContent = labels.y;
  }
}

/**
 * The released quantiles as a step CDF: the estimate of quantile q_i is where the curve
 * reaches q_i. x spans the dataset's public bounds. `intervals` (the release's error bars,
 * [{quantile, low, high}] or null) are drawn as horizontal bars through the points.
 */
export function drawStepCdf(svg, { quantiles, estimates, lower, upper, title, intervals = null }) {
  const W = 480, H = 240;
  if (!estimates || !estimates.length) {
    message(svg, W, H, "Select a finished release to plot it");
    return;
  }
  const f = frame(svg, W, H);
  let lo = Number(lower), hi = Number(upper);
  if (!(hi > lo)) { lo = Math.min(...estimates); hi = Math.max(...estimates) || lo + 1; }
  const x = (v) => f.m.left + ((v - lo) / (hi - lo)) * f.w;
  const y = (p) => f.m.top + (1 - p) * f.h;
  axes(svg, f, ticks(lo, hi, 5), [0, 0.25, 0.5, 0.75, 1], x, y, formatNumber,
    (p) => String(p), { x: "value (public bounds)", y: "CDF" });
  let d = `M ${x(lo)} ${y(0)}`;
  let level = 0;
  const pts = [];
  quantiles.forEach((q, i) => {
    const e = estimates[i];
    d += ` H ${x(e)} V ${y(q)}`;
    level = q;
    pts.push([e, q]);
  });
  d += ` H ${x(hi)}`;
  el("path", { d, class: "cdf" }, svg);
  const bars = Array.isArray(intervals) && intervals.length === pts.length ? intervals : null;
  if (bars) {
    const gb = el("g", { class: "errbars" }, svg);
    bars.forEach((b, i) => {
      const py = y(pts[i][1]);
      const x1 = x(Math.max(lo, b.low)), x2 = x(Math.min(hi, b.high));
      const bar = el("g", { "data-testid": "error-bar" }, gb);
      el("line", { x1, x2, y1: py, y2: py }, bar);
      el("line", { x1, x2: x1, y1: py - 4, y2: py + 4 }, bar);
      el("line", { x1: x2, x2, y1: py - 4, y2: py + 4 }, bar);
    });
  }
  const g = el("g", { class: "points" }, svg);
  pts.forEach(([e, q], i) => {
    const c = el("circle", { cx: x(e), cy: y(q), r: 3.5 }, g);
    const t = el("title", {}, c);
    t.textContent = bars ? `q = ${q}: ${e} (90 % bar ${bars[i].low} to ${bars[i].high})` : `q = ${q}: ${e}`;
  });
  const desc = el("desc", {}, svg);
  desc.textContent = title || `Step CDF through ${pts.length} released quantiles, last level ${level}`;
}

/**
 * Cumulative ε spent (and granted, when known over time) against time.
 * series: [{t: Date, spent: number, granted: number|null}], sorted by t.
 */
// dp-accounting's default Renyi orders: the RDP accountant converts at these.
const RDP_ORDERS = [
  ...Array.from({ length: 99 }, (_, i) => 1.1 + i * 0.1),
  ...Array.from({ length: 53 }, (_, i) => 11 + i),
  128, 256, 512, 1024,
];

// The epsilon of rho-zCDP at delta: min over the orders of
// alpha rho + (ln(1/delta) - ln alpha) / (alpha - 1) + ln(1 - 1/alpha)
// (Canonne, Kamath & Steinke 2020; what the server reports, through dp-accounting), or
// Bun & Steinke's rho + 2 sqrt(rho ln(1/delta)) where smaller, as the server does.
export function zcdpEpsilon(rho, delta) {
  if (!(rho > 0)) return 0;
  let best = Infinity;
  for (const a of RDP_ORDERS) {
    const e = a * rho + (Math.log(1 / delta) - Math.log(a)) / (a - 1) + Math.log1p(-1 / a);
    if (e < best) best = e;
  }
  const bunSteinke = rho + 2 * Math.sqrt(rho * Math.log(1 / delta));
  return Math.max(Math.min(best, bunSteinke * (1 + 1e-12)), 0);
}

export function drawSpending(svg, { points, granted, source, label = "ε spent" }) {
  const W = 480, H = 220;
  if (!points.length) {
    message(svg, W, H, "Nothing spent yet");
    return;
  }
  const f = frame(svg, W, H);
  const t0 = points[0].t.getTime();
  let t1 = points[points.length - 1].t.getTime();
  const now = Date.now();
  if (now > t1) t1 = now;
  if (t1 <= t0) t1 = t0 + 60_000;
  const top = Math.max(granted || 0, ...points.map((p) => Math.max(p.spent, p.granted || 0))) || 1;
  const x = (t) => f.m.left + ((t - t0) / (t1 - t0)) * f.w;
  const y = (v) => f.m.top + (1 - v / (top * 1.05)) * f.h;
  const span = t1 - t0;
  const pad = (n) => String(n).padStart(2, "0");
  const timeFmt = (t) => {
    const d = new Date(t);
    if (span > 36 * 3600e3) return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
    if (span > 3 * 3600e3) return `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  };
  const xt = [0, 0.25, 0.5, 0.75, 1].map((k) => t0 + k * span);
  axes(svg, f, xt, ticks(0, top * 1.05, 4), x, y, timeFmt, formatNumber, { y: "ε" });

  const step = (key) => {
    let d = "";
    let prev = null;
    for (const p of points) {
      const v = p[key];
      if (v === null || v === undefined) continue;
      d += prev === null ? `M ${x(p.t.getTime())} ${y(v)}` : ` H ${x(p.t.getTime())} V ${y(v)}`;
      prev = v;
    }
    if (prev !== null) d += ` H ${x(t1)}`;
    return d;
  };
  const hasGrantedSeries = points.some((p) => p.granted !== null && p.granted !== undefined);
  if (hasGrantedSeries) {
    el("path", { d: step("granted"), class: "granted" }, svg);
  } else if (granted) {
    el("line", { x1: f.m.left, x2: f.m.left + f.w, y1: y(granted), y2: y(granted), class: "granted" }, svg);
  }
  el("path", { d: step("spent"), class: "spent" }, svg);
  const legend = el("g", { class: "legend" }, svg);
  const ly = 12;
  const lx = f.m.left + f.w - 150;
  el("line", { x1: lx, x2: lx + 18, y1: ly, y2: ly, class: "spent" }, legend);
  el("text", { x: lx + 22, y: ly + 4 }, legend).textContent = label;
  el("line", { x1: lx + 76, x2: lx + 94, y1: ly, y2: ly, class: "granted" }, legend);
  el("text", { x: lx + 98, y: ly + 4 }, legend).textContent = "ε granted";
  const desc = el("desc", {}, svg);
  desc.textContent = `Cumulative ${label} over time (${source}).`;
}
