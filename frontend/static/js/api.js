// The browser's REST client: session cookie + CSRF header, one error shape.
// The server answers errors as {"detail": str, "errors": {"field.path": [messages]}} (core/api_errors.py).

/** Read a cookie by name (Django's CSRF token lives in `csrftoken`). */
function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === name) return decodeURIComponent(v.join("="));
  }
  return null;
}

/** An API error that keeps the server's field errors for the form to place. */
export class ApiError extends Error {
  constructor(status, body) {
    const detail = (body && (body.detail || body.message)) || `HTTP ${status}`;
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.body = body;
    this.fieldErrors = flattenErrors(body && body.errors !== undefined ? body.errors : body);
  }
}

/**
 * Turn DRF-style nested errors ({"config": {"trainer.lr": ["..."]}} or {"name": ["..."]}) into a flat
 * {"path": ["messages"]} map. Keys already written as dotted paths are kept as they are.
 */
export function flattenErrors(errors, prefix = "") {
  const out = {};
  const add = (path, msg) => { (out[path] = out[path] || []).push(String(msg)); };
  const walk = (node, path) => {
    if (node === null || node === undefined) return;
    if (typeof node === "string") { add(path, node); return; }
    if (Array.isArray(node)) {
      node.forEach((item, i) => {
        if (typeof item === "string") add(path, item);
        else walk(item, `${path}[${i}]`);
      });
      return;
    }
    if (typeof node === "object") {
      for (const [k, v] of Object.entries(node)) {
        if (k === "detail" && path === "" && typeof v === "string") continue;
        const key = k === "non_field_errors" || k === "__all__" ? "" : k;
        walk(v, path && key ? `${path}.${key}` : path || key);
      }
    }
  };
  walk(errors, prefix);
  return out;
}

/** fetch() a JSON endpoint of /api/ with the session cookie; throws ApiError on non-2xx. */
export async function api(path, { method = "GET", body, params } = {}) {
  let url = path;
  if (params) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v === undefined || v === null) continue;
      if (Array.isArray(v)) v.forEach((x) => qs.append(k, x));
      else qs.append(k, v);
    }
    const s = qs.toString();
    if (s) url += (url.includes("?") ? "&" : "?") + s;
  }
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers["X-CSRFToken"] = cookie("csrftoken") || "";
  }
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { detail: text.slice(0, 300) }; }
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

/** Paginated list endpoints answer {results: [...]} (LimitOffsetPagination); plain lists pass through. */
export function results(data) {
  if (Array.isArray(data)) return data;
  if (data && Array.isArray(data.results)) return data.results;
  return [];
}

/** Parse a JSON <script type="application/json" id=...> block written by Django's json_script. */
export function pageData(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}

/** Small DOM helper: el("div", {class: "x", onclick: f}, child, "text"). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (v === true) node.setAttribute(k, "");
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

/** "2026-11-29T09:01:02Z" -> "09:01:02" today, else "Nov 29 09:01". */
export function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const now = new Date();
  const hms = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
  if (d.toDateString() === now.toDateString()) return hms;
  return `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${hms}`;
}

/** Format a metric value compactly: 3 significant digits, exponent for tiny/huge. */
export function fmtNum(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  if (Number.isInteger(v)) return String(v);
  return v.toPrecision(4).replace(/\.?0+$/, "");
}

/** A config value as text, exactly (never rounded: 1e-6 and 1.1e-6 stay apart): JSON, with a small
 * fraction in exponent form ("3e-6", not "0.000003"). */
export function configText(value) {
  if (typeof value === "number" && !Number.isInteger(value) && Math.abs(value) < 1e-3) {
    return value.toExponential();
  }
  return JSON.stringify(value);
}
