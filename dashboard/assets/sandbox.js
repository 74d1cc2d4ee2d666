// One sandbox's page: what it is (state, labels, image, limits), its
// events as they happen (beside every tab), and tabs for a live terminal,
// its files and its egress log.

import { call, events, sandboxPath, APIError } from "./api.js";
import { h, replace, age, bytes, clock, labelChips, stateBadge } from "./dom.js";
import { terminalTab } from "./terminal.js";
import { filesTab } from "./files.js";
import { egressTab } from "./egress.js";

const tabs = { terminal: "Terminal", files: "Files", egress: "Egress" };

export function sandboxPage(main, id, firstTab) {
  let stopped = false;
  let sb = null;
  let stopTab = () => {};
  let current = tabs[firstTab] ? firstTab : "terminal";
  const ac = new AbortController();

  const error = h("p", { id: "sandbox-error", class: "error", role: "alert", hidden: true });
  const info = h("div", { class: "info" });
  const actions = h("div", { class: "actions" });
  const tabBar = h("nav", { class: "tabs", role: "tablist" });
  const panel = h("div", { class: "panel", id: "panel" });
  const eventList = h("ol", { id: "events", class: "events" });
  const eventState = h("span", { id: "events-state", class: "muted" }, "connecting…");

  function fail(err) {
    if (stopped || err.name === "AbortError") return;
    error.textContent = err.message;
    error.hidden = false;
  }

  // The events stream opens first: the terminal's own process_started is
  // then among the events shown. ready settles when it is open (or failed).
  let ready;
  const eventsReady = new Promise((resolve) => { ready = resolve; });

  async function follow() {
    while (!stopped) {
      try {
        await events(sandboxPath(id, "events"), {
          signal: ac.signal,
          onOpen: () => {
            eventState.textContent = "live";
            ready();
          },
          onEvent: (type, ev) => {
            showEvent(type, ev);
            if (["started", "stopped", "deleted", "created"].includes(type)) refresh();
          },
        });
      } catch (err) {
        ready();
        if (stopped || err.name === "AbortError") return;
        eventState.textContent = "disconnected: " + err.message;
        if (err instanceof APIError && err.status === 404) return; // the sandbox is gone
      }
      if (stopped || sb?.deleted) return;
      eventState.textContent = "reconnecting…";
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  function showEvent(type, ev) {
    const detail = [];
    if (ev.pid) detail.push("pid " + ev.pid);
    if (ev.result) {
      if (ev.result.signal) detail.push("signal " + ev.result.signal);
      else detail.push("exit " + ev.result.exit_code);
      if (ev.result.oom_killed) detail.push("OOM killed");
      if (ev.result.timed_out) detail.push("timed out");
    }
    if (ev.limit) detail.push(`${ev.limit} ×${ev.count}`);
    if (ev.egress) detail.push(`${ev.egress.name || ev.egress.addr}: ${ev.egress.rule}`);
    if (ev.reason) detail.push(ev.reason);
    const li = h("li", { dataset: { type } },
      h("time", {}, clock(ev.time)),
      h("span", { class: "event-type" }, type),
      h("span", { class: "muted" }, detail.join(", ")));
    eventList.prepend(li);
    while (eventList.children.length > 500) eventList.lastChild.remove();
    if (type === "deleted") {
      sb = { ...(sb || {}), deleted: true, state: "deleted" };
      renderInfo();
    }
  }

  async function refresh() {
    try {
      const next = await call("GET", sandboxPath(id), { signal: ac.signal });
      if (stopped) return;
      const changed = !sb || sb.state !== next.state;
      sb = next;
      error.hidden = true;
      renderInfo();
      if (changed) showTab(current);
    } catch (err) {
      if (err instanceof APIError && err.status === 404) {
        sb = { id, deleted: true, state: "deleted" };
        renderInfo();
        showTab(current);
      }
      fail(err);
    }
  }

  function lifecycle(label, verb, method = "POST") {
    return h("button", { type: "button", class: verb === "" ? "danger" : "", onclick: async (e) => {
      e.target.disabled = true;
      try {
        await call(method, sandboxPath(id, verb), { signal: ac.signal });
        if (method === "DELETE") {
          location.hash = "#/";
          return;
        }
        await refresh();
      } catch (err) {
        fail(err);
      } finally {
        e.target.disabled = false;
      }
    } }, label);
  }

  function renderInfo() {
    if (!sb) return;
    const rows = [["State", stateBadge(sb.state)]];
    if (!sb.deleted) {
      rows.push(
        ["Image", h("span", { class: "mono" }, sb.image || "host")],
        ["Runtime", sb.runtime],
        ["Labels", labelChips(sb.labels)],
        ["Created", h("span", { title: sb.created_at }, age(sb.created_at) + " ago")],
        ["User", `${sb.user} in ${sb.workdir}`],
        ["Network", sb.network?.mode || "—"],
      );
      const l = sb.limits || {};
      const lim = [l.cpus && `${l.cpus} CPU`, l.memory_bytes && bytes(l.memory_bytes), l.disk_bytes && bytes(l.disk_bytes) + " disk"].filter(Boolean);
      if (lim.length) rows.push(["Limits", lim.join(", ")]);
      if (sb.error) rows.push(["Error", h("span", { class: "error" }, sb.error)]);
    }
    replace(info, h("dl", {}, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    const btns = [];
    if (sb.state === "running") btns.push(lifecycle("Stop", "stop"));
    if (sb.state === "stopped") btns.push(lifecycle("Start", "start"));
    if (sb.state === "paused") btns.push(lifecycle("Resume", "resume"));
    if (!sb.deleted) btns.push(lifecycle("Delete", "", "DELETE"));
    replace(actions, btns);
  }

  // The terminal stays open while another tab is shown (its shell and
  // screen survive a look at the files); the other tabs start afresh.
  const termPanel = h("div", { class: "panel", id: "terminal-panel" });
  let stopTerm = null, termFor = "";

  function showTab(name) {
    current = name;
    stopTab();
    stopTab = () => {};
    replace(tabBar, Object.entries(tabs).map(([k, label]) => h("button", {
      type: "button", role: "tab", id: "tab-" + k, class: k === name ? "active" : "",
      "aria-selected": k === name ? "true" : "false",
      onclick: () => {
        history.replaceState(null, "", `#/sandboxes/${encodeURIComponent(id)}/${k}`);
        showTab(k);
      },
    }, label)));
    replace(panel);
    if (!sb) return;
    // A terminal belongs to one run of the sandbox: a stop ends it.
    if (stopTerm && termFor !== sb.state) {
      stopTerm();
      stopTerm = null;
    }
    termPanel.hidden = name !== "terminal" || sb.deleted;
    panel.hidden = !termPanel.hidden;
    if (sb.deleted) {
      replace(panel, h("p", { class: "muted" }, "This sandbox was deleted."));
      return;
    }
    if (name === "terminal") {
      if (!stopTerm) {
        termFor = sb.state;
        stopTerm = terminalTab(termPanel, sb, { eventsReady, refresh }) || (() => {});
      }
      return;
    }
    const tab = { files: filesTab, egress: egressTab }[name];
    stopTab = tab(panel, sb, { eventsReady, refresh }) || (() => {});
  }

  replace(main,
    h("section", { class: "page sandbox" },
      h("div", { class: "heading" },
        h("a", { href: "#/", class: "back" }, "← Sandboxes"),
        h("h1", { class: "mono" }, id),
        actions),
      error,
      h("div", { class: "columns" },
        h("div", { class: "wide" }, tabBar, termPanel, panel),
        h("aside", {},
          h("div", { class: "card" }, info),
          h("div", { class: "card" },
            h("h2", {}, "Events ", eventState),
            eventList)),
      ),
    ));

  follow();
  refresh();

  return () => {
    stopped = true;
    ac.abort();
    stopTab();
    stopTerm?.();
  };
}
