// The client of the berth API: Berth (the daemon) and Sandbox (a handle on
// one sandbox). Every method is async; streams (exec output, egress,
// downloads) are async iterables read as the daemon sends them.

import type { IncomingMessage } from "node:http";
import { createWriteStream } from "node:fs";
import { readFile, readdir, lstat, readlink } from "node:fs/promises";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { join, relative, sep } from "node:path";
import { type ApiError, DeadlineExceeded, InvalidArgument, NotFound, TooLarge, errorFromApi } from "./errors.js";
import { type Body, type Call, type Query, Transport, endpoint, lines } from "./http.js";
import { Terminal, openTerminal } from "./terminal.js";
import { tarOf, type TarEntry } from "./tar.js";
import {
  type APIKey,
  type ApplyResult,
  type AuditRecord,
  type BuildEvent,
  type BuildResult,
  type Image,
  type Pool,
  type PullEvent,
  type Quota,
  type RuntimeInfo,
  type Scope,
  type Secret,
  type TenantUsage,
  type Usage,
  type VersionInfo,
  Diff,
  type EgressRecord,
  type ExecEvent,
  ExecResult,
  type FileInfo,
  type FileResult,
  type GlobResult,
  type GrepResult,
  type ListResult,
  type Port,
  type Process,
  type ReadResult,
  type SandboxEvent,
  type SandboxInfo,
  Snapshot,
  type WatchEvent,
  applyResultFromJSON,
  b64decode,
  execEventFromJSON,
  portFromJSON,
  processFromJSON,
  sandboxInfoFromJSON,
} from "./types.js";

/** A request to a sandbox's private port carries its access token as this
 * header, as the berth_access_token query parameter (which sets a cookie of
 * that name) or as that cookie. */
export const ACCESS_TOKEN_HEADER = "X-Berth-Access-Token";
const ACCESS_TOKEN_QUERY = "berth_access_token";
// The domain of ports in host form when the daemon names none.
const DEFAULT_PORTS_DOMAIN = "berth.localhost";

export interface BerthOptions {
  /** The daemon: http(s)://host:port or unix:///path/berth.sock (default
   * $BERTH_URL, else http://127.0.0.1:7680). */
  url?: string;
  /** Sent as Authorization: Bearer (default $BERTH_API_KEY). */
  apiKey?: string;
  /** How long a call may go without an answer, in milliseconds (default
   * 300000). Calls that wait on a command (exec, waitProcess, snapshots,
   * forks) wait as long as it runs: its own timeoutMs bounds it. */
  timeoutMs?: number;
}

/** A network policy: what a sandbox may reach. */
export interface NetworkPolicy {
  mode?: "none" | "allowlist" | "open" | (string & {});
  /** Domains, *.wildcards, IPv4 addresses or CIDRs, each with an optional port or range. */
  allow?: string[];
  deny?: string[];
  /** Stored secrets bound to the hosts that may receive them. */
  secrets?: Array<{ secret: string; host: string; header?: string; format?: string; env?: string }>;
}

/** What a sandbox is made with. Sizes are bytes; times are milliseconds
 * (sent as whole seconds, rounded up; 0 turns that timeout off). */
export interface CreateOptions {
  /** The root file system: "host" (default), an OCI image reference, a
   * template name, or a snapshot (a Snapshot or "snapshot:NAME"). */
  image?: string | Snapshot;
  /** The isolation tier (see Berth.runtimes; default the daemon's). */
  runtime?: string;
  labels?: Record<string, string>;
  env?: Record<string, string>;
  /** The default working directory of execs (default /home/user). */
  workdir?: string;
  /** The default user of execs: a name or uid[:gid] (default "user"). */
  user?: string;
  memory?: number;
  cpus?: number;
  pids?: number;
  disk?: number;
  openFiles?: number;
  /** A mode ("none", "allowlist", "open") or a policy; allow alone makes an allowlist. */
  network?: NetworkPolicy["mode"] | NetworkPolicy;
  allow?: string[];
  /** Stop after this long without activity. */
  idleTimeoutMs?: number;
  /** Delete this long after it stopped. */
  deleteAfterMs?: number;
  /** Archive the files this long after it stopped. */
  archiveAfterMs?: number;
  /** Stop this long after creation, busy or not. */
  maxLifetimeMs?: number;
  /** Start again when a request comes for one of its ports after an idle stop. */
  autoResume?: boolean;
  /** Ports inside served without the access token. */
  publicPorts?: number[];
  /** Every port served without the access token. */
  public?: boolean;
  /** A command line started in the background at every start. */
  startCmd?: string;
  /** Whether the handle's Symbol.asyncDispose (await using) deletes the
   * sandbox: default true for create, false for getOrCreate and get. */
  ephemeral?: boolean;
}

export interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** Written to the command's standard input, which is then closed. */
  stdin?: Uint8Array | string;
  /** Kills the command's whole process group after this many milliseconds
   * (the result says timedOut; no error is thrown). */
  timeoutMs?: number;
  /** Bounds each of stdout and stderr as kept (default 4 MiB); past it the
   * result says truncated. */
  maxOutputBytes?: number;
  /** Aborts the call (the command goes on in the sandbox until its timeout). */
  signal?: AbortSignal;
}

export interface ProcessOptions extends ExecOptions {
  /** Run on a terminal of this size (its output is all stdout). */
  tty?: { rows: number; cols: number };
  /** Keep its input open, for writeStdin and attach (a terminal's always is). */
  openStdin?: boolean;
}

export interface TerminalOptions {
  rows?: number;
  cols?: number;
  cwd?: string;
  user?: string;
  env?: Record<string, string>;
}

/** Who acts, and where relative paths start, in a file operation. */
export interface Where {
  user?: string;
  cwd?: string;
}

export interface UploadOptions {
  /** Permission bits (default 0644). */
  mode?: number;
  user?: string;
  /** Refuse (AlreadyExists) if the file exists. */
  createOnly?: boolean;
}

export interface BuildOptions {
  /** The Dockerfile's path in the context (default "Dockerfile"). */
  dockerfile?: string;
  /** Build arguments (ARG). */
  args?: Record<string, string>;
  /** Run every step again, the cache unused. */
  noCache?: boolean;
  /** The network mode of RUN steps. */
  network?: string;
}

export interface ListOptions {
  labels?: Record<string, string>;
  /** A selector expression (k=v, k!=v, k, !k, k in (a,b)), joined with labels. */
  selector?: string;
}

/** The copies a fork made, in order, with the id of the layer they share
 * (snapshot; "" when the source had changed nothing) and how long the
 * source's processes were frozen for the capture. */
export type Forks = Sandbox[] & { snapshot: string; frozenMs: number };

/** A file to write in a batch: [path, content] or { path, content }. */
export type BatchFile = [string, Uint8Array | string] | { path: string; content: Uint8Array | string; mode?: number };

type Json = Record<string, any>;

function sb(id: string, ...rest: string[]): string {
  return "/v1/sandboxes/" + encodeURIComponent(id) + rest.map((r) => "/" + r).join("");
}

function dropUndefined<T extends Json>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined && v !== null)) as Partial<T>;
}

function toBuffer(d: Uint8Array | string): Buffer {
  return typeof d === "string" ? Buffer.from(d, "utf8") : Buffer.from(d.buffer, d.byteOffset, d.byteLength);
}

function seconds(ms: number | undefined, name: string): number | undefined {
  if (ms === undefined) return undefined;
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
    throw new InvalidArgument(`${name}: ${String(ms)} is not a number of milliseconds`);
  }
  return Math.ceil(ms / 1000);
}

function execBody(cmd: string | string[], o: ExecOptions): Json {
  const body: Json = typeof cmd === "string" ? { shell: cmd } : { cmd: [...cmd] };
  if (o.env && Object.keys(o.env).length) body.env = { ...o.env };
  if (o.cwd) body.cwd = o.cwd;
  if (o.user) body.user = o.user;
  if (o.stdin !== undefined && o.stdin.length > 0) body.stdin = toBuffer(o.stdin).toString("base64");
  if (o.timeoutMs) body.timeout_ms = Math.ceil(o.timeoutMs);
  if (o.maxOutputBytes) body.max_output_bytes = o.maxOutputBytes;
  return body;
}

function networkBody(network: CreateOptions["network"], allow: string[] | undefined): NetworkPolicy | undefined {
  if (network === undefined && !allow?.length) return undefined;
  const n: NetworkPolicy = typeof network === "string" ? { mode: network } : { ...(network ?? {}) };
  if (allow?.length) {
    n.mode ??= "allowlist";
    n.allow = [...(n.allow ?? []), ...allow];
  }
  return n;
}

function createBody(o: CreateOptions): Json {
  const limits = dropUndefined({
    memory_bytes: o.memory,
    cpus: o.cpus,
    pids: o.pids,
    disk_bytes: o.disk,
    open_files: o.openFiles,
  });
  const timeouts = dropUndefined({
    idle_timeout_s: seconds(o.idleTimeoutMs, "idleTimeoutMs"),
    delete_after_s: seconds(o.deleteAfterMs, "deleteAfterMs"),
    archive_after_s: seconds(o.archiveAfterMs, "archiveAfterMs"),
    max_lifetime_s: seconds(o.maxLifetimeMs, "maxLifetimeMs"),
    auto_resume: o.autoResume || undefined,
  });
  return dropUndefined({
    image: o.image instanceof Snapshot ? o.image.ref : o.image,
    runtime: o.runtime,
    labels: o.labels && Object.keys(o.labels).length ? { ...o.labels } : undefined,
    env: o.env && Object.keys(o.env).length ? { ...o.env } : undefined,
    workdir: o.workdir,
    user: o.user,
    limits: Object.keys(limits).length ? limits : undefined,
    timeouts: Object.keys(timeouts).length ? timeouts : undefined,
    network: networkBody(o.network, o.allow),
    public_ports: o.publicPorts?.length ? [...o.publicPorts] : undefined,
    public: o.public || undefined,
    start_cmd: o.startCmd,
  });
}

function selectorQuery(o: ListOptions | Record<string, string> | undefined): Query {
  const opts: ListOptions =
    o && ("labels" in o || "selector" in o) && (typeof o.labels === "object" || typeof o.selector === "string")
      ? (o as ListOptions)
      : { labels: o as Record<string, string> | undefined };
  let sel = Object.entries(opts.labels ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(",");
  if (opts.selector) sel = sel ? `${sel},${opts.selector}` : opts.selector;
  return sel ? { selector: sel } : {};
}

function checkPort(port: number): number {
  if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw new InvalidArgument(`port: ${String(port)} is not a TCP port (1–65535)`);
  }
  return port;
}

/** prefix/path with the token added to path's query (a fragment stays last). */
function withPath(prefix: string, path: string, token: string): string {
  let fragment = "";
  const sharp = path.indexOf("#");
  if (sharp >= 0) {
    fragment = path.slice(sharp);
    path = path.slice(0, sharp);
  }
  let query = "";
  const q = path.indexOf("?");
  if (q >= 0) {
    query = path.slice(q + 1);
    path = path.slice(0, q);
  }
  if (token) query = [query, new URLSearchParams({ [ACCESS_TOKEN_QUERY]: token }).toString()].filter(Boolean).join("&");
  return prefix + "/" + path.replace(/^\/+/, "") + (query ? "?" + query : "") + fragment;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function decodeResults(res: Json[]): FileResult[] {
  return res.map((r) => {
    const out: FileResult = { path: String(r.path) };
    if (r.error) out.error = r.error;
    else out.content = b64decode(r.content);
    return out;
  });
}

/** A handle on one sandbox, from Berth.create, getOrCreate or get.
 * `await using sb = await berth.create()` deletes it when the block ends
 * (unless ephemeral is false). */
export class Sandbox {
  readonly id: string;
  /** The sandbox as last described by the daemon (create, get, refresh, a lifecycle call). */
  info: SandboxInfo;
  ephemeral: boolean;
  /** @internal */
  readonly berth: Berth;

  /** @internal */
  constructor(berth: Berth, info: SandboxInfo, ephemeral = false) {
    this.berth = berth;
    this.info = info;
    this.id = info.id;
    this.ephemeral = ephemeral;
  }

  private get t(): Transport {
    return this.berth.transport;
  }

  /** JSON.stringify(sandbox) gives its info as the daemon described it. */
  toJSON(): Json {
    return this.info.raw;
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Sandbox { id: '${this.id}', state: '${this.info.state}', ephemeral: ${this.ephemeral} }`;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.ephemeral) return;
    try {
      await this.delete();
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
    }
  }

  // lifecycle

  private async lifecycle(verb: string, json?: unknown, wait = false): Promise<SandboxInfo> {
    const d = await this.t.json({ method: "POST", path: sb(this.id, verb), json, timeoutMs: wait ? null : undefined });
    if (d) this.info = sandboxInfoFromJSON(d);
    return this.info;
  }

  /** Reads the sandbox's state again. */
  async refresh(): Promise<SandboxInfo> {
    this.info = sandboxInfoFromJSON(await this.t.json({ method: "GET", path: sb(this.id) }));
    return this.info;
  }

  /** Stops the sandbox, keeping its files. */
  stop(): Promise<SandboxInfo> {
    return this.lifecycle("stop");
  }

  /** Starts a stopped sandbox again, its files as they were. */
  start(): Promise<SandboxInfo> {
    return this.lifecycle("start");
  }

  delete(): Promise<void> {
    return this.berth.delete(this.id);
  }

  /** Freezes the sandbox's processes (state paused); exec, process and file
   * calls are a Conflict until resume. With memory (a runtime with
   * memory_checkpoint: gvisor) the processes are saved with their memory
   * and the sandbox's CPU and memory freed; other runtimes throw
   * NotImplementedByRuntime. */
  pause(opts: { memory?: boolean } = {}): Promise<SandboxInfo> {
    return this.lifecycle("pause", opts.memory ? { memory: true } : undefined, true);
  }

  /** Thaws a paused sandbox: its processes go on where they were. */
  resume(): Promise<SandboxInfo> {
    return this.lifecycle("resume");
  }

  // snapshots, forks, diff and apply

  /** Captures the sandbox's files as snapshot `name` (a running sandbox keeps
   * running); make sandboxes from it with create({ image: snap.ref }).
   * AlreadyExists if the name is taken. */
  async snapshot(name: string, opts: { labels?: Record<string, string> } = {}): Promise<Snapshot> {
    const json = dropUndefined({ name, labels: opts.labels && Object.keys(opts.labels).length ? opts.labels : undefined });
    return Snapshot.fromJSON(await this.t.json({ method: "POST", path: sb(this.id, "snapshots"), json, timeoutMs: null }));
  }

  /** Makes `count` running copies of the sandbox's files as they are now:
   * each has the source's settings but none of its processes, and not its
   * labels: `labels` (one set for every copy, or a list of one per copy) and
   * berth.fork_of=<this id>. The handles are ephemeral unless ephemeral is false. */
  async fork(
    count = 1,
    opts: { labels?: Record<string, string> | Array<Record<string, string>>; ephemeral?: boolean } = {},
  ): Promise<Forks> {
    let sets: Array<Record<string, string>> | undefined;
    if (Array.isArray(opts.labels)) sets = opts.labels.map((l) => ({ ...l }));
    else if (opts.labels && Object.keys(opts.labels).length) sets = Array.from({ length: count }, () => ({ ...(opts.labels as Record<string, string>) }));
    const res = await this.t.json({ method: "POST", path: sb(this.id, "fork"), json: dropUndefined({ count, labels: sets }), timeoutMs: null });
    const copies = (res.sandboxes as Json[]).map((s) => new Sandbox(this.berth, sandboxInfoFromJSON(s), opts.ephemeral ?? true));
    return Object.assign(copies, { snapshot: String(res.snapshot ?? ""), frozenMs: Number(res.frozen_ms ?? 0) });
  }

  private diffCall(against: string | Snapshot | undefined, format: string): Call {
    const query: Json = { format };
    if (against) query.against = against instanceof Snapshot ? against.ref : against;
    return { method: "GET", path: sb(this.id, "diff"), query, timeoutMs: null };
  }

  /** What the sandbox changed since its image, or since snapshot `against`
   * (a name, "snapshot:NAME" or a Snapshot): added, modified and deleted paths. */
  async diff(against?: string | Snapshot): Promise<Diff> {
    return Diff.fromJSON(await this.t.json(this.diffCall(against, "json")));
  }

  /** The changes as a layer tar (whiteouts for deletions), for applyTar. */
  diffTar(against?: string | Snapshot): Promise<Uint8Array> {
    return this.t.bytes(this.diffCall(against, "tar"));
  }

  /** The changes as a unified text diff. */
  async diffPatch(against?: string | Snapshot): Promise<string> {
    return Buffer.from(await this.t.bytes(this.diffCall(against, "patch"))).toString("utf8");
  }

  /** Merges what another sandbox (a handle or an id) or a snapshot (a
   * Snapshot or "snapshot:NAME") changed over its own base into this one.
   * Both sides changing a path differently is a Conflict with reason
   * "merge_conflict" and the paths in .paths, unless overwrite (theirs win). */
  async apply(from: Sandbox | SandboxInfo | Snapshot | string, opts: { overwrite?: boolean } = {}): Promise<ApplyResult> {
    let source: string;
    if (from instanceof Snapshot) source = from.ref;
    else if (typeof from === "string") source = from;
    else if (from && typeof from === "object" && typeof (from as { id?: unknown }).id === "string") source = (from as { id: string }).id;
    else throw new InvalidArgument(`from: ${String(from)} is not a sandbox, a sandbox id or a snapshot`);
    const json: Json = { from: source };
    if (opts.overwrite) json.overwrite = true;
    return applyResultFromJSON(await this.t.json({ method: "POST", path: sb(this.id, "apply"), json, timeoutMs: null }));
  }

  /** Applies a layer tar (another sandbox's diffTar) as it comes. */
  async applyTar(tar: Body): Promise<ApplyResult> {
    return applyResultFromJSON(
      await this.t.json({
        method: "POST",
        path: sb(this.id, "apply"),
        body: tar,
        headers: { "Content-Type": "application/x-tar" },
        timeoutMs: null,
      }),
    );
  }

  // exec

  /** Runs a command (an argv, or a string for /bin/sh -c) and waits for it.
   * A command that fails is a result (exitCode, signal, timedOut,
   * oomKilled), not an error; errors are for what the daemon refused. */
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult> {
    const d = await this.t.json({ method: "POST", path: sb(this.id, "exec"), json: execBody(cmd, opts), timeoutMs: null, signal: opts.signal });
    return ExecResult.fromJSON(d);
  }

  /** Runs a command and yields its events as they happen: start, stdout and
   * stderr chunks, then exit (with the result, its output empty) or error.
   * The request is sent when iteration begins; breaking out of the loop
   * closes the stream (the command goes on until it ends or times out). */
  async *execStream(cmd: string | string[], opts: ExecOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const res = await this.t.request({
      method: "POST",
      path: sb(this.id, "exec"),
      query: { stream: "true" },
      json: execBody(cmd, opts),
      timeoutMs: null,
      signal: opts.signal,
    });
    try {
      for await (const line of lines(this.t.read(res))) yield execEventFromJSON(JSON.parse(line));
    } finally {
      res.destroy();
    }
  }

  // background processes

  /** Starts a command in the background and returns its pid. tty runs it on
   * a terminal of that size; openStdin keeps its input open for writeStdin
   * and attach. */
  async startProcess(cmd: string | string[], opts: ProcessOptions = {}): Promise<number> {
    const body = execBody(cmd, opts);
    if (opts.tty) body.tty = { rows: opts.tty.rows, cols: opts.tty.cols };
    if (opts.openStdin) body.open_stdin = true;
    const d = await this.t.json({ method: "POST", path: sb(this.id, "processes"), json: body });
    return Number(d.pid);
  }

  async getProcess(pid: number): Promise<Process> {
    return processFromJSON(await this.t.json({ method: "GET", path: sb(this.id, "processes", String(pid)) }));
  }

  /** The processes started through the API, running and ended. */
  async listProcesses(): Promise<Process[]> {
    const d = await this.t.json({ method: "GET", path: sb(this.id, "processes") });
    return (d.processes as Json[]).map(processFromJSON);
  }

  /** Waits for a background process to end and returns its result with its
   * kept output; DeadlineExceeded after timeoutMs (the process goes on). */
  async waitProcess(pid: number, opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
    const query = opts.timeoutMs ? { timeout_ms: Math.ceil(opts.timeoutMs) } : undefined;
    const d = await this.t.json({ method: "POST", path: sb(this.id, "processes", String(pid), "wait"), query, timeoutMs: null });
    return ExecResult.fromJSON(d);
  }

  /** Sends a signal (a name such as "TERM" or a number; default KILL) to a process's group. */
  async killProcess(pid: number, signal: string | number = "KILL"): Promise<void> {
    await this.t.json({ method: "POST", path: sb(this.id, "processes", String(pid), "signal"), json: { signal: String(signal) } });
  }

  /** A background process's output as events: what it kept so far (stdout
   * and stderr), then, with follow, what it prints as it prints it, and its
   * exit. */
  async *processOutput(pid: number, opts: { follow?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<ExecEvent, void, undefined> {
    yield* this.ndjson(
      {
        method: "GET",
        path: sb(this.id, "processes", String(pid), "output"),
        query: { follow: opts.follow ? "true" : undefined },
        timeoutMs: opts.follow ? null : undefined,
      },
      opts.signal,
      execEventFromJSON,
    );
  }

  /** Forgets an ended process (its kept output and result); Conflict while it runs. */
  async removeProcess(pid: number): Promise<void> {
    await this.t.json({ method: "DELETE", path: sb(this.id, "processes", String(pid)) });
  }

  /** Writes bytes (a string as UTF-8) to the input of a process started with
   * openStdin or tty; with close the input is closed after them (EOF).
   * Conflict if its input is not open. */
  async writeStdin(pid: number, data: Uint8Array | string, opts: { close?: boolean } = {}): Promise<void> {
    await this.t.json({
      method: "POST",
      path: sb(this.id, "processes", String(pid), "stdin"),
      query: opts.close ? { close: "true" } : undefined,
      body: toBuffer(data),
      headers: { "Content-Type": "application/octet-stream" },
      timeoutMs: null,
    });
  }

  /** Attaches to a running process (a terminal again, a process started with
   * openStdin); what it printed before comes first. NotFound for an unknown pid. */
  attach(pid: number): Promise<Terminal> {
    return openTerminal(this.t, sb(this.id, "processes", String(pid), "attach"));
  }

  /** Starts a command (an argv, a string for /bin/sh -c; default the user's
   * login shell) on a terminal of rows by cols (default 24 by 80) and
   * attaches to it. The process runs until it exits or is killed, attached
   * or not. */
  openTerminal(cmd?: string | string[], opts: TerminalOptions = {}): Promise<Terminal> {
    const argv = typeof cmd === "string" ? ["/bin/sh", "-c", cmd] : [...(cmd ?? [])];
    const q: Array<[string, string]> = [
      ["rows", String(opts.rows ?? 24)],
      ["cols", String(opts.cols ?? 80)],
      ...argv.map((a): [string, string] => ["cmd", a]),
    ];
    if (opts.user) q.push(["user", opts.user]);
    if (opts.cwd) q.push(["cwd", opts.cwd]);
    for (const [k, v] of Object.entries(opts.env ?? {})) q.push(["env", `${k}=${v}`]);
    return openTerminal(this.t, sb(this.id, "pty"), q);
  }

  // files

  /** Writes bytes, a string (UTF-8) or a stream (a Node Readable, an async
   * iterable of chunks, a web ReadableStream) to a file, making its parents. */
  async upload(path: string, data: Body, opts: UploadOptions = {}): Promise<FileInfo> {
    const query: Json = { path };
    if (opts.user) query.user = opts.user;
    if (opts.mode !== undefined) query.mode = opts.mode.toString(8);
    if (opts.createOnly) query.create_only = "true";
    return this.t.json({
      method: "PUT",
      path: sb(this.id, "files"),
      query,
      body: data,
      headers: { "Content-Type": "application/octet-stream" },
    });
  }

  /** Reads a whole file. `maxBytes` bounds it: a file that turns out longer
   * (the sandbox controls its files: one may grow, or be swapped for
   * another, after a stat said it was small) throws TooLarge naming the
   * path and the bound as soon as more arrives, having kept no more than
   * maxBytes + 1 bytes; the rest is not read. */
  async download(path: string, opts: { user?: string; maxBytes?: number } = {}): Promise<Uint8Array> {
    const max = opts.maxBytes;
    const call: Call = { method: "GET", path: sb(this.id, "files"), query: { path, user: opts.user } };
    if (max === undefined) return this.t.bytes(call);
    if (!Number.isSafeInteger(max) || max < 0) {
      throw new InvalidArgument(`download: maxBytes must be a whole number of bytes (0 or more), got ${String(max)}`);
    }
    const tooLarge = () =>
      new TooLarge(`download: '${path}' is larger than maxBytes, ${max} bytes`, { paths: [path] });
    const res = await this.t.request(call);
    try {
      const declared = Number(res.headers["content-length"]);
      if (Number.isFinite(declared) && declared > max) throw tooLarge();
      const chunks: Buffer[] = [];
      let n = 0;
      for await (const c of this.t.read(res)) {
        // Keep at most one byte past the bound: enough to know it is past.
        chunks.push(c.length > max + 1 - n ? c.subarray(0, max + 1 - n) : c);
        n += c.length;
        if (n > max) throw tooLarge();
      }
      const all = Buffer.concat(chunks);
      return new Uint8Array(all.buffer, all.byteOffset, all.byteLength);
    } finally {
      // Stop the rest of a file read in part.
      if (!res.complete) res.destroy();
    }
  }

  /** A file as a stream: a Node Readable (async-iterable by chunks;
   * Readable.toWeb makes a web ReadableStream of it). Errors (NotFound, …)
   * are thrown by the await, before any byte; a connection that breaks
   * later fails the stream with Unavailable. */
  async downloadStream(path: string, opts: { user?: string } = {}): Promise<Readable> {
    return this.readable(await this.t.request({ method: "GET", path: sb(this.id, "files"), query: { path, user: opts.user } }));
  }

  private readable(res: IncomingMessage): Readable {
    const out = Readable.from(this.t.read(res), { objectMode: false });
    out.once("close", () => res.destroy());
    return out;
  }

  /** Streams a file to a local path. */
  async downloadTo(path: string, localPath: string, opts: { user?: string } = {}): Promise<void> {
    await pipeline(await this.downloadStream(path, opts), createWriteStream(localPath));
  }

  /** Unpacks a tar stream into a directory (made if missing). */
  uploadArchive(path: string, tar: Body, opts: { user?: string } = {}): Promise<{ entries: number; bytes: number }> {
    return this.t.json({
      method: "PUT",
      path: sb(this.id, "archive"),
      query: { path, user: opts.user },
      body: tar,
      headers: { "Content-Type": "application/x-tar" },
    });
  }

  /** A file or tree as a tar (the tree under its own name). */
  downloadArchive(path: string, opts: { user?: string } = {}): Promise<Uint8Array> {
    return this.t.bytes({ method: "GET", path: sb(this.id, "archive"), query: { path, user: opts.user } });
  }

  /** downloadArchive as a stream (see downloadStream). */
  async downloadArchiveStream(path: string, opts: { user?: string } = {}): Promise<Readable> {
    return this.readable(await this.t.request({ method: "GET", path: sb(this.id, "archive"), query: { path, user: opts.user } }));
  }

  /** Any file operation by name (stat, exists, list, mkdir, move, remove,
   * chmod, chown, read, write, edit, glob, grep, upload, download), with the
   * daemon's own (snake_case) request fields; undefined ones are left out. */
  fs<T = any>(op: string, body: Json): Promise<T> {
    return this.t.json({ method: "POST", path: sb(this.id, "fs", op), json: dropUndefined(body) });
  }

  /** Writes many files (at most 64 MiB in all); each result has path and, on
   * failure, error ({ class, reason, message }); nothing is thrown for one file. */
  async uploadFiles(files: BatchFile[], opts: Where = {}): Promise<FileResult[]> {
    const list = files.map((f) => {
      const [path, content, mode] = Array.isArray(f) ? [f[0], f[1], undefined] : [f.path, f.content, f.mode];
      return dropUndefined({ path, content: toBuffer(content).toString("base64"), mode });
    });
    const d = await this.fs("upload", { files: list, ...opts });
    return (d.results as Json[]).map((r) => (r.error ? { path: String(r.path), error: r.error } : { path: String(r.path) }));
  }

  /** Reads many files; each result has path and content (bytes) or error. */
  async downloadFiles(paths: string[], opts: Where = {}): Promise<FileResult[]> {
    const d = await this.fs("download", { paths: [...paths], ...opts });
    return decodeResults(d.results);
  }

  stat(path: string, opts: Where & { noFollow?: boolean } = {}): Promise<FileInfo> {
    return this.fs("stat", { path, no_follow: opts.noFollow || undefined, user: opts.user, cwd: opts.cwd });
  }

  async exists(path: string, opts: Where = {}): Promise<boolean> {
    return Boolean((await this.fs("exists", { path, ...opts })).exists);
  }

  /** A directory's entries (depth levels deep; default 1). */
  ls(path: string, opts: Where & { depth?: number; limit?: number } = {}): Promise<ListResult> {
    return this.fs("list", { path, ...opts });
  }

  mkdir(path: string, opts: Where & { parents?: boolean; mode?: number } = {}): Promise<FileInfo> {
    return this.fs("mkdir", { path, parents: opts.parents ?? true, mode: opts.mode, user: opts.user, cwd: opts.cwd });
  }

  move(from: string, to: string, opts: Where & { overwrite?: boolean } = {}): Promise<FileInfo> {
    return this.fs("move", { from, to, overwrite: opts.overwrite || undefined, user: opts.user, cwd: opts.cwd });
  }

  async remove(path: string, opts: Where & { recursive?: boolean; force?: boolean } = {}): Promise<void> {
    await this.fs("remove", { path, recursive: opts.recursive || undefined, force: opts.force || undefined, user: opts.user, cwd: opts.cwd });
  }

  chmod(path: string, mode: number, opts: Where = {}): Promise<FileInfo> {
    return this.fs("chmod", { path, mode, ...opts });
  }

  chown(path: string, owner: string, opts: Where & { recursive?: boolean } = {}): Promise<FileInfo> {
    return this.fs("chown", { path, owner, recursive: opts.recursive || undefined, user: opts.user, cwd: opts.cwd });
  }

  /** A page of a text file's numbered lines, from line offset (0-based). */
  read(path: string, opts: Where & { offset?: number; limit?: number; maxLineChars?: number } = {}): Promise<ReadResult> {
    return this.fs("read", {
      path,
      offset: opts.offset || undefined,
      limit: opts.limit,
      max_line_chars: opts.maxLineChars,
      user: opts.user,
      cwd: opts.cwd,
    });
  }

  /** Writes a text file, making its parents. */
  write(path: string, content: string, opts: Where & { createOnly?: boolean; mode?: number } = {}): Promise<FileInfo> {
    return this.fs("write", { path, content, create_only: opts.createOnly || undefined, mode: opts.mode, user: opts.user, cwd: opts.cwd });
  }

  /** Replaces `oldText` with `newText` (once: it must occur exactly once;
   * every occurrence with replaceAll) and returns how many were replaced. */
  async edit(path: string, oldText: string, newText: string, opts: Where & { replaceAll?: boolean } = {}): Promise<number> {
    const d = await this.fs("edit", { path, old: oldText, new: newText, replace_all: opts.replaceAll || undefined, user: opts.user, cwd: opts.cwd });
    return Number(d.occurrences);
  }

  /** Files whose path matches a glob (with **) under path. */
  glob(pattern: string, path?: string, opts: Where & { limit?: number; includeDirs?: boolean } = {}): Promise<GlobResult> {
    return this.fs("glob", { pattern, path, limit: opts.limit, include_dirs: opts.includeDirs || undefined, user: opts.user, cwd: opts.cwd });
  }

  /** Lines that contain pattern (a literal, or a regular expression with
   * regex) in the files under path (those matching glob). */
  grep(
    pattern: string,
    path?: string,
    opts: Where & { glob?: string; regex?: boolean; ignoreCase?: boolean; limit?: number } = {},
  ): Promise<GrepResult> {
    return this.fs("grep", {
      pattern,
      path,
      glob: opts.glob,
      regex: opts.regex || undefined,
      ignore_case: opts.ignoreCase || undefined,
      limit: opts.limit,
      user: opts.user,
      cwd: opts.cwd,
    });
  }

  // network

  /** Replaces the network policy (a mode, a policy, or allow for an
   * allowlist); new connections obey it at once. */
  async setNetwork(network?: CreateOptions["network"], opts: { allow?: string[] } = {}): Promise<SandboxInfo> {
    const n = networkBody(network, opts.allow) ?? { mode: "none" };
    this.info = sandboxInfoFromJSON(await this.t.json({ method: "PATCH", path: sb(this.id), json: { network: n } }));
    return this.info;
  }

  /** The sandbox's egress records (connections, requests, DNS queries), oldest first. */
  async egress(opts: { after?: number; limit?: number; denied?: boolean } = {}): Promise<EgressRecord[]> {
    const d = await this.t.json({
      method: "GET",
      path: sb(this.id, "egress"),
      query: { after: opts.after || undefined, limit: opts.limit || undefined, denied: opts.denied ? "true" : undefined },
    });
    return d.records;
  }

  /** The stored egress records, then new ones as they happen, until the
   * sandbox is deleted, the loop breaks, or signal aborts. */
  async *followEgress(opts: { after?: number; denied?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<EgressRecord, void, undefined> {
    yield* this.ndjson(
      {
        method: "GET",
        path: sb(this.id, "egress"),
        query: { after: opts.after || undefined, denied: opts.denied ? "true" : undefined, follow: "true" },
        timeoutMs: null,
      },
      opts.signal,
      (d) => d as EgressRecord,
    );
  }

  /** An NDJSON stream's objects as they arrive; an abort by signal ends it
   * quietly, whichever way the socket broke. */
  private async *ndjson<T>(call: Call, signal: AbortSignal | undefined, parse: (d: Json) => T): AsyncGenerator<T, void, undefined> {
    let res: IncomingMessage | undefined;
    try {
      res = await this.t.request({ ...call, signal });
      for await (const line of lines(this.t.read(res))) yield parse(JSON.parse(line));
    } catch (e) {
      if (!signal?.aborted) throw e;
    } finally {
      res?.destroy();
    }
  }

  /** What the sandbox does, as it happens (Server-Sent Events): created,
   * started, stopped, deleted, process_started, process_exited, oom,
   * timed_out, limit_hit, egress_denied. Ends when the sandbox is deleted,
   * the loop breaks, or signal aborts. */
  async *events(opts: { signal?: AbortSignal } = {}): AsyncGenerator<SandboxEvent, void, undefined> {
    let res: IncomingMessage | undefined;
    try {
      res = await this.t.request({ method: "GET", path: sb(this.id, "events"), timeoutMs: null, signal: opts.signal });
      let data: string[] = [];
      for await (const line of lines(this.t.read(res), true)) {
        if (line === "") {
          if (data.length) yield JSON.parse(data.join("\n")) as SandboxEvent;
          data = [];
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        }
      }
      if (data.length) yield JSON.parse(data.join("\n")) as SandboxEvent;
    } catch (e) {
      if (!opts.signal?.aborted) throw e;
    } finally {
      res?.destroy();
    }
  }

  /** Changes under path (recursive for the whole tree) as they happen:
   * create, write, remove, rename, chmod events. */
  async *watch(path: string, opts: Where & { recursive?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<WatchEvent, void, undefined> {
    yield* this.ndjson(
      {
        method: "GET",
        path: sb(this.id, "fs", "watch"),
        query: { path, user: opts.user, cwd: opts.cwd, recursive: opts.recursive ? "true" : undefined },
        timeoutMs: null,
      },
      opts.signal,
      (d) => ({ type: String(d.type), path: String(d.path ?? ""), isDir: Boolean(d.is_dir), time: String(d.time ?? "") }),
    );
  }

  /** What the sandbox uses now: CPU seconds, memory, pids, OOM kills, disk, egress. */
  stats(): Promise<Usage> {
    return this.t.json({ method: "GET", path: sb(this.id, "stats") });
  }

  /** Counts as activity: holds off the idle timeout. */
  async keepalive(): Promise<void> {
    await this.t.json({ method: "POST", path: sb(this.id, "keepalive") });
  }

  /** Changes a running sandbox: labels (a merge: a string sets one, null
   * removes it), limits (a running sandbox's ceilings at once; 0 keeps one)
   * and timeouts (milliseconds, field by field). */
  async update(opts: {
    labels?: Record<string, string | null>;
    memory?: number;
    cpus?: number;
    pids?: number;
    disk?: number;
    openFiles?: number;
    idleTimeoutMs?: number;
    deleteAfterMs?: number;
    archiveAfterMs?: number;
    maxLifetimeMs?: number;
    autoResume?: boolean;
  }): Promise<SandboxInfo> {
    const limits = dropUndefined({ memory_bytes: opts.memory, cpus: opts.cpus, pids: opts.pids, disk_bytes: opts.disk, open_files: opts.openFiles });
    const timeouts = dropUndefined({
      idle_timeout_s: seconds(opts.idleTimeoutMs, "idleTimeoutMs"),
      delete_after_s: seconds(opts.deleteAfterMs, "deleteAfterMs"),
      archive_after_s: seconds(opts.archiveAfterMs, "archiveAfterMs"),
      max_lifetime_s: seconds(opts.maxLifetimeMs, "maxLifetimeMs"),
      auto_resume: opts.autoResume || undefined,
    });
    const json = {
      labels: opts.labels,
      limits: Object.keys(limits).length ? limits : undefined,
      timeouts: Object.keys(timeouts).length ? timeouts : undefined,
    };
    this.info = sandboxInfoFromJSON(await this.t.json({ method: "PATCH", path: sb(this.id), json }));
    return this.info;
  }

  // ports

  /** The token that opens the sandbox's private ports (as of the last
   * create, get, refresh or rotateAccessToken). */
  get accessToken(): string {
    return this.info.accessToken;
  }

  /** The ports served without the access token. */
  get publicPorts(): number[] {
    return [...this.info.publicPorts];
  }

  /** The TCP ports processes listen on inside the sandbox, sorted. */
  async ports(): Promise<Port[]> {
    const d = await this.t.json({ method: "GET", path: sb(this.id, "ports") });
    return (d.ports as Json[]).map(portFromJSON);
  }

  /** Waits until a process inside listens on port; DeadlineExceeded after
   * timeoutMs (default 30000), Conflict if the sandbox is not running. */
  async waitForPort(port: number, opts: { timeoutMs?: number } = {}): Promise<Port> {
    checkPort(port);
    const timeoutMs = opts.timeoutMs ?? 30000;
    const deadline = Date.now() + timeoutMs;
    let delay = 20;
    for (;;) {
      const ports = await this.ports();
      const found = ports.find((p) => p.port === port);
      if (found) return found;
      const left = deadline - Date.now();
      if (left <= 0) {
        const others = ports.map((p) => p.port).join(", ");
        throw new DeadlineExceeded(
          `port ${port} of sandbox ${this.id}: nothing listens on it after ${timeoutMs} ms` + (others ? ` (listening: ${others})` : ""),
        );
      }
      await sleep(Math.min(delay, left));
      delay = Math.min(delay * 2, 250);
    }
  }

  /** The address of port inside the sandbox through the daemon:
   * {daemon}/v1/sandboxes/{id}/ports/{port}/{path}, or with hostForm
   * http://{port}-{id}.{ports_domain}:{daemon port}/{path}. Unless the port
   * is public or withToken is false, it carries the access token as
   * ?berth_access_token= (the daemon then sets a cookie). */
  async url(port: number, path = "/", opts: { hostForm?: boolean; withToken?: boolean } = {}): Promise<string> {
    checkPort(port);
    const ep = this.t.ep;
    if (ep.socketPath !== undefined) {
      throw new InvalidArgument(`the daemon at ${ep.url} listens on a unix socket: a port has no URL there (berth port-forward)`);
    }
    const token = (opts.withToken ?? true) && !this.info.publicPorts.includes(port) ? this.info.accessToken : "";
    if (!opts.hostForm) return withPath(ep.origin + sb(this.id, "ports", String(port)), path, token);
    const domain = await this.berth.portsDomain();
    const u = new URL(ep.origin);
    return withPath(`${u.protocol}//${port}-${this.id}.${domain}${u.port ? ":" + u.port : ""}`, path, token);
  }

  /** Gives the sandbox a new access token and returns it; the old one opens nothing from now on. */
  async rotateAccessToken(): Promise<string> {
    const d = await this.t.json({ method: "POST", path: sb(this.id, "access-token") });
    const token = String(d.access_token);
    this.info = { ...this.info, accessToken: token, raw: { ...this.info.raw, access_token: token } };
    return token;
  }

  /** Replaces the ports served without the access token ([] for none). */
  async setPublicPorts(ports: number[]): Promise<SandboxInfo> {
    ports.forEach(checkPort);
    this.info = sandboxInfoFromJSON(await this.t.json({ method: "PATCH", path: sb(this.id), json: { public_ports: [...ports] } }));
    return this.info;
  }
}

/** The client of one berth daemon. */
export class Berth {
  /** The daemon's URL as given (or from $BERTH_URL, or the default). */
  readonly url: string;
  /** @internal */
  readonly transport: Transport;
  private domain = "";

  constructor(opts: BerthOptions = {}) {
    const ep = endpoint(opts.url);
    this.url = ep.url;
    this.transport = new Transport(ep, opts.apiKey ?? process.env.BERTH_API_KEY, opts.timeoutMs ?? 300_000);
  }

  /** JSON.stringify(berth) gives its URL only (never the API key). */
  toJSON(): { url: string } {
    return { url: this.url };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Berth { url: '${this.url}' }`;
  }

  /** Closes the client's idle connections (open streams and terminals go on). */
  close(): void {
    this.transport.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** Creates a sandbox; `await using` deletes it at the block's end unless ephemeral is false. */
  async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const d = await this.transport.json({ method: "POST", path: "/v1/sandboxes", json: createBody(opts) });
    return new Sandbox(this, sandboxInfoFromJSON(d), opts.ephemeral ?? true);
  }

  /** The sandbox carrying these labels (started if stopped), or a new one
   * made with them and opts: one per conversation. */
  async getOrCreate(labels: Record<string, string>, opts: Omit<CreateOptions, "labels"> = {}): Promise<Sandbox> {
    const d = await this.transport.json({
      method: "POST",
      path: "/v1/sandboxes/get-or-create",
      json: createBody({ ...opts, labels }),
    });
    return new Sandbox(this, sandboxInfoFromJSON(d), opts.ephemeral ?? false);
  }

  /** A handle on an existing sandbox; NotFound naming the id. */
  async get(id: string): Promise<Sandbox> {
    return new Sandbox(this, sandboxInfoFromJSON(await this.transport.json({ method: "GET", path: sb(id) })));
  }

  /** The sandboxes whose labels match: list({ labels: {k: v} }),
   * list({ selector: "k=v,!x" }), or list({k: v}) for labels. */
  async list(opts?: ListOptions | Record<string, string>): Promise<SandboxInfo[]> {
    const d = await this.transport.json({ method: "GET", path: "/v1/sandboxes", query: selectorQuery(opts) });
    return (d.sandboxes as Json[]).map(sandboxInfoFromJSON);
  }

  async delete(id: string): Promise<void> {
    await this.transport.json({ method: "DELETE", path: sb(id), timeoutMs: null });
  }

  /** The daemon's runtimes: each available one with what it can do on this
   * host, the others with why they cannot run here. */
  async runtimes(): Promise<RuntimeInfo[]> {
    return (await this.transport.json({ method: "GET", path: "/v1/runtimes" })).runtimes;
  }

  /** The daemon's version, API version, runtimes and ports_domain. */
  version(): Promise<VersionInfo> {
    return this.transport.json({ method: "GET", path: "/v1/version" });
  }

  /** @internal */
  async portsDomain(): Promise<string> {
    if (!this.domain) this.domain = (await this.version()).ports_domain || DEFAULT_PORTS_DOMAIN;
    return this.domain;
  }

  // snapshots: taken with Sandbox.snapshot, used with create({ image: snap.ref })

  /** The named snapshots whose labels match (all without a filter). */
  async listSnapshots(opts?: ListOptions | Record<string, string>): Promise<Snapshot[]> {
    const d = await this.transport.json({ method: "GET", path: "/v1/snapshots", query: selectorQuery(opts) });
    return (d.snapshots as Json[]).map((s) => Snapshot.fromJSON(s));
  }

  /** A snapshot by name, "snapshot:NAME" or id, with the sandboxes made from it (inUse). */
  async getSnapshot(name: string): Promise<Snapshot> {
    return Snapshot.fromJSON(await this.transport.json({ method: "GET", path: "/v1/snapshots/" + encodeURIComponent(name) }));
  }

  /** Removes a snapshot; Conflict naming them while sandboxes are made from it. */
  async deleteSnapshot(name: string | Snapshot): Promise<void> {
    const n = name instanceof Snapshot ? name.id : name;
    await this.transport.json({ method: "DELETE", path: "/v1/snapshots/" + encodeURIComponent(n), timeoutMs: null });
  }

  // secrets: the daemon adds them to sandboxes' requests; no call returns a value

  createSecret(name: string, value: string): Promise<Secret> {
    return this.transport.json({ method: "POST", path: "/v1/secrets", json: { name, value } });
  }

  updateSecret(name: string, value: string): Promise<Secret> {
    return this.transport.json({ method: "PUT", path: "/v1/secrets/" + encodeURIComponent(name), json: { value } });
  }

  async listSecrets(): Promise<Secret[]> {
    return (await this.transport.json({ method: "GET", path: "/v1/secrets" })).secrets;
  }

  async deleteSecret(name: string): Promise<void> {
    await this.transport.json({ method: "DELETE", path: "/v1/secrets/" + encodeURIComponent(name) });
  }

  // images: pulled from a registry, or imported from a docker save / OCI
  // layout tar; create({ image }) pulls one itself when it is missing

  pullImage(ref: string): Promise<Image> {
    return this.transport.json({ method: "POST", path: "/v1/images/pull", json: { ref }, timeoutMs: null });
  }

  /** pullImage with its progress as it happens: resolved, downloading
   * (current of total bytes), exists, unpacked, then done (with the image)
   * or error. */
  async *pullImageStream(ref: string, opts: { signal?: AbortSignal } = {}): AsyncGenerator<PullEvent, void, undefined> {
    yield* this.progress({ method: "POST", path: "/v1/images/pull", json: { ref }, timeoutMs: null }, opts.signal, pullEvent);
  }

  async importImage(tar: Body, opts: { name?: string } = {}): Promise<Image[]> {
    const d = await this.transport.json({
      method: "POST",
      path: "/v1/images/import",
      query: { name: opts.name },
      body: tar,
      headers: { "Content-Type": "application/x-tar" },
      timeoutMs: null,
    });
    return d.images;
  }

  async listImages(): Promise<Image[]> {
    return (await this.transport.json({ method: "GET", path: "/v1/images" })).images;
  }

  inspectImage(ref: string): Promise<Image> {
    return this.transport.json({ method: "GET", path: "/v1/images/" + encodeImageRef(ref) });
  }

  removeImage(ref: string): Promise<Json> {
    return this.transport.json({ method: "DELETE", path: "/v1/images/" + encodeImageRef(ref) });
  }

  /** Builds template `name` from a Dockerfile: context is a directory (sent
   * as a tar, less what its .dockerignore leaves out) or a tar's bytes.
   * Sandboxes are then created with { image: name }. */
  async buildTemplate(name: string, context: string | Uint8Array, opts: BuildOptions = {}): Promise<BuildResult> {
    return this.transport.json(await this.buildCall(name, context, opts));
  }

  /** buildTemplate with its log as it happens: each step (cached or run),
   * a RUN step's output, then done (with the image) or error. */
  async *buildTemplateStream(name: string, context: string | Uint8Array, opts: BuildOptions & { signal?: AbortSignal } = {}): AsyncGenerator<BuildEvent, void, undefined> {
    const call = await this.buildCall(name, context, opts);
    yield* this.progress(call, opts.signal, (d) => ({
      ...d,
      type: String(d.type ?? ""),
      data: b64decode(d.data),
      error: d.error && typeof d.error === "object" ? errorFromApi(d.error as ApiError) : undefined,
    }) as BuildEvent);
  }

  private async buildCall(name: string, context: string | Uint8Array, opts: BuildOptions): Promise<Call> {
    const dockerfile = opts.dockerfile ?? "Dockerfile";
    const tar = typeof context === "string" ? await contextTar(context, dockerfile) : context;
    const q: Array<[string, string]> = [
      ["name", name],
      ["dockerfile", dockerfile],
    ];
    for (const [k, v] of Object.entries(opts.args ?? {})) q.push(["arg", `${k}=${v}`]);
    if (opts.noCache) q.push(["no_cache", "true"]);
    if (opts.network) q.push(["network", opts.network]);
    return {
      method: "POST",
      path: "/v1/templates/build",
      query: q,
      body: tar,
      headers: { "Content-Type": "application/x-tar" },
      timeoutMs: null,
    };
  }

  /** A progress stream (Accept: application/x-ndjson) as parsed events. */
  private async *progress<T>(call: Call, signal: AbortSignal | undefined, parse: (d: Json) => T): AsyncGenerator<T, void, undefined> {
    let res: IncomingMessage | undefined;
    try {
      res = await this.transport.request({ ...call, headers: { ...(call.headers ?? {}), Accept: "application/x-ndjson" }, signal });
      for await (const line of lines(this.transport.read(res))) yield parse(JSON.parse(line));
    } finally {
      res?.destroy();
    }
  }

  async listTemplates(): Promise<Image[]> {
    return (await this.transport.json({ method: "GET", path: "/v1/templates" })).images;
  }

  /** Keeps `size` sandboxes of image (on runtime, default the daemon's) warm,
   * so that a create of it is a hand-over; size 0 removes the pool. */
  setPool(image: string, size: number, opts: { runtime?: string } = {}): Promise<Pool> {
    return this.transport.json({ method: "PUT", path: "/v1/pools", json: dropUndefined({ image, size, runtime: opts.runtime }) });
  }

  async pools(): Promise<Pool[]> {
    return (await this.transport.json({ method: "GET", path: "/v1/pools" })).pools;
  }

  // API keys (an admin key's calls) and the audit log

  /** Makes an API key (an admin key's call): scope read, write (the
   * daemon's default) or admin; read and write keys act for one tenant (a
   * DNS label) and see only its objects, admin keys for the operator. The
   * answer's key is the secret, shown this once; the key stops working at
   * expiresAt, when set. */
  async createApiKey(opts: CreateAPIKeyOptions = {}): Promise<APIKey> {
    let expires: string | undefined;
    if (opts.expiresAt instanceof Date) {
      if (Number.isNaN(opts.expiresAt.getTime())) throw new InvalidArgument("expiresAt: an invalid Date");
      expires = opts.expiresAt.toISOString();
    } else {
      expires = opts.expiresAt;
    }
    const body = dropUndefined({ tenant: opts.tenant, scope: opts.scope, name: opts.name, expires_at: expires });
    return apiKey(await this.transport.json({ method: "POST", path: "/v1/keys", json: body }));
  }

  /** Every key, revoked and expired ones too, oldest first, never with its secret. */
  async listApiKeys(): Promise<APIKey[]> {
    return ((await this.transport.json({ method: "GET", path: "/v1/keys" })).keys as Json[]).map(apiKey);
  }

  /** Stops a key (by id, or an APIKey) from working, at once; it stays listed. */
  async revokeApiKey(key: string | APIKey): Promise<APIKey> {
    const id = typeof key === "string" ? key : key?.id;
    if (typeof id !== "string" || !id) {
      throw new InvalidArgument(`key: ${JSON.stringify(id ?? null)} is not a key id (an APIKey's id, not its secret)`);
    }
    return apiKey(await this.transport.json({ method: "DELETE", path: "/v1/keys/" + encodeURIComponent(id) }));
  }

  /** The audit log of mutating calls, oldest first: the key's tenant's, or
   * for the operator every tenant's (or opts.tenant's); opts.sandbox for one
   * sandbox's calls, opts.after a seq for newer ones only, opts.limit the
   * newest that many (default 1000). */
  async audit(opts: AuditQuery = {}): Promise<AuditRecord[]> {
    const query = {
      tenant: opts.tenant || undefined,
      sandbox: opts.sandbox || undefined,
      after: opts.after || undefined,
      limit: opts.limit || undefined,
    };
    return (await this.transport.json({ method: "GET", path: "/v1/audit", query })).records;
  }

  // Quotas (an admin key's call) and usage

  /** Sets a tenant's quota (an admin key's call), replacing the one it had:
   * an absent or zero bound is none, so an empty quota removes it. A
   * create, start or fork that would pass a bound is ResourceExhausted
   * naming it; a quota below the current use stops nothing that runs.
   * Resolves to the tenant's usage with its new quota. */
  async setQuota(tenant: string, quota: Quota = {}): Promise<TenantUsage> {
    const body = quotaBody(quota);
    const path = "/v1/tenants/" + encodeURIComponent(tenantName(tenant)) + "/quota";
    return tenantUsage(await this.transport.json({ method: "PUT", path, json: body }));
  }

  /** What tenants use now and have used: the key's own tenant's (one
   * entry); for the operator every tenant's, or opts.tenant's. */
  async usage(opts: UsageQuery = {}): Promise<TenantUsage[]> {
    const query = { tenant: opts.tenant === undefined ? undefined : tenantName(opts.tenant) };
    return ((await this.transport.json({ method: "GET", path: "/v1/usage", query })).tenants as Json[]).map(tenantUsage);
  }
}

/** What createApiKey makes. */
export interface CreateAPIKeyOptions {
  /** Required for read and write keys, refused for admin keys. */
  tenant?: string;
  /** Default write. */
  scope?: Scope;
  /** A note for people (at most 200 bytes). */
  name?: string;
  /** When the key stops working: a Date or an RFC 3339 time, in the future. */
  expiresAt?: Date | string;
}

/** Which audit records to read. */
export interface AuditQuery {
  /** One tenant's calls (the operator's filter). */
  tenant?: string;
  /** One sandbox's calls. */
  sandbox?: string;
  /** Records with a larger seq only. */
  after?: number;
  /** The most records, the newest (default 1000). */
  limit?: number;
}

/** Which tenants' usage to read. */
export interface UsageQuery {
  /** One tenant's usage (the operator's filter; a tenant's key reads its own whatever it names). */
  tenant?: string;
}

function tenantName(tenant: string): string {
  if (typeof tenant !== "string" || !tenant) {
    throw new InvalidArgument(`tenant: ${JSON.stringify(tenant ?? null)} is not a tenant's name (a DNS label)`);
  }
  return tenant;
}

const QUOTA_FIELDS = ["sandboxes", "cpus", "memory_bytes", "disk_bytes", "snapshot_bytes"] as const;

/** A quota's body, each bound checked here (a whole number, or for cpus
 * any number, not below 0; no other field); zero bounds are left out, as none. */
function quotaBody(quota: Quota): Quota {
  if (typeof quota !== "object" || quota === null || Array.isArray(quota)) {
    throw new InvalidArgument(`quota: ${JSON.stringify(quota ?? null)} is not an object of bounds`);
  }
  const body: Json = {};
  for (const [name, v] of Object.entries(quota)) {
    if (!(QUOTA_FIELDS as readonly string[]).includes(name)) {
      throw new InvalidArgument(`${name}: not a bound of a quota (${QUOTA_FIELDS.join(", ")})`);
    }
    if (v === undefined) continue;
    const ok = typeof v === "number" && v >= 0 && (name === "cpus" ? Number.isFinite(v) : Number.isSafeInteger(v));
    if (!ok) {
      const what = name === "cpus" ? "a number of CPUs" : "a whole number";
      throw new InvalidArgument(`${name}: ${typeof v === "string" ? JSON.stringify(v) : String(v)} is not ${what} of 0 (no bound) or more`);
    }
    if (v) body[name] = v;
  }
  return body as Quota;
}

/** A tenant's usage from JSON, its absent (zero) fields as 0. */
function tenantUsage(d: Json): TenantUsage {
  const n = (v: unknown) => (typeof v === "number" ? v : 0);
  const q: Json = d.quota ?? {};
  return {
    tenant: typeof d.tenant === "string" ? d.tenant : "",
    quota: Object.fromEntries(QUOTA_FIELDS.map((f) => [f, n(q[f])])) as Quota,
    sandboxes: n(d.sandboxes),
    cpus: n(d.cpus),
    memory_bytes: n(d.memory_bytes),
    disk_bytes: n(d.disk_bytes),
    snapshot_bytes: n(d.snapshot_bytes),
    sandbox_seconds: n(d.sandbox_seconds),
    cpu_seconds: n(d.cpu_seconds),
    memory_gb_seconds: n(d.memory_gb_seconds),
    egress_bytes_out: n(d.egress_bytes_out),
    egress_bytes_in: n(d.egress_bytes_in),
  };
}

/** An API key from JSON, its secret (when there is one) not enumerable. */
function apiKey(d: Json): APIKey {
  const { key, ...rest } = d;
  const k = rest as APIKey;
  if (typeof key === "string" && key) {
    Object.defineProperty(k, "key", { value: key, enumerable: false, writable: false, configurable: false });
  }
  return k;
}

function pullEvent(d: Json): PullEvent {
  return { ...d, status: String(d.status ?? ""), error: d.error && typeof d.error === "object" ? errorFromApi(d.error as ApiError) : undefined } as PullEvent;
}

function encodeImageRef(ref: string): string {
  // As Python's quote(ref, safe="/:@").
  return encodeURIComponent(ref).replace(/%2F/gi, "/").replace(/%3A/gi, ":").replace(/%40/gi, "@");
}

/** fnmatch-style pattern (*, ?, [...]) to a RegExp matching a whole string. */
function fnmatch(pattern: string): RegExp {
  let re = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "*") re += ".*";
    else if (c === "?") re += ".";
    else if (c === "[") {
      const end = pattern.indexOf("]", i + 1);
      if (end < 0) re += "\\[";
      else {
        let cls = pattern.slice(i + 1, end).replace(/\\/g, "\\\\");
        if (cls.startsWith("!")) cls = "^" + cls.slice(1);
        re += "[" + cls + "]";
        i = end;
      }
    } else re += c.replace(/[.+^${}()|\\]/g, "\\$&");
  }
  return new RegExp("^" + re + "$", "s");
}

/** A build context directory as a tar: its files, directories and symlinks
 * (never followed), less what its .dockerignore leaves out (fnmatch
 * patterns, "!" exceptions; the Dockerfile always goes). */
async function contextTar(root: string, dockerfile: string): Promise<Uint8Array> {
  const patterns: Array<{ keep: boolean; re: RegExp }> = [];
  try {
    for (let line of (await readFile(join(root, ".dockerignore"), "utf8")).split("\n")) {
      line = line.trim();
      if (!line || line.startsWith("#")) continue;
      const keep = line.startsWith("!");
      const pat = line.replace(/^!/, "").replace(/^\/+/, "").replace(/\/+$/, "");
      patterns.push({ keep, re: fnmatch(pat) });
    }
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
  const ignored = (rel: string): boolean => {
    if (rel === dockerfile) return false;
    const parts = rel.split("/");
    let out = false;
    for (const { keep, re } of patterns) {
      for (let i = 0; i < parts.length; i++) {
        if (re.test(parts.slice(0, i + 1).join("/"))) {
          out = !keep;
          break;
        }
      }
    }
    return out;
  };
  const entries: TarEntry[] = [];
  const walk = async (dir: string): Promise<void> => {
    const names = (await readdir(dir)).sort();
    for (const name of names) {
      const full = join(dir, name);
      const rel = relative(root, full).split(sep).join("/");
      if (ignored(rel)) continue;
      const st = await lstat(full);
      const mode = st.mode & 0o7777;
      if (st.isDirectory()) {
        entries.push({ name: rel, type: "dir", mode });
        await walk(full);
      } else if (st.isSymbolicLink()) {
        entries.push({ name: rel, type: "symlink", mode, target: await readlink(full) });
      } else if (st.isFile()) {
        entries.push({ name: rel, type: "file", mode, data: await readFile(full) });
      }
    }
  };
  await walk(root);
  return tarOf(entries);
}

