// The HTTP transport: node:http (and node:https), not fetch, because a
// daemon on a unix socket (unix:///path/berth.sock) is reached with
// node:http's socketPath, which fetch cannot do without undici's own
// Agent (a runtime dependency this package does without). Every call goes
// through request(), which maps an error answer to the SDK's error class
// and a failure to connect to DaemonUnreachable naming the URL.

import * as http from "node:http";
import * as https from "node:https";
import { Readable } from "node:stream";
import { BerthError, DaemonUnreachable, DeadlineExceeded, Unavailable, errorFor } from "./errors.js";

export const DEFAULT_URL = "http://127.0.0.1:7680";
export const USER_AGENT = "berth-typescript/0.1.0";

/** What a request body may be: bytes, text (UTF-8), a Node Readable, an
 * (async) iterable of chunks, or a web ReadableStream. */
export type Body =
  | Uint8Array
  | ArrayBuffer
  | string
  | Readable
  | AsyncIterable<Uint8Array | string>
  | Iterable<Uint8Array>
  | ReadableStream<Uint8Array>;

export type Query = Record<string, string | number | boolean | undefined | null> | Array<[string, string]>;

export interface Call {
  method: string;
  path: string;
  query?: Query;
  json?: unknown;
  body?: Body;
  headers?: Record<string, string>;
  /** Milliseconds without an answer (or between chunks) before the call
   * fails; null for none (calls that wait on a command). Undefined: the
   * client's timeoutMs. */
  timeoutMs?: number | null;
  signal?: AbortSignal;
}

/** Where the daemon is. */
export interface Endpoint {
  /** The URL as the user gave it (named in errors). */
  url: string;
  /** http(s)://host[:port][/prefix]; http://berth for a unix socket. */
  origin: string;
  /** The socket's path for unix:// URLs. */
  socketPath?: string;
}

export function endpoint(url: string | undefined): Endpoint {
  const u = url || process.env.BERTH_URL || DEFAULT_URL;
  if (u.startsWith("unix://")) {
    return { url: u, origin: "http://berth", socketPath: u.slice("unix://".length) };
  }
  const withScheme = u.includes("://") ? u : "http://" + u;
  return { url: u, origin: withScheme.replace(/\/+$/, "") };
}

export function queryString(q: Query | undefined): string {
  if (!q) return "";
  const pairs: Array<[string, string]> = Array.isArray(q)
    ? q
    : Object.entries(q)
        .filter(([, v]) => v !== undefined && v !== null)
        .map(([k, v]) => [k, String(v)]);
  if (pairs.length === 0) return "";
  return "?" + new URLSearchParams(pairs).toString();
}

function isReadableStream(v: unknown): v is ReadableStream<Uint8Array> {
  return typeof v === "object" && v !== null && typeof (v as ReadableStream).getReader === "function";
}

function isAsyncIterable(v: unknown): v is AsyncIterable<Uint8Array | string> {
  return typeof v === "object" && v !== null && Symbol.asyncIterator in v;
}

/** A body as bytes when it is already whole, else as a Readable. */
export function bodySource(b: Body): Uint8Array | Readable {
  if (typeof b === "string") return Buffer.from(b, "utf8");
  if (b instanceof Uint8Array) return b;
  if (b instanceof ArrayBuffer) return new Uint8Array(b);
  if (b instanceof Readable) return b;
  if (isReadableStream(b)) return Readable.fromWeb(b as import("node:stream/web").ReadableStream<Uint8Array>);
  if (isAsyncIterable(b)) return Readable.from(b, { objectMode: false });
  return Readable.from(b as Iterable<Uint8Array>, { objectMode: false });
}

/** Reads a whole response. */
export async function readAll(res: AsyncIterable<Buffer | string>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(typeof c === "string" ? Buffer.from(c) : c);
  return Buffer.concat(chunks);
}

/** The most of an error answer that is read. */
export const MAX_ERROR_BODY = 1 << 20;

/** Reads a response up to max bytes (the rest is left unread). */
export async function readAtMost(res: AsyncIterable<Buffer>, max: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of res) {
    chunks.push(c.subarray(0, max - n));
    n += Math.min(c.length, max - n);
    if (n >= max) break;
  }
  return Buffer.concat(chunks);
}

export function asBytes(b: Buffer): Uint8Array {
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

/** Lines of a stream (NDJSON, or SSE with keepEmpty), as they arrive. */
export async function* lines(res: AsyncIterable<Buffer | string>, keepEmpty = false): AsyncGenerator<string> {
  let rest = "";
  const dec = new TextDecoder("utf-8");
  for await (const chunk of res) {
    rest += typeof chunk === "string" ? chunk : dec.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = rest.indexOf("\n")) >= 0) {
      const line = rest.slice(0, nl).replace(/\r$/, "");
      rest = rest.slice(nl + 1);
      if (keepEmpty || line.trim()) yield line;
    }
  }
  rest += dec.decode();
  if (rest.trim()) yield rest;
}

/** Sends calls to one daemon over a keep-alive agent. */
export class Transport {
  readonly ep: Endpoint;
  readonly timeoutMs: number;
  // The API key is held where neither JSON.stringify nor util.inspect
  // looks: a private field, and no object that holds it is enumerable.
  readonly #authorization: string | undefined;
  readonly #agent: http.Agent;
  readonly #mod: typeof http | typeof https;

  constructor(ep: Endpoint, apiKey: string | undefined, timeoutMs: number) {
    this.ep = ep;
    this.timeoutMs = timeoutMs;
    this.#authorization = apiKey ? `Bearer ${apiKey}` : undefined;
    const tls = ep.origin.startsWith("https:");
    this.#mod = tls ? https : http;
    this.#agent = tls ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
  }

  /** The headers of every call (Authorization when there is an API key). */
  get headers(): Record<string, string> {
    const h: Record<string, string> = { "User-Agent": USER_AGENT, "Accept-Encoding": "identity" };
    if (this.#authorization) h.Authorization = this.#authorization;
    return h;
  }

  /** The URL only: never the API key. */
  toJSON(): { url: string } {
    return { url: this.ep.url };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Transport { url: '${this.ep.url}' }`;
  }

  close(): void {
    this.#agent.destroy();
  }

  unreachable(e: unknown): BerthError {
    const msg = e instanceof Error ? e.message : String(e);
    return new DaemonUnreachable(`berth daemon not reachable at ${this.ep.url}: ${msg}`, { cause: e });
  }

  /** What a failure while reading an answer means: the daemon's own
   * error or an abort as they are, else Unavailable naming the URL. */
  broke(e: unknown): unknown {
    if (e instanceof BerthError || (e instanceof Error && e.name === "AbortError")) return e;
    const msg = e instanceof Error ? e.message : String(e);
    return new Unavailable(`the connection to the berth daemon at ${this.ep.url} broke: ${msg}`, { cause: e });
  }

  /** An answer's body, chunk by chunk as it arrives (failures as broke says). */
  async *read(res: AsyncIterable<Buffer | string>): AsyncGenerator<Buffer> {
    try {
      for await (const c of res) yield typeof c === "string" ? Buffer.from(c) : c;
    } catch (e) {
      throw this.broke(e);
    }
  }

  /** Sends a call; resolves to its (2xx) response, whose body is unread.
   * An error answer is read and thrown as the SDK's error. */
  async request(call: Call): Promise<http.IncomingMessage> {
    const base = new URL(this.ep.origin);
    const prefix = base.pathname.replace(/\/+$/, "");
    const headers: Record<string, string> = { ...this.headers, ...(call.headers ?? {}) };
    let body: Uint8Array | Readable | undefined;
    if (call.json !== undefined) {
      body = Buffer.from(JSON.stringify(call.json), "utf8");
      headers["Content-Type"] = "application/json";
    } else if (call.body !== undefined) {
      body = bodySource(call.body);
    }
    if (body instanceof Uint8Array) headers["Content-Length"] = String(body.byteLength);
    const timeoutMs = call.timeoutMs === undefined ? this.timeoutMs : call.timeoutMs;
    const opts: http.RequestOptions = {
      method: call.method,
      path: prefix + call.path + queryString(call.query),
      headers,
      agent: this.#agent,
      signal: call.signal,
    };
    if (this.ep.socketPath !== undefined) {
      opts.socketPath = this.ep.socketPath;
    } else {
      opts.hostname = base.hostname.replace(/^\[(.*)\]$/, "$1");
      opts.port = base.port || (base.protocol === "https:" ? 443 : 80);
    }
    const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      let settled = false;
      const fail = (e: unknown) => {
        if (settled) return;
        settled = true;
        reject(e);
      };
      const req = this.#mod.request(opts, (r) => {
        settled = true;
        resolve(r);
      });
      req.on("error", (e: NodeJS.ErrnoException) => {
        if (e.name === "AbortError") return fail(e);
        if (e instanceof DeadlineExceeded) return fail(e);
        fail(this.unreachable(e));
      });
      if (timeoutMs !== null && timeoutMs > 0) {
        // Idle time: no answer (or no next chunk) for this long.
        req.setTimeout(timeoutMs, () => {
          req.destroy(
            new DeadlineExceeded(
              `${call.method} ${call.path}: no answer from the berth daemon at ${this.ep.url} within ${timeoutMs} ms`,
            ),
          );
        });
      }
      if (body === undefined) {
        req.end();
      } else if (body instanceof Uint8Array) {
        req.end(body);
      } else {
        body.on("error", (e) => req.destroy(e));
        body.pipe(req);
      }
    });
    if (res.statusCode !== undefined && res.statusCode >= 200 && res.statusCode < 300) return res;
    // At most 1 MiB of an error answer is read (as the Go client reads).
    const raw = await readAtMost(this.read(res), MAX_ERROR_BODY);
    if (!res.complete) res.destroy();
    const text = raw.toString("utf8");
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    throw errorFor(res.statusCode ?? 0, parsed, text);
  }

  /** Sends a call and returns its JSON answer (undefined for an empty one). */
  async json<T = any>(call: Call): Promise<T> {
    const raw = await readAll(this.read(await this.request(call)));
    return (raw.length ? JSON.parse(raw.toString("utf8")) : undefined) as T;
  }

  /** Sends a call and returns its answer's bytes. */
  async bytes(call: Call): Promise<Uint8Array> {
    return asBytes(await readAll(this.read(await this.request(call))));
  }
}
