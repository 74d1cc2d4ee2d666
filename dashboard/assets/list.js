// The sandbox list: every sandbox the key's tenant sees, filtered by a
// label selector, with live CPU and memory for the running ones (their
// stats, every 2 s while the list is on screen), a form to create one and
// a button to delete each.

import { call, sandboxPath } from "./api.js";
import { h, replace, age, bytes, labelChips, parseLabels, stateBadge } from "./dom.js";

const statsEvery = 2000; // ms between two stats of a running sandbox
const listEvery = 5000; // ms between two reloads of the list

export function listPage(main) {
  let stopped = false;
  let sandboxes = [];
  const usage = new Map(); // id → {cpu: seconds, at: ms, pct, mem}
  const selector = sessionStorage.getItem("berth.selector") || "";

  const error = h("p", { id: "list-error", class: "error", role: "alert", hidden: true });
  const filter = h("input", { id: "filter", type: "search", placeholder: "label selector: team=a,env!=prod,gpu", value: selector });
  const image = h("input", { id: "create-image", placeholder: "image (default: host)", autocomplete: "off" });
  const labels = h("input", { id: "create-labels", placeholder: "labels: k=v, k2=v2", autocomplete: "off" });
  const network = h("select", { id: "create-network", "aria-label": "network" },
    h("option", { value: "" }, "network: the daemon's default"),
    h("option", { value: "none" }, "network: none"),
    h("option", { value: "allowlist" }, "network: allowlist"),
    h("option", { value: "open" }, "network: open"));
  const allow = h("input", { id: "create-allow", placeholder: "allowed: pypi.org, github.com", autocomplete: "off", hidden: true });
  network.addEventListener("change", () => { allow.hidden = network.value !== "allowlist"; });
  const create = h("button", { id: "create-submit", type: "submit" }, "Create sandbox");
  const tbody = h("tbody");
  const count = h("span", { class: "muted" });

  function fail(err) {
    if (stopped) return;
    error.textContent = err.message;
    error.hidden = false;
  }

  async function load() {
    const sel = filter.value.trim();
    sessionStorage.setItem("berth.selector", sel);
    const q = sel ? "?selector=" + encodeURIComponent(sel) : "";
    try {
      const res = await call("GET", "/v1/sandboxes" + q);
      if (stopped) return;
      sandboxes = res.sandboxes || [];
      sandboxes.sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at));
      error.hidden = true;
      render();
    } catch (err) {
      fail(err);
    }
  }

  async function pollStats() {
    const running = sandboxes.filter((s) => s.state === "running");
    await Promise.all(running.map(async (s) => {
      try {
        const u = await call("GET", sandboxPath(s.id, "stats"));
        const at = performance.now();
        const prev = usage.get(s.id);
        const next = { cpu: u.cpu_seconds, at, mem: u.memory_bytes, pct: prev?.pct };
        if (prev && at > prev.at) next.pct = Math.max(0, (u.cpu_seconds - prev.cpu) / ((at - prev.at) / 1000)) * 100;
        usage.set(s.id, next);
      } catch {
        usage.delete(s.id); // stopped or gone since the list: the next load shows it
      }
    }));
    if (!stopped) render();
  }

  // A delete takes a second click within 3 s; the list's reloads keep
  // that state (by id), since they rebuild the rows.
  const armed = new Map(); // id → timer

  function deleteButton(s) {
    const b = h("button", { class: "danger small", type: "button", title: "Delete the sandbox and its files" },
      armed.has(s.id) ? "Really delete?" : "Delete");
    b.addEventListener("click", async () => {
      if (!armed.has(s.id)) {
        b.textContent = "Really delete?";
        armed.set(s.id, setTimeout(() => { armed.delete(s.id); render(); }, 3000));
        return;
      }
      clearTimeout(armed.get(s.id));
      armed.delete(s.id);
      b.disabled = true;
      b.textContent = "Deleting…";
      try {
        await call("DELETE", sandboxPath(s.id));
      } catch (err) {
        fail(err);
      }
      load();
    });
    return b;
  }

  function row(s) {
    const u = s.state === "running" ? usage.get(s.id) : undefined;
    const href = "#/sandboxes/" + encodeURIComponent(s.id);
    return h("tr", { dataset: { id: s.id } },
      h("td", {}, h("a", { href, class: "mono" }, s.id)),
      h("td", {}, stateBadge(s.state)),
      h("td", {}, labelChips(s.labels)),
      h("td", { class: "mono" }, s.image || "host"),
      h("td", { title: s.created_at }, age(s.created_at)),
      h("td", { class: "num cpu" }, u?.pct === undefined ? "—" : u.pct.toFixed(1) + "%"),
      h("td", { class: "num mem" }, u ? bytes(u.mem) : "—"),
      h("td", { class: "actions" }, h("a", { href, class: "button small" }, "Open"), deleteButton(s)),
    );
  }

  let rendered = false;
  function render() {
    if (!rendered) {
      rendered = true;
      // For the first-load benchmark: when the list was first on screen.
      queueMicrotask(() => performance.mark("berth:list-rendered"));
    }
    count.textContent = sandboxes.length === 1 ? "1 sandbox" : `${sandboxes.length} sandboxes`;
    if (!sandboxes.length) {
      replace(tbody, h("tr", {}, h("td", { colspan: 8, class: "empty" },
        filter.value.trim() ? "No sandbox has these labels." : "No sandboxes yet: create one above.")));
      return;
    }
    replace(tbody, sandboxes.map(row));
  }

  const form = h("form", { id: "create", class: "toolbar", onsubmit: async (e) => {
    e.preventDefault();
    const body = {};
    try {
      if (image.value.trim()) body.image = image.value.trim();
      const l = parseLabels(labels.value);
      if (Object.keys(l).length) body.labels = l;
      if (network.value) body.network = { mode: network.value };
      if (network.value === "allowlist") body.network.allow = allow.value.split(",").map((d) => d.trim()).filter(Boolean);
    } catch (err) {
      fail(err);
      return;
    }
    create.disabled = true;
    create.textContent = "Creating…";
    try {
      await call("POST", "/v1/sandboxes", { json: body });
      labels.value = "";
      await load();
    } catch (err) {
      fail(err);
    } finally {
      create.disabled = false;
      create.textContent = "Create sandbox";
    }
  } }, image, labels, network, allow, create);

  let filterTimer;
  filter.addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(load, 300);
  });

  replace(main,
    h("section", { class: "page" },
      h("div", { class: "heading" }, h("h1", {}, "Sandboxes"), count),
      form,
      h("div", { class: "toolbar" }, h("label", { for: "filter" }, "Filter"), filter),
      error,
      h("table", { id: "sandbox-table", class: "grid" },
        h("thead", {}, h("tr", {}, ["ID", "State", "Labels", "Image", "Age", "CPU", "Memory", ""].map((t) => h("th", {}, t)))),
        tbody),
    ));

  // Timers run only while the list is on screen and the tab is visible.
  let listTimer, statsTimer;
  function schedule() {
    clearInterval(listTimer);
    clearInterval(statsTimer);
    if (stopped || document.visibilityState !== "visible") return;
    listTimer = setInterval(load, listEvery);
    statsTimer = setInterval(pollStats, statsEvery);
  }
  function onVisibility() {
    schedule();
    if (document.visibilityState === "visible") load().then(pollStats);
  }
  document.addEventListener("visibilitychange", onVisibility);
  load().then(pollStats);
  schedule();

  return () => {
    stopped = true;
    clearInterval(listTimer);
    clearInterval(statsTimer);
    clearTimeout(filterTimer);
    armed.forEach(clearTimeout);
    document.removeEventListener("visibilitychange", onVisibility);
  };
}
