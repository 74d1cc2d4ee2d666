// Small helpers to build the page's elements (text goes in as text nodes,
// never as HTML) and to format what the API reports.

// h makes an element: attrs are properties or attributes (on* are event
// listeners, class is the class name); children are nodes or strings.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

// replace empties el and puts children in it.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function bytes(n) {
  if (n === undefined || n === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return (i === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
}

// age is how long ago t (an RFC 3339 time) was: 42s, 5m, 3h, 2d.
export function age(t, now = Date.now()) {
  const s = Math.max(0, Math.floor((now - Date.parse(t)) / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

export function clock(t) {
  const d = new Date(t);
  return isNaN(d) ? "" : d.toLocaleTimeString([], { hour12: false });
}

// labels shows a sandbox's labels as chips, sorted by key.
export function labelChips(labels) {
  const keys = Object.keys(labels || {}).sort();
  if (!keys.length) return h("span", { class: "muted" }, "—");
  return h("span", { class: "labels" }, keys.map((k) => h("span", { class: "chip" }, `${k}=${labels[k]}`)));
}

// parseLabels reads "k=v, k2=v2" into an object, or throws naming the bad part.
export function parseLabels(text) {
  const out = {};
  for (const part of text.split(",").map((s) => s.trim()).filter(Boolean)) {
    const i = part.indexOf("=");
    if (i <= 0) throw new Error(`labels: "${part}" is not key=value`);
    out[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return out;
}

export function stateBadge(state) {
  return h("span", { class: "state state-" + state }, state);
}
