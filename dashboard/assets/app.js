// The dashboard's entry point: the login page, and a router (on the URL's
// hash) between the sandbox list and one sandbox's page. Each page is a
// function that renders into <main> and returns what stops it (its
// streams, timers and terminal) when the user leaves.

import { apiKey, setAPIKey, clearAPIKey, onUnauthorized, call, APIError } from "./api.js";
import { h, replace } from "./dom.js";
import { listPage } from "./list.js";
import { sandboxPage } from "./sandbox.js";

const main = document.getElementById("main");
const signout = document.getElementById("signout");
let stop = () => {};

function leave() {
  try {
    stop();
  } finally {
    stop = () => {};
  }
}

function loginPage(message) {
  leave();
  signout.hidden = true;
  document.getElementById("version").textContent = "";
  const input = h("input", {
    id: "login-key", type: "password", name: "key", autocomplete: "off", spellcheck: false,
    placeholder: "API key", required: true, autofocus: true,
  });
  const error = h("p", { id: "login-error", class: "error", role: "alert" }, message || "");
  error.hidden = !message;
  const button = h("button", { id: "login-submit", type: "submit" }, "Sign in");
  const form = h("form", { class: "login card", onsubmit: async (e) => {
    e.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    button.disabled = true;
    error.hidden = true;
    setAPIKey(key);
    try {
      // A call every key of any scope may make proves the key.
      await call("GET", "/v1/sandboxes");
      route(); // the page the address names, the list by default
    } catch (err) {
      if (err.status !== 401) {
        // The 401 handler already showed the login page with its message.
        clearAPIKey();
        error.textContent = err.message;
        error.hidden = false;
      }
    } finally {
      button.disabled = false;
    }
  } },
    h("h1", {}, "Sign in to berth"),
    h("p", { class: "muted" },
      "Paste an API key: one from ", h("code", {}, "berth key create"), ", or the admin key the daemon wrote to ",
      h("code", {}, "admin.key"), " in its state directory on its first start. ",
      "The key stays in this tab (sessionStorage) and goes only to this daemon."),
    h("label", { for: "login-key" }, "API key"),
    input,
    error,
    button,
  );
  replace(main, form);
  input.focus();
}

onUnauthorized((message) => {
  clearAPIKey();
  loginPage("The daemon refused the key: " + message);
});

signout.addEventListener("click", () => {
  clearAPIKey();
  location.hash = "#/";
  loginPage();
});

async function showVersion() {
  try {
    const v = await call("GET", "/v1/version");
    document.getElementById("version").textContent = "v" + v.version;
  } catch {
    // the pages say what is wrong with the daemon
  }
}

function route() {
  if (!apiKey()) {
    loginPage();
    return;
  }
  leave();
  signout.hidden = false;
  showVersion();
  const m = location.hash.match(/^#\/sandboxes\/([^/]+)(?:\/(\w+))?$/);
  try {
    stop = m ? sandboxPage(main, decodeURIComponent(m[1]), m[2] || "terminal") : listPage(main);
  } catch (err) {
    replace(main, h("p", { class: "error" }, err instanceof APIError ? err.message : String(err)));
  }
}

window.addEventListener("hashchange", route);
route();
