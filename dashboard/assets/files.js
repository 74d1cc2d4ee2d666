// The sandbox's files: a directory listing (POST fs/list), downloads
// (GET files?path=, fetched with the key and saved from a blob) and
// uploads into the directory shown (PUT files?path=, the file's bytes as
// the body).

import { call, request, sandboxPath } from "./api.js";
import { h, replace, bytes } from "./dom.js";

function join(dir, name) {
  return (dir.endsWith("/") ? dir : dir + "/") + name;
}

function parent(dir) {
  const i = dir.replace(/\/+$/, "").lastIndexOf("/");
  return i <= 0 ? "/" : dir.slice(0, i);
}

function mode(m, type) {
  const c = { dir: "d", symlink: "l", socket: "s" }[type] || "-";
  let s = "";
  for (let shift = 6; shift >= 0; shift -= 3) {
    const b = (m >> shift) & 7;
    s += (b & 4 ? "r" : "-") + (b & 2 ? "w" : "-") + (b & 1 ? "x" : "-");
  }
  return c + s;
}

export function filesTab(panel, sb) {
  let stopped = false;
  let dir = sessionStorage.getItem("berth.dir." + sb.id) || sb.workdir || "/";
  const ac = new AbortController();
  const error = h("p", { id: "files-error", class: "error", role: "alert", hidden: true });
  const note = h("span", { id: "files-note", class: "muted" });
  const pathInput = h("input", { id: "files-path", value: dir, spellcheck: false, "aria-label": "directory" });
  const upload = h("input", { id: "files-upload", type: "file", multiple: true });
  const tbody = h("tbody");

  function fail(err) {
    if (stopped || err.name === "AbortError") return;
    error.textContent = err.message;
    error.hidden = false;
  }

  async function list(to) {
    try {
      const res = await call("POST", sandboxPath(sb.id, "fs/list"), { json: { path: to, depth: 1 }, signal: ac.signal });
      if (stopped) return;
      dir = to;
      pathInput.value = to;
      sessionStorage.setItem("berth.dir." + sb.id, to);
      error.hidden = true;
      render(res.entries || [], res.truncated);
    } catch (err) {
      fail(err);
    }
  }

  async function download(f) {
    try {
      const res = await request("GET", sandboxPath(sb.id, "files") + "?path=" + encodeURIComponent(f.path), { signal: ac.signal });
      const url = URL.createObjectURL(await res.blob());
      const a = h("a", { href: url, download: f.name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (err) {
      fail(err);
    }
  }

  function render(entries, truncated) {
    entries.sort((a, b) => (a.type === "dir") !== (b.type === "dir") ? (a.type === "dir" ? -1 : 1) : a.name.localeCompare(b.name));
    const rows = [];
    if (dir !== "/") rows.push(h("tr", {}, h("td", { colspan: 6 }, h("a", { href: "", class: "mono up", onclick: (e) => { e.preventDefault(); list(parent(dir)); } }, ".."))));
    for (const f of entries) {
      // A symlink may lead to a directory: following it lists that, or
      // says it is not one.
      const name = f.type === "dir" || f.type === "symlink"
        ? h("a", { href: "", class: "mono " + f.type, onclick: (e) => { e.preventDefault(); list(f.path); } },
          f.name + (f.type === "dir" ? "/" : " → " + f.target))
        : h("span", { class: "mono" }, f.name);
      rows.push(h("tr", { dataset: { name: f.name } },
        h("td", {}, name),
        h("td", { class: "num" }, f.type === "dir" ? "" : bytes(f.size)),
        h("td", { class: "mono" }, mode(f.mode, f.type)),
        h("td", {}, f.owner || f.uid),
        h("td", { title: f.modified_at }, new Date(f.modified_at).toLocaleString()),
        h("td", { class: "actions" }, f.type === "file"
          ? h("button", { type: "button", class: "small", onclick: () => download(f) }, "Download") : ""),
      ));
    }
    if (!entries.length) rows.push(h("tr", {}, h("td", { colspan: 6, class: "empty" }, "An empty directory.")));
    replace(tbody, rows);
    note.textContent = truncated ? "(listing truncated)" : (entries.length === 1 ? "1 entry" : `${entries.length} entries`);
  }

  upload.addEventListener("change", async () => {
    const files = [...upload.files];
    upload.disabled = true;
    try {
      for (const f of files) {
        note.textContent = `uploading ${f.name} (${bytes(f.size)})…`;
        await request("PUT", sandboxPath(sb.id, "files") + "?path=" + encodeURIComponent(join(dir, f.name)), {
          body: f, contentType: "application/octet-stream", signal: ac.signal,
        });
      }
    } catch (err) {
      fail(err);
    } finally {
      upload.value = "";
      upload.disabled = false;
    }
    list(dir);
  });

  replace(panel,
    h("form", { class: "toolbar", onsubmit: (e) => { e.preventDefault(); list(pathInput.value.trim() || "/"); } },
      pathInput,
      h("button", { type: "submit", class: "small" }, "Go"),
      h("label", { class: "button small upload" }, "Upload files", upload),
      note),
    error,
    h("table", { id: "files-table", class: "grid" },
      h("thead", {}, h("tr", {}, ["Name", "Size", "Mode", "Owner", "Modified", ""].map((t) => h("th", {}, t)))),
      tbody));
  list(dir);

  return () => {
    stopped = true;
    ac.abort();
  };
}
