// The daemon's /v1 API as the dashboard calls it: every request carries
// the key from sessionStorage as a bearer token; an error answer becomes
// an APIError with berth's class and message; a 401 (a key the daemon
// does not take, or no longer takes) sends the user back to the login page.

const keyName = "berth.key";

export function apiKey() {
  return sessionStorage.getItem(keyName) || "";
}

export function setAPIKey(key) {
  sessionStorage.setItem(keyName, key);
}

export function clearAPIKey() {
  sessionStorage.removeItem(keyName);
}

// APIError is a refused or failed call: status 0 when the daemon could not
// be reached at all.
export class APIError extends Error {
  constructor(status, cls, message) {
    super(message);
    this.status = status;
    this.class = cls;
  }
}

let unauthorized = () => {};

// onUnauthorized sets what a 401 does (the app shows the login page with
// the daemon's message).
export function onUnauthorized(fn) {
  unauthorized = fn;
}

function headers(extra) {
  const h = new Headers(extra);
  h.set("Authorization", "Bearer " + apiKey());
  return h;
}

async function errorOf(res) {
  let cls = "", message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body && body.error) {
      cls = body.error.class || "";
      message = body.error.message || message;
    }
  } catch {
    // not berth's error body: the status says it
  }
  return new APIError(res.status, cls, message);
}

// request sends one call and returns the Response once its status is a
// success; otherwise it throws an APIError.
export async function request(method, path, { json, body, contentType, signal, keepalive } = {}) {
  const h = headers();
  if (json !== undefined) {
    h.set("Content-Type", "application/json");
    body = JSON.stringify(json);
  } else if (contentType) {
    h.set("Content-Type", contentType);
  }
  let res;
  try {
    res = await fetch(path, { method, headers: h, body, signal, keepalive, cache: "no-store", credentials: "omit" });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new APIError(0, "unavailable", `cannot reach the berth daemon at ${location.origin}: ${err.message}`);
  }
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401) unauthorized(err.message);
    throw err;
  }
  return res;
}

// call sends one call and returns its JSON body (null for 204).
export async function call(method, path, opts) {
  const res = await request(method, path, opts);
  if (res.status === 204) return null;
  return res.json();
}

// lines reads a streaming body line by line until it ends or signal aborts.
async function lines(res, signal, onLine) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", abort);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i).replace(/\r$/, "");
        buf = buf.slice(i + 1);
        onLine(line);
      }
    }
    if (buf) onLine(buf);
  } finally {
    signal?.removeEventListener("abort", abort);
  }
}

// events reads a Server-Sent Events stream (EventSource cannot send the
// Authorization header, so this is fetch and a reader): onEvent gets each
// event's name and its data parsed as JSON; onOpen runs when the headers
// have arrived. It returns when the stream ends.
export async function events(path, { signal, onOpen, onEvent }) {
  const res = await request("GET", path, { signal });
  onOpen?.();
  let name = "", data = [];
  await lines(res, signal, (line) => {
    if (line === "") {
      if (data.length) {
        let v;
        try {
          v = JSON.parse(data.join("\n"));
        } catch {
          v = data.join("\n");
        }
        onEvent(name || "message", v);
      }
      name = "";
      data = [];
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  });
}

// ndjson reads a stream of JSON lines; onOpen runs when the headers have
// arrived. It returns when the stream ends.
export async function ndjson(path, { signal, onOpen, onItem }) {
  const res = await request("GET", path, { signal });
  onOpen?.();
  await lines(res, signal, (line) => {
    if (line.trim() !== "") onItem(JSON.parse(line));
  });
}

// sandboxPath is /v1/sandboxes/{id}[/rest], the id escaped.
export function sandboxPath(id, rest = "") {
  return "/v1/sandboxes/" + encodeURIComponent(id) + (rest ? "/" + rest : "");
}
