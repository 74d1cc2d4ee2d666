// The sandbox's egress log: every connection it attempted through berth's
// network, allowed or denied and by which rule, the stored records first
// and then new ones as they happen (GET egress?follow=true, NDJSON).

import { ndjson, sandboxPath, APIError } from "./api.js";
import { h, replace, bytes, clock } from "./dom.js";

export function egressTab(panel, sb) {
  let stopped = false;
  const ac = new AbortController();
  const state = h("span", { id: "egress-state", class: "muted" }, "connecting…");
  const tbody = h("tbody");
  const empty = h("tr", {}, h("td", { colspan: 7, class: "empty" },
    sb.network?.mode === "none" ? "No egress: the sandbox's network mode is none." : "No egress yet."));
  tbody.append(empty);
  let n = 0, last = 0;

  function add(r) {
    if (r.seq <= last) return;
    last = r.seq;
    if (n++ === 0) empty.remove();
    const where = (r.name || r.addr || "") + (r.port ? ":" + r.port : "");
    const req = [r.method, r.path].filter(Boolean).join(" ");
    tbody.prepend(h("tr", { class: r.allowed ? "" : "denied" },
      h("td", {}, clock(r.time)),
      h("td", {}, r.proto),
      h("td", { class: "mono" }, where),
      h("td", { class: "mono" }, req, r.status ? ` → ${r.status}` : ""),
      h("td", {}, r.allowed ? "allowed" : "denied"),
      h("td", {}, r.rule, r.secret ? ` (secret ${r.secret})` : "", r.error ? ` — ${r.error}` : ""),
      h("td", { class: "num" }, `${bytes(r.bytes_out)} / ${bytes(r.bytes_in)}`),
    ));
    while (tbody.children.length > 1000) tbody.lastChild.remove();
  }

  async function follow() {
    while (!stopped) {
      try {
        // After a reconnection, only what this page has not shown.
        await ndjson(sandboxPath(sb.id, "egress") + "?follow=true" + (last ? "&after=" + last : ""), {
          signal: ac.signal,
          onOpen: () => { state.textContent = "live"; },
          onItem: add,
        });
        state.textContent = "ended";
        return;
      } catch (err) {
        if (stopped || err.name === "AbortError") return;
        state.textContent = "disconnected: " + err.message;
        if (err instanceof APIError && err.status !== 0 && err.status < 500) return;
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  replace(panel,
    h("div", { class: "toolbar" }, h("strong", {}, "Egress "), state),
    h("table", { id: "egress-table", class: "grid" },
      h("thead", {}, h("tr", {}, ["Time", "Proto", "Destination", "Request", "Result", "Rule", "Out / in"].map((t) => h("th", {}, t)))),
      tbody));
  follow();

  return () => {
    stopped = true;
    ac.abort();
  };
}
