// The live terminal: xterm.js over the sandbox's PTY WebSocket
// (GET /v1/sandboxes/{id}/pty). Binary messages carry bytes, the
// terminal's output one way and keystrokes the other; text messages are
// JSON control messages: attached, stderr, error and exit from the daemon,
// resize from here. A browser cannot set headers on a WebSocket, so the
// key goes as a subprotocol entry, berth.key.<key>, beside berth.

import { apiKey, call, request, sandboxPath } from "./api.js";
import { h, replace } from "./dom.js";

const vendor = "/ui/vendor/xterm/";
let library; // the loaded xterm.js, once

function loadLibrary() {
  if (!library) {
    library = (async () => {
      const css = h("link", { rel: "stylesheet", href: vendor + "xterm.css" });
      const loaded = new Promise((resolve, reject) => {
        css.addEventListener("load", resolve);
        css.addEventListener("error", () => reject(new Error("xterm.css is missing")));
      });
      document.head.append(css);
      const [{ Terminal }, { FitAddon }] = await Promise.all([
        import(vendor + "xterm.mjs"), import(vendor + "addon-fit.mjs"), loaded,
      ]);
      return { Terminal, FitAddon };
    })();
    library.catch(() => { library = undefined; });
  }
  return library;
}

function base64Bytes(s) {
  const bin = atob(s || "");
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// open opens the WebSocket, offering the berth subprotocol and the key as
// the entry berth.key.<key> (the daemon takes the key from there, strips
// it and chooses berth).
function open(url) {
  return new Promise((resolve, reject) => {
    let ws;
    try {
      ws = new WebSocket(url, ["berth", "berth.key." + apiKey()]);
    } catch (err) {
      reject(err); // a key that cannot be a subprotocol entry
      return;
    }
    ws.binaryType = "arraybuffer";
    const fail = () => reject(new Error("the daemon refused the terminal's WebSocket (a key without write scope?) or could not be reached"));
    ws.addEventListener("open", () => {
      ws.removeEventListener("close", fail);
      resolve(ws);
    }, { once: true });
    ws.addEventListener("close", fail, { once: true });
  });
}

export function terminalTab(panel, sb, { eventsReady, refresh }) {
  let stopped = false;
  let ws, term, observer, pid = 0, exited = false;
  const status = h("span", { id: "terminal-status", class: "muted" }, "connecting…");
  const again = h("button", { type: "button", class: "small", hidden: true, onclick: () => start() }, "New terminal");
  const screen = h("div", { id: "terminal", class: "terminal" });

  if (sb.state !== "running") {
    const startButton = h("button", { type: "button", onclick: async () => {
      startButton.disabled = true;
      try {
        await call("POST", sandboxPath(sb.id, sb.state === "paused" ? "resume" : "start"));
      } catch (err) {
        replace(panel, h("p", { class: "error" }, err.message));
        return;
      }
      refresh();
    } }, sb.state === "paused" ? "Resume it" : "Start it");
    replace(panel, h("p", { class: "muted" }, `The sandbox is ${sb.state}: a terminal needs it running. `, startButton));
    return () => {};
  }

  replace(panel, h("div", { class: "toolbar" }, status, again), screen);

  // hangUp ends the shell when the page lets go of it (an attachment that
  // closes leaves its process running): SIGHUP, as a terminal's closing.
  function hangUp(keepalive) {
    if (!pid || exited) return;
    const p = pid;
    pid = 0;
    request("POST", sandboxPath(sb.id, `processes/${p}/signal`), { json: { signal: "HUP" }, keepalive }).catch(() => {});
  }

  function close() {
    hangUp(false);
    ws?.close(1000);
    ws = undefined;
    observer?.disconnect();
    term?.dispose();
    term = undefined;
  }

  async function start() {
    close();
    exited = false;
    again.hidden = true;
    status.textContent = "connecting…";
    replace(screen);
    let lib;
    try {
      lib = await loadLibrary();
    } catch {
      status.textContent = "";
      replace(screen, h("p", { id: "terminal-unavailable", class: "error" },
        "The terminal is unavailable: this berth was built without the dashboard's terminal library " +
        "(make dashboard-assets puts xterm.js in the binary)."));
      return;
    }
    // The events stream first, so that this terminal's process_started shows.
    await Promise.race([eventsReady, new Promise((r) => setTimeout(r, 2000))]);
    if (stopped) return;
    term = new lib.Terminal({
      cursorBlink: true, fontSize: 14, scrollback: 5000,
      fontFamily: "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace",
      theme: { background: "#0b0e14", foreground: "#e6e1cf" },
    });
    const fit = new lib.FitAddon();
    term.loadAddon(fit);
    term.open(screen);
    fit.fit();
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${proto}//${location.host}${sandboxPath(sb.id, "pty")}?rows=${term.rows}&cols=${term.cols}`;
    try {
      ws = await open(url);
    } catch (err) {
      status.textContent = "not connected: " + err.message;
      again.hidden = false;
      again.textContent = "Try again";
      return;
    }
    if (stopped) {
      ws.close(1000);
      return;
    }
    const sock = ws, t = term;
    const enc = new TextEncoder();
    sock.addEventListener("message", (e) => {
      if (typeof e.data !== "string") {
        t.write(new Uint8Array(e.data));
        return;
      }
      let m;
      try {
        m = JSON.parse(e.data);
      } catch {
        return;
      }
      switch (m.type) {
        case "attached":
          pid = m.pid;
          status.textContent = `connected: process ${m.pid}`;
          break;
        case "stderr":
          t.write(base64Bytes(m.data));
          break;
        case "error":
          t.write(`\r\n\x1b[31mberth: ${m.error?.message || "error"}\x1b[0m\r\n`);
          break;
        case "exit": {
          exited = true;
          const r = m.result || {};
          const how = r.signal ? `signal ${r.signal}` : `code ${r.exit_code}`;
          status.textContent = `the shell exited (${how})`;
          t.write(`\r\n\x1b[2m[the shell exited: ${how}]\x1b[0m\r\n`);
          break;
        }
      }
    });
    sock.addEventListener("close", (e) => {
      if (sock !== ws) return;
      if (!exited) status.textContent = `disconnected${e.reason ? ": " + e.reason : ""}`;
      again.hidden = false;
      again.textContent = "New terminal";
    });
    t.onData((d) => {
      if (sock.readyState === WebSocket.OPEN) sock.send(enc.encode(d));
    });
    t.onBinary((d) => {
      if (sock.readyState !== WebSocket.OPEN) return;
      const b = new Uint8Array(d.length);
      for (let i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 0xff;
      sock.send(b);
    });
    t.onResize(({ rows, cols }) => {
      if (sock.readyState === WebSocket.OPEN) sock.send(JSON.stringify({ type: "resize", rows, cols }));
    });
    observer = new ResizeObserver(() => {
      try {
        fit.fit();
      } catch {
        // hidden or torn down
      }
    });
    observer.observe(screen);
    t.focus();
  }

  const onPageHide = () => hangUp(true);
  window.addEventListener("pagehide", onPageHide);
  start();

  return () => {
    stopped = true;
    window.removeEventListener("pagehide", onPageHide);
    close();
  };
}
