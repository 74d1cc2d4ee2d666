// Result types of the berth SDK: the daemon's JSON (api/types.go,
// api/files.go) in camelCase, output as bytes and as text.

import { type ApiError, type BerthError, errorFromApi } from "./errors.js";

type Json = Record<string, any>;

const utf8 = new TextDecoder("utf-8");

/** Base64 to bytes (empty for anything else). */
export function b64decode(v: unknown): Uint8Array {
  if (typeof v !== "string" || v === "") return new Uint8Array(0);
  const b = Buffer.from(v, "base64");
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

/** Bytes as UTF-8 text, invalid sequences replaced. */
export function decodeText(b: Uint8Array): string {
  return utf8.decode(b);
}

/** How a command ended, with its output. */
export class ExecResult {
  /** The exit status, or 128+signal when a signal ended the process. */
  readonly exitCode: number;
  /** Standard output and error as bytes, and decoded as UTF-8 (invalid bytes replaced). */
  readonly stdoutBytes: Uint8Array;
  readonly stderrBytes: Uint8Array;
  readonly stdout: string;
  readonly stderr: string;
  /** The number of the signal that ended the process, or 0. */
  readonly signal: number;
  readonly oomKilled: boolean;
  readonly timedOut: boolean;
  readonly stdoutTruncated: boolean;
  readonly stderrTruncated: boolean;
  readonly durationMs: number;
  readonly pid: number;
  /** Why an exec could not start (exit code 126 or 127), else "". */
  readonly error: string;

  constructor(f: {
    exitCode: number;
    stdoutBytes?: Uint8Array;
    stderrBytes?: Uint8Array;
    signal?: number;
    oomKilled?: boolean;
    timedOut?: boolean;
    stdoutTruncated?: boolean;
    stderrTruncated?: boolean;
    durationMs?: number;
    pid?: number;
    error?: string;
  }) {
    this.exitCode = f.exitCode;
    this.stdoutBytes = f.stdoutBytes ?? new Uint8Array(0);
    this.stderrBytes = f.stderrBytes ?? new Uint8Array(0);
    this.stdout = decodeText(this.stdoutBytes);
    this.stderr = decodeText(this.stderrBytes);
    this.signal = f.signal ?? 0;
    this.oomKilled = f.oomKilled ?? false;
    this.timedOut = f.timedOut ?? false;
    this.stdoutTruncated = f.stdoutTruncated ?? false;
    this.stderrTruncated = f.stderrTruncated ?? false;
    this.durationMs = f.durationMs ?? 0;
    this.pid = f.pid ?? 0;
    this.error = f.error ?? "";
  }

  /** Whether the command exited 0. */
  get ok(): boolean {
    return this.exitCode === 0;
  }

  /** The same result with other output (a terminal's wait collects its own). */
  withOutput(stdoutBytes: Uint8Array, stderrBytes: Uint8Array): ExecResult {
    return new ExecResult({ ...this, stdoutBytes, stderrBytes });
  }

  static fromJSON(d: Json): ExecResult {
    return new ExecResult({
      exitCode: Number(d.exit_code ?? 0),
      stdoutBytes: b64decode(d.stdout),
      stderrBytes: b64decode(d.stderr),
      signal: Number(d.signal ?? 0),
      oomKilled: Boolean(d.oom_killed),
      timedOut: Boolean(d.timed_out),
      stdoutTruncated: Boolean(d.stdout_truncated),
      stderrTruncated: Boolean(d.stderr_truncated),
      durationMs: Number(d.duration_ms ?? 0),
      pid: Number(d.pid ?? 0),
      error: String(d.error ?? ""),
    });
  }
}

/** One event of a streamed exec: `start` (with pid), `stdout` and `stderr`
 * (with data), then exactly one `exit` (with result) or `error` (with error). */
export interface ExecEvent {
  type: "start" | "stdout" | "stderr" | "exit" | "error" | (string & {});
  data: Uint8Array;
  pid: number;
  result?: ExecResult;
  /** The error of an error event, as the class its error object names. */
  error?: BerthError;
}

export function execEventFromJSON(d: Json): ExecEvent {
  const ev: ExecEvent = { type: String(d.type ?? ""), data: b64decode(d.data), pid: Number(d.pid ?? 0) };
  if (d.result && typeof d.result === "object") ev.result = ExecResult.fromJSON(d.result);
  if (d.error && typeof d.error === "object") ev.error = errorFromApi(d.error as ApiError);
  return ev;
}

/** A terminal's size in characters. */
export interface TTY {
  rows: number;
  cols: number;
}

function ttyFromJSON(d: unknown): TTY | undefined {
  if (!d || typeof d !== "object") return undefined;
  const t = d as Json;
  return { rows: Number(t.rows), cols: Number(t.cols) };
}

/** A background process as the daemon describes it. */
export interface Process {
  pid: number;
  cmd: string[];
  running: boolean;
  startedAt: string;
  /** How it ended, once it has (waitProcess gives its kept output). */
  result?: ExecResult;
  /** The terminal's size, for a process on one. */
  tty?: TTY;
  /** Its input is open for more (writeStdin, an attachment). */
  openStdin: boolean;
  raw: Json;
}

export function processFromJSON(d: Json): Process {
  return {
    pid: Number(d.pid),
    cmd: Array.isArray(d.cmd) ? d.cmd.map(String) : [],
    running: Boolean(d.running),
    startedAt: String(d.started_at ?? ""),
    result: d.result && typeof d.result === "object" ? ExecResult.fromJSON(d.result) : undefined,
    tty: ttyFromJSON(d.tty),
    openStdin: Boolean(d.open_stdin),
    raw: d,
  };
}

/** A sandbox as the daemon describes it; `raw` is the whole JSON object. */
export interface SandboxInfo {
  id: string;
  state: string;
  image: string;
  runtime: string;
  labels: Record<string, string>;
  /** Ports inside served without the access token, sorted. */
  publicPorts: number[];
  /** Opens the sandbox's private ports (see Sandbox.url). */
  accessToken: string;
  createdAt: string;
  /** Why a sandbox is in the error state, or why berth stopped it. */
  error: string;
  raw: Json;
}

export function sandboxInfoFromJSON(d: Json): SandboxInfo {
  return {
    id: String(d.id),
    state: String(d.state ?? ""),
    image: String(d.image ?? ""),
    runtime: String(d.runtime ?? ""),
    labels: { ...(d.labels ?? {}) },
    publicPorts: Array.isArray(d.public_ports) ? d.public_ports.map(Number) : [],
    accessToken: String(d.access_token ?? ""),
    createdAt: String(d.created_at ?? ""),
    error: String(d.error ?? ""),
    raw: d,
  };
}

/** A TCP socket listening inside a sandbox. */
export interface Port {
  port: number;
  address: string;
  proto: string;
  public: boolean;
}

export function portFromJSON(d: Json): Port {
  return { port: Number(d.port), address: String(d.address ?? ""), proto: String(d.proto ?? "tcp"), public: Boolean(d.public) };
}

/** Begins an image reference that names a snapshot: `create({ image: "snapshot:NAME" })`. */
export const SNAPSHOT_PREFIX = "snapshot:";

/** A sandbox's files at one instant, usable as an image (`ref`). */
export class Snapshot {
  id = "";
  name = "";
  /** The sandbox it was taken of (which may be gone since). */
  sandbox = "";
  /** The image that sandbox was made from; baseImageId the stored image under its layers. */
  image = "";
  baseImageId = "";
  /** The snapshot that sandbox was made from, if any. */
  parent = "";
  /** What the snapshot's own layer holds: what the sandbox changed. */
  sizeBytes = 0;
  labels: Record<string, string> = {};
  /** How long the sandbox's processes were frozen for the capture. */
  frozenMs = 0;
  createdAt = "";
  /** The sandboxes made from it (getSnapshot only). */
  inUse: string[] = [];
  raw: Json = {};

  /** The image reference that names it: `snapshot:NAME` (its id when unnamed). */
  get ref(): string {
    return SNAPSHOT_PREFIX + (this.name || this.id);
  }

  static fromJSON(d: Json): Snapshot {
    const s = new Snapshot();
    s.id = String(d.id);
    s.name = String(d.name ?? "");
    s.sandbox = String(d.sandbox ?? "");
    s.image = String(d.image ?? "");
    s.baseImageId = String(d.base_image_id ?? "");
    s.parent = String(d.parent ?? "");
    s.sizeBytes = Number(d.size_bytes ?? 0);
    s.labels = { ...(d.labels ?? {}) };
    s.frozenMs = Number(d.frozen_ms ?? 0);
    s.createdAt = String(d.created_at ?? "");
    s.inUse = Array.isArray(d.in_use) ? d.in_use.map(String) : [];
    s.raw = d;
    return s;
  }
}

/** One path a sandbox changed: kind is added, modified or deleted; type the
 * entry's (the old one's when deleted): file, dir, symlink, … */
export interface Change {
  path: string;
  kind: string;
  type: string;
  mode: number;
  size: number;
  uid: number;
  gid: number;
  /** A symlink's target. */
  link: string;
}

function changesFromJSON(v: unknown): Change[] {
  if (!Array.isArray(v)) return [];
  return v.map((c: Json) => ({
    path: String(c.path),
    kind: String(c.kind ?? ""),
    type: String(c.type ?? ""),
    mode: Number(c.mode ?? 0),
    size: Number(c.size ?? 0),
    uid: Number(c.uid ?? 0),
    gid: Number(c.gid ?? 0),
    link: String(c.link ?? ""),
  }));
}

/** What a sandbox changed over `against`: its image, or `snapshot:NAME`. */
export class Diff {
  constructor(
    readonly against: string,
    readonly changes: Change[],
  ) {}

  /** The changed paths, or those of one kind (added, modified, deleted). */
  paths(kind?: string): string[] {
    return this.changes.filter((c) => kind === undefined || c.kind === kind).map((c) => c.path);
  }

  static fromJSON(d: Json): Diff {
    return new Diff(String(d.against ?? ""), changesFromJSON(d.changes));
  }
}

/** What an apply changed: the changes applied (none listed for a tar), the
 * paths both sides changed (theirs won, with overwrite), and the entries
 * written, deletions made and bytes written. */
export interface ApplyResult {
  changes: Change[];
  conflicts: string[];
  entries: number;
  whiteouts: number;
  bytes: number;
}

export function applyResultFromJSON(d: Json): ApplyResult {
  return {
    changes: changesFromJSON(d.changes),
    conflicts: Array.isArray(d.conflicts) ? d.conflicts.map(String) : [],
    entries: Number(d.entries ?? 0),
    whiteouts: Number(d.whiteouts ?? 0),
    bytes: Number(d.bytes ?? 0),
  };
}

// File tools: the daemon's JSON as it is (snake_case fields), as in the Python SDK.

/** A file as stat, ls and glob describe it. */
export interface FileInfo {
  path: string;
  name: string;
  /** file, dir, symlink, fifo, socket, char_device, block_device */
  type: string;
  size: number;
  /** Permission bits with setuid, setgid and sticky. */
  mode: number;
  uid: number;
  gid: number;
  owner?: string;
  group?: string;
  modified_at: string;
  /** A symlink's target. */
  target?: string;
}

export interface Line {
  number: number;
  text: string;
  truncated?: boolean;
}

/** A page of a text file: numbered lines, total lines, the next page's offset. */
export interface ReadResult {
  path: string;
  size: number;
  binary?: boolean;
  lines: Line[];
  total_lines: number;
  next_offset: number;
}

export interface GrepMatch {
  path: string;
  line: number;
  text: string;
}

export interface GrepResult {
  matches: GrepMatch[];
  truncated?: boolean;
  files_searched: number;
}

export interface GlobResult {
  matches: FileInfo[];
  truncated?: boolean;
}

export interface ListResult {
  entries: FileInfo[];
  truncated?: boolean;
}

/** A file's per-path error in a batch (uploadFiles, downloadFiles). */
export interface FileError {
  class: string;
  reason?: string;
  message: string;
}

/** One path's outcome in a batch; `error` is absent on success, `content`
 * (downloadFiles) present. */
export interface FileResult {
  path: string;
  content?: Uint8Array;
  error?: FileError;
}

// The daemon-wide objects, as the daemon's JSON (snake_case) is.

/** An egress record: a connection, request or DNS query of a sandbox. */
export interface EgressRecord {
  seq: number;
  time: string;
  /** tcp, udp, http, https, dns */
  proto: string;
  /** The name asked for (a DNS query's, a request's Host, a TLS SNI). */
  name?: string;
  addr?: string;
  port?: number;
  method?: string;
  path?: string;
  status?: number;
  bytes_out: number;
  bytes_in: number;
  duration_ms: number;
  allowed: boolean;
  /** The rule that allowed or refused it. */
  rule: string;
  /** The secret injected into it, by name. */
  secret?: string;
  error?: string;
  [field: string]: unknown;
}

/** A stored secret, without its value (no call returns one). */
export interface Secret {
  name: string;
  created_at: string;
  updated_at: string;
}

export interface ImageConfig {
  env?: string[];
  working_dir?: string;
  user?: string;
  entrypoint?: string[];
  cmd?: string[];
  labels?: Record<string, string>;
  exposed_ports?: string[];
  architecture?: string;
  os?: string;
}

/** A stored image (pulled, imported, or a template). */
export interface Image {
  id: string;
  names?: string[];
  size: number;
  layers: string[];
  source: string;
  created_at: string;
  config: ImageConfig;
  /** The sandboxes made from it (inspect). */
  in_use?: string[];
  template?: boolean;
  notes?: string[];
  [field: string]: unknown;
}

/** One line of an image pull's or import's progress: resolved, downloading
 * (current of total bytes), exists, unpacked, then done (with image) or
 * error (with error, as the class it names). */
export interface PullEvent {
  status: "resolved" | "downloading" | "exists" | "unpacked" | "done" | "error" | (string & {});
  layer?: string;
  current?: number;
  total?: number;
  image?: Image;
  error?: BerthError;
}

/** One line of a template build's log: step (or a cached one), stdout and
 * stderr of a RUN step, then done (with image, executed, cached_steps) or
 * error. data is the output's bytes. */
export interface BuildEvent {
  type: "step" | "stdout" | "stderr" | "done" | "error" | (string & {});
  step?: number;
  steps?: number;
  instruction?: string;
  line?: number;
  cached?: boolean;
  data: Uint8Array;
  image?: Image;
  executed?: number;
  cached_steps?: number;
  error?: BerthError;
}

/** The answer of a template build. */
export interface BuildResult {
  image: Image;
  executed: number;
  cached_steps: number;
  /** The build's output, base64 as the daemon sends it. */
  log?: string;
}

/** A warm pool: sandboxes of one image booted ahead of time. */
export interface Pool {
  image: string;
  runtime?: string;
  size: number;
  ready: number;
}

/** An isolation tier of the daemon, and what it can do on this host. */
export interface RuntimeInfo {
  name: string;
  default: boolean;
  available: boolean;
  /** Why it cannot run here. */
  reason?: string;
  capabilities?: {
    limits: string[];
    max: { cpus?: number; memory_bytes?: number; pids?: number; disk_bytes?: number; open_files?: number };
    network_modes: string[];
    stop_start: boolean;
    update_limits: boolean;
    grow_disk: boolean;
    stats: boolean;
    idmapped_layers: boolean;
    pause: boolean;
    snapshot: boolean;
    memory_checkpoint: boolean;
    missing?: Record<string, string>;
  };
}

/** What a sandbox uses now (Sandbox.stats). */
export interface Usage {
  cpu_seconds: number;
  memory_bytes: number;
  memory_peak_bytes: number;
  pids: number;
  oom_kills: number;
  disk_bytes: number;
  egress?: { allowed: number; denied: number; bytes_out: number; bytes_in: number };
}

/** The daemon's version (Berth.version). */
export interface VersionInfo {
  version: string;
  api: string;
  runtimes: string[];
  ports_domain?: string;
}

/** One event of a sandbox's events stream (Sandbox.events). */
export interface SandboxEvent {
  type: string;
  sandbox: string;
  time: string;
  /** The process of process events. */
  pid?: number;
  /** Why berth stopped a sandbox (a timeout, an init that died). */
  reason?: string;
  /** How a process ended (without its output), as the daemon's JSON. */
  result?: Json;
  /** The limit of a limit_hit event (pids, cpu, disk) and how often it was hit. */
  limit?: string;
  count?: number;
  /** The refused attempt of an egress_denied event. */
  egress?: Json;
}

/** One change of a watch stream (Sandbox.watch). */
export interface WatchEvent {
  type: string;
  path: string;
  isDir: boolean;
  time: string;
}

/** An API key's scope, each allowing what the one before it does: read
 * (GETs and the file operations that only read), write (everything to its
 * tenant's objects), admin (the operator's: every tenant, the keys). */
export type Scope = "read" | "write" | "admin";

/** An API key as the daemon shows it. */
export interface APIKey {
  id: string;
  /** The tenant that owns what the key creates and is all it sees; absent
   * for an admin key, which acts for the operator. */
  tenant?: string;
  scope: Scope | (string & {});
  name?: string;
  created_at: string;
  expires_at?: string;
  revoked_at?: string;
  /** The secret, to send as `new Berth({ apiKey })`: only in the answer to
   * createApiKey (it is stored hashed). Not enumerable, so that
   * JSON.stringify and util.inspect of the key never show it. */
  key?: string;
}

/** One mutating API call in the audit log. */
export interface AuditRecord {
  seq: number;
  at: string;
  tenant?: string;
  key_id?: string;
  method: string;
  /** The route's pattern: /v1/sandboxes/{id}. */
  route: string;
  path: string;
  sandbox_id?: string;
  status: number;
  /** The error's class (permission_denied, …), absent for a success. */
  error?: string;
  request_id: string;
}

/** What one tenant may hold (Berth.setQuota); an absent or zero field is no
 * bound. A create (or start, or fork) that would pass a bound is
 * ResourceExhausted naming it and the current use; a quota below the
 * current use stops nothing that runs, it only refuses what would add more. */
export interface Quota {
  /** The most sandboxes running (or paused) at once. */
  sandboxes?: number;
  /** The most limits.cpus summed over running sandboxes; a sandbox without
   * a CPU limit is refused while it is set. */
  cpus?: number;
  /** The most limits.memory_bytes summed over running sandboxes; a sandbox
   * without a memory limit is refused while it is set. */
  memory_bytes?: number;
  /** The most limits.disk_bytes summed over all the tenant's sandboxes,
   * stopped ones too; a sandbox without a disk limit is refused while it is set. */
  disk_bytes?: number;
  /** The most bytes of snapshots stored. */
  snapshot_bytes?: number;
}

/** What one tenant uses now, as its quota counts it, and the counters a
 * team bills on (Berth.usage, Berth.setQuota). */
export interface TenantUsage {
  /** The tenant's name; "" for the operator's own sandboxes. */
  tenant: string;
  quota: Quota;
  sandboxes: number;
  cpus: number;
  memory_bytes: number;
  disk_bytes: number;
  snapshot_bytes: number;
  /** Counters since the tenant's first sandbox, sampled every few seconds
   * while sandboxes run. */
  sandbox_seconds: number;
  cpu_seconds: number;
  memory_gb_seconds: number;
  egress_bytes_out: number;
  egress_bytes_in: number;
}
