// A deepagents (the npm package `deepagents`) sandbox backend served by berth.
//
//   import { createDeepAgent } from "deepagents";
//   import { BerthSandbox } from "@berthsh/berth/deepagents";
//
//   const backend = await BerthSandbox.create({ allow: ["pypi.org", "*.pythonhosted.org"] });
//   const agent = createDeepAgent({ model, backend });
//
// `execute` runs a command with /bin/sh -c in the sandbox; `ls`, `read`,
// `write`, `edit`, `glob`, `grep` and `delete` are one berth call each,
// served by the sandbox's guest agent (deepagents' BaseSandbox would pipe
// shell scripts through execute instead); `uploadFiles` and `downloadFiles`
// are berth's batch transfers. Results and error texts follow deepagents'
// own backends (StateBackend, FilesystemBackend, BaseSandbox): see
// docs/deepagents-js.md for where they differ and why.
//
// The types below are deepagents' protocol (SandboxBackendProtocolV2),
// declared here structurally so that this module neither loads deepagents
// nor needs its type declarations to compile: a BerthSandbox is accepted
// wherever deepagents takes a backend, and test/deepagents-types.ts checks
// that against deepagents' own declarations.

import { Berth, type CreateOptions, type Sandbox } from "./client.js";
import { BerthError, Conflict, DaemonUnreachable, InvalidArgument, NotFound, TooLarge, Unauthenticated, Unavailable, errorFromApi } from "./errors.js";
import type { FileError, FileResult } from "./types.js";

// deepagents' protocol types (deepagents 1.14: backends/protocol.ts).

/** One entry of ls and glob. Directories end with "/" in ls. */
export interface FileInfo {
  path: string;
  is_dir?: boolean;
  size?: number;
  modified_at?: string;
}
export interface GrepMatch {
  path: string;
  line: number;
  text: string;
}
export interface GrepResult {
  error?: string;
  matches?: GrepMatch[];
  truncated?: boolean;
}
export interface ReadResult {
  error?: string;
  content?: string | Uint8Array;
  mimeType?: string;
  totalLines?: number;
  startLine?: number;
  endLine?: number;
  nextOffset?: number;
}
export interface FileDataV2 {
  content: string | Uint8Array;
  mimeType: string;
  created_at: string;
  modified_at: string;
}
export interface ReadRawResult {
  error?: string;
  data?: FileDataV2;
}
export interface LsResult {
  error?: string;
  files?: FileInfo[];
}
export interface GlobResult {
  error?: string;
  files?: FileInfo[];
  truncated?: boolean;
}
export interface WriteResult {
  error?: string;
  path?: string;
  filesUpdate?: null;
  metadata?: Record<string, unknown>;
}
export interface EditResult {
  error?: string;
  path?: string;
  filesUpdate?: null;
  occurrences?: number;
  metadata?: Record<string, unknown>;
}
export interface DeleteResult {
  error?: string;
  path?: string;
  filesUpdate?: null;
  metadata?: Record<string, unknown>;
}
export interface ExecuteResponse {
  /** stdout, then stderr. */
  output: string;
  /** null when the command did not run (the error is in output). */
  exitCode: number | null;
  truncated: boolean;
}
/** deepagents' per-file error codes. Another berth failure of one file (a
 * full disk: no_space, …) is reported as its berth reason or class, and a
 * sandbox that cannot be used as the sentence that says why. */
export type FileOperationError = "file_not_found" | "permission_denied" | "is_directory" | "invalid_path";
export interface FileUploadResponse {
  path: string;
  error: FileOperationError | null;
}
export interface FileDownloadResponse {
  path: string;
  content: Uint8Array | null;
  error: FileOperationError | null;
}

/** Milliseconds an `execute` may run when the caller gives no timeout. */
export const DEFAULT_TIMEOUT_MS = 30 * 60 * 1000;

/** Where deepagents itself writes: offloaded tool results and the
 * conversation history of summarization. */
export const DEEPAGENTS_DIRS: readonly string[] = ["/large_tool_results", "/conversation_history"];

export interface BerthSandboxOptions {
  /** The berth sandbox behind the backend. */
  sandbox: Sandbox;
  /** Default bound of an `execute`, in milliseconds (default 30 minutes). */
  timeoutMs?: number;
  /** Bounds each of stdout and stderr of an `execute` (default the daemon's, 4 MiB). */
  maxOutputBytes?: number;
  /** Start the sandbox again when a call finds it stopped (an idle timeout
   * stops a sandbox), or resume it when it finds it paused, then make the
   * call (default true). */
  autoStart?: boolean;
  /** Directories at the root that deepagents writes to, made (as root, owned
   * by the sandbox's user) the first time a write there is refused:
   * berth's default user cannot make directories at /. Default DEEPAGENTS_DIRS. */
  ownDirs?: readonly string[];
  /** Where the operator's detail of an error about the sandbox goes (the
   * daemon's message, with the sandbox id and the route), which the model
   * is not shown, and a note when a stopped sandbox is started again.
   * Default console; null for nowhere. */
  logger?: BerthSandboxLogger | null;
}

/** The part of console a BerthSandbox writes to. */
export interface BerthSandboxLogger {
  warn(message: string, error?: unknown): void;
  info?(message: string): void;
}

export interface BerthSandboxCreateOptions extends CreateOptions, Omit<BerthSandboxOptions, "sandbox"> {
  /** The client (default `new Berth()`: $BERTH_URL, else http://127.0.0.1:7680). */
  client?: Berth;
  /** Files the sandbox starts with: absolute path to content (text as
   * UTF-8, or bytes), parents made, as deepagents' other sandbox providers
   * take them. */
  initialFiles?: Record<string, string | Uint8Array>;
}

// The limits and texts of deepagents' tools and backends, kept identical.
const EMPTY_CONTENT_WARNING = "System reminder: File exists but has empty contents";
const MAX_BINARY_READ_BYTES = 10 * 1024 * 1024;
// readRaw's bound on a whole file, text or binary: the sandbox decides how
// large its files are, and the file is held in memory.
const MAX_RAW_READ_BYTES = MAX_BINARY_READ_BYTES;

// A file over the bound of a read, in the words of deepagents' read_file tool.
function tooLargeToRead(path: string, binary: boolean): string {
  const mb = MAX_RAW_READ_BYTES / (1024 * 1024);
  return `File '${path}' is too large to read (exceeds ${mb}MB limit${binary ? " for binary files" : ": read a text file in pages with read, or inspect it with execute"})`;
}
// Longer lines are cut (the read_file tool shows at most 80,000 characters).
const MAX_LINE_CHARS = 1 << 20;
const GLOB_LIMIT = 50_000;
const GREP_LIMIT = 100_000;

const MIME_TYPES: Record<string, string> = {
  ".png": "image/png",
  ".jpg": "image/jpeg",
  ".jpeg": "image/jpeg",
  ".gif": "image/gif",
  ".webp": "image/webp",
  ".svg": "image/svg+xml",
  ".heic": "image/heic",
  ".heif": "image/heif",
  ".mp3": "audio/mpeg",
  ".wav": "audio/wav",
  ".aiff": "audio/aiff",
  ".aac": "audio/aac",
  ".ogg": "audio/ogg",
  ".flac": "audio/flac",
  ".mp4": "video/mp4",
  ".webm": "video/webm",
  ".mpeg": "video/mpeg",
  ".mpg": "video/mpeg",
  ".mov": "video/quicktime",
  ".avi": "video/x-msvideo",
  ".flv": "video/x-flv",
  ".wmv": "video/x-ms-wmv",
  ".3gpp": "video/3gpp",
  ".pdf": "application/pdf",
  ".ppt": "application/vnd.ms-powerpoint",
  ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
  ".md": "text/markdown",
  ".markdown": "text/markdown",
  ".html": "text/html",
  ".htm": "text/html",
  ".css": "text/css",
  ".csv": "text/csv",
  ".xml": "text/xml",
  ".json": "application/json",
  ".js": "application/javascript",
  ".mjs": "application/javascript",
  ".cjs": "application/javascript",
};

/** The MIME type deepagents gives a path (by its extension; text/plain by default). */
export function mimeTypeOf(path: string): string {
  const base = path.slice(path.lastIndexOf("/") + 1);
  const dot = base.lastIndexOf(".");
  if (dot <= 0) return "text/plain";
  return MIME_TYPES[base.slice(dot).toLowerCase()] ?? "text/plain";
}

/** Whether deepagents treats a MIME type as text (read in lines) or as bytes. */
export function isTextMimeType(mime: string): boolean {
  return mime.startsWith("text/") || mime === "application/json" || mime === "application/javascript" || mime === "image/svg+xml";
}

function shellQuote(s: string): string {
  return "'" + s.replace(/'/g, "'\\''") + "'";
}

// A long string the model gave, as an error message quotes it.
function quoted(s: string): string {
  return s.length > 200 ? `'${s.slice(0, 200)}…' (${s.length} characters)` : `'${s}'`;
}

/** Starting (or resuming) the sandbox failed; error says why. */
class StartFailed extends Error {
  constructor(
    readonly verb: "start" | "resume",
    readonly error: unknown,
  ) {
    super(`${verb} failed: ${error instanceof Error ? error.message : String(error)}`);
  }
}

/** The sandbox stopped while a call that must not be repeated ran; it was
 * brought back. error is the call's own. */
class Interrupted extends Error {
  constructor(readonly error: unknown) {
    super(`interrupted: ${error instanceof Error ? error.message : String(error)}`);
  }
}

/** What the model is told of an error about the sandbox itself rather than
 * the path or command it gave (the sentences of berth's Python backend), or
 * undefined for an error the model can act on. */
function forModel(e: unknown): string | undefined {
  if (e instanceof StartFailed) {
    return (
      forModel(e.error) ??
      `the sandbox was ${e.verb === "start" ? "stopped" : "paused"} and could not be ${e.verb === "start" ? "started" : "resumed"} again, so no tool can use it. Tell the user.`
    );
  }
  if (e instanceof Interrupted) {
    return "the sandbox stopped while this ran, so it may not have finished. It was started again: its files are kept, its processes are not. Check what was done, then try again if needed.";
  }
  if (!(e instanceof BerthError)) return undefined;
  if (e.reason === "sandbox_gone") {
    return "the sandbox was deleted: its files and programs are gone, and no tool can use it. Tell the user; a new sandbox is needed.";
  }
  if (e.reason === "sandbox_stopped") return "the sandbox is stopped, so no tool can use it until it is started again. Tell the user.";
  if (e.reason === "sandbox_paused") return "the sandbox is paused, so no tool can use it until it is resumed. Tell the user.";
  if (e instanceof Unauthenticated) return "the sandbox service refused this agent's credentials, so no tool can use it. Tell the user.";
  if (e instanceof Unavailable && (e instanceof DaemonUnreachable || !e.reason)) {
    return "the sandbox service is not answering right now. Try again in a moment; tell the user if it keeps failing.";
  }
  return undefined;
}

// A per-file berth error (a batch result's or a thrown one's) as deepagents' code.
function fileCode(err: FileError | BerthError): FileOperationError {
  const cls = err instanceof BerthError ? err.code : err.class;
  const reason = err.reason ?? "";
  if (reason === "is_directory" || reason === "not_regular_file") return "is_directory";
  if (reason === "invalid_path") return "invalid_path";
  if (reason === "not_directory" || cls === "not_found") return "file_not_found";
  if (cls === "permission_denied") return "permission_denied";
  // No deepagents code says this (no_space, …): the caller sees berth's.
  return (reason || cls || "error") as FileOperationError;
}

// Another error, as a tool's answer quotes it.
function detail(e: unknown): string {
  return e instanceof BerthError ? `${e.code}: ${e.message}` : String(e);
}

/** deepagents' SandboxBackendProtocolV2 over one berth sandbox. Methods
 * answer errors as results, in deepagents' words and codes. An error about
 * the sandbox itself (deleted, stopped with autoStart off, paused, the
 * daemon not answering, credentials refused) is answered with a sentence
 * that tells the model so; the daemon's own message, for an operator, goes
 * to the logger. Only uploadFiles and downloadFiles throw: another failure
 * of the whole batch, which no per-file code can say. */
export class BerthSandbox {
  readonly #sb: Sandbox;
  readonly #timeoutMs: number;
  readonly #maxOutputBytes: number | undefined;
  readonly #autoStart: boolean;
  readonly #ownDirs: readonly string[];
  readonly #logger: BerthSandboxLogger | null;
  #starting: Promise<void> | undefined;
  #dirsMade: Promise<void> | undefined;
  #closed = false;

  constructor(opts: BerthSandboxOptions) {
    if (!opts || !opts.sandbox) throw new TypeError("BerthSandbox: sandbox is required (a Sandbox from berth.create, get or getOrCreate)");
    const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
      throw new RangeError(`BerthSandbox: timeoutMs must be a positive number of milliseconds, got ${String(opts.timeoutMs)}`);
    }
    this.#sb = opts.sandbox;
    this.#timeoutMs = timeoutMs;
    this.#maxOutputBytes = opts.maxOutputBytes;
    this.#autoStart = opts.autoStart ?? true;
    this.#ownDirs = (opts.ownDirs ?? DEEPAGENTS_DIRS).map((d) => d.replace(/\/+$/, ""));
    this.#logger = opts.logger === undefined ? console : opts.logger;
  }

  /** A backend on a new sandbox, kept until deleted (`backend.sandbox.delete()`):
   * the options are Berth.create's (image, limits, labels, network, allow, …),
   * initialFiles, and the backend's own (timeoutMs, maxOutputBytes,
   * autoStart, ownDirs, logger). If an initial file cannot be written, the
   * sandbox is deleted and the error (naming the path) thrown. */
  static async create(opts: BerthSandboxCreateOptions = {}): Promise<BerthSandbox> {
    const { client, initialFiles, timeoutMs, maxOutputBytes, autoStart, ownDirs, logger, ...create } = opts;
    const files = Object.entries(initialFiles ?? {});
    for (const [path] of files) {
      if (!path.startsWith("/")) throw new InvalidArgument(`initialFiles: ${JSON.stringify(path)} is not an absolute path`);
    }
    const sandbox = await (client ?? new Berth()).create({ ephemeral: false, ...create });
    if (files.length) {
      try {
        const results = await sandbox.uploadFiles(files);
        const failed = results.find((r) => r.error);
        if (failed?.error) {
          throw errorFromApi({ ...failed.error, message: `initialFiles: ${failed.path}: ${failed.error.message}`, paths: [failed.path] });
        }
      } catch (e) {
        await sandbox.delete().catch(() => {});
        throw e;
      }
    }
    return new BerthSandbox({ sandbox, timeoutMs, maxOutputBytes, autoStart, ownDirs, logger });
  }

  /** The sandbox's id (deepagents' SandboxBackendProtocol.id). */
  get id(): string {
    return this.#sb.id;
  }

  /** The berth sandbox behind this backend. */
  get sandbox(): Sandbox {
    return this.#sb;
  }

  /** Whether the sandbox was running when berth last described it (create,
   * a start, `sandbox.refresh()`), as deepagents' other providers say it.
   * False once close() deleted it. */
  get isRunning(): boolean {
    return !this.#closed && this.#sb.info.state === "running";
  }

  /** Deletes the sandbox, as deepagents' other providers' close() do (one
   * already gone is no error). The backend answers nothing after it. */
  async close(): Promise<void> {
    this.#closed = true;
    try {
      await this.#sb.delete();
    } catch (e) {
      if (!(e instanceof NotFound)) throw e;
    }
  }

  /** `n` new backends, each over a running copy of this sandbox's files as
   * they are now (no processes), with this backend's options: for agents
   * that try several ways at once. `labels` go on every copy (or one set per
   * copy). The copies are kept until deleted (`backend.sandbox.delete()`);
   * `backend.sandbox.apply(winner.sandbox)` merges the one that worked back. */
  async fork(n = 1, opts: { labels?: Record<string, string> | Array<Record<string, string>> } = {}): Promise<BerthSandbox[]> {
    const copies = await this.#call(() => this.#sb.fork(n, { labels: opts.labels, ephemeral: false }), true);
    return copies.map(
      (sandbox) =>
        new BerthSandbox({
          sandbox,
          timeoutMs: this.#timeoutMs,
          maxOutputBytes: this.#maxOutputBytes,
          autoStart: this.#autoStart,
          ownDirs: this.#ownDirs,
          logger: this.#logger,
        }),
    );
  }

  // The model's sentence for an error about the sandbox itself, the
  // operator's detail logged; undefined for another error.
  #trouble(e: unknown): string | undefined {
    const text = forModel(e);
    if (text !== undefined) this.#logger?.warn(`berth sandbox ${this.#sb.id}: ${e instanceof Error ? e.message : String(e)}`, e);
    return text;
  }

  // Runs a call. One the daemon refused because the sandbox is stopped
  // (paused) starts (resumes) it, once for every call that waits on it, and
  // is made again. One that finds it between states (starting, stopping:
  // another client's start, an idle stop), or whose guest went away under
  // it, waits for the sandbox to settle, bringing it back if it stopped;
  // then it is made again, unless it may have run in part (`once`: execute,
  // edit, delete, fork), which answers Interrupted instead.
  async #call<T>(fn: () => Promise<T>, once = false): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      if (!this.#autoStart || !(e instanceof Conflict || (e instanceof Unavailable && !(e instanceof DaemonUnreachable)))) throw e;
      if (e.reason === "sandbox_stopped") await this.#bringBack("start");
      else if (e.reason === "sandbox_paused") await this.#bringBack("resume");
      else if (e.reason) throw e;
      else if (e instanceof Conflict && this.#starting) {
        // Another call is bringing the sandbox back. A Conflict without a
        // reason may be "was stopping while the call ran": a `once` call
        // may have run in part, so it is not made again.
        await this.#starting;
        if (once) throw new Interrupted(e);
      } else if (!(await this.#settled(e instanceof Unavailable))) throw e;
      else if (once) throw new Interrupted(e);
    }
    return fn();
  }

  #bringBack(verb: "start" | "resume"): Promise<void> {
    this.#starting ??= (verb === "start" ? this.#sb.start() : this.#sb.resume()).then(
      () => {
        this.#starting = undefined;
        this.#logger?.info?.(`berth sandbox ${this.#sb.id} was ${verb === "start" ? "stopped" : "paused"}; the deepagents backend brought it back`);
      },
      (err: unknown) => {
        this.#starting = undefined;
        // Another client brought it back meanwhile: the call is made again.
        if (err instanceof Conflict && !err.reason) return;
        throw new StartFailed(verb, err);
      },
    );
    return this.#starting;
  }

  // Waits (up to a minute) for a sandbox between states to settle; starts
  // (resumes) it if it settled stopped (paused). False if it is in no state
  // calls can follow, or (onlyIfBroughtBack) if it was running all along.
  async #settled(onlyIfBroughtBack = false): Promise<boolean> {
    const sleep = () => new Promise((r) => setTimeout(r, 100));
    let info = await this.#sb.refresh();
    // A guest that went away can leave its sandbox "running" for a moment
    // before the daemon stops it: give the daemon 3 seconds to notice.
    for (const until = Date.now() + 3_000; onlyIfBroughtBack && info.state === "running" && Date.now() < until; ) {
      await sleep();
      info = await this.#sb.refresh();
    }
    const deadline = Date.now() + 60_000;
    while ((info.state === "starting" || info.state === "stopping") && Date.now() < deadline) {
      await sleep();
      info = await this.#sb.refresh();
    }
    if (info.state === "stopped") await this.#bringBack("start");
    else if (info.state === "paused") await this.#bringBack("resume");
    else if (info.state !== "running" || onlyIfBroughtBack) return false;
    return true;
  }

  /** Runs `command` with /bin/sh -c as the sandbox's user. A timeout kills
   * the command's process group and answers exit code 124 with what it
   * printed and a note; a failure of the sandbox answers exitCode null and
   * a message that says what happened. */
  async execute(command: string, opts: { timeoutMs?: number } = {}): Promise<ExecuteResponse> {
    const timeoutMs = opts.timeoutMs ?? this.#timeoutMs;
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
      throw new RangeError(`BerthSandbox.execute: timeoutMs must be a positive number of milliseconds, got ${String(opts.timeoutMs)}`);
    }
    let r;
    try {
      r = await this.#call(() => this.#sb.exec(command, { timeoutMs, maxOutputBytes: this.#maxOutputBytes }), true);
    } catch (e) {
      const output = `Error executing command: ${this.#trouble(e) ?? detail(e)}`;
      return { output, exitCode: null, truncated: false };
    }
    let output = r.stdout + r.stderr;
    const truncated = r.stdoutTruncated || r.stderrTruncated;
    if (r.timedOut) {
      const s = Math.round(timeoutMs / 1000);
      const hint =
        opts.timeoutMs !== undefined
          ? "The command may be stuck or need more time."
          : "For a long-running command, run it in the background (nohup … &) and check on it later.";
      output += `${output && !output.endsWith("\n") ? "\n" : ""}Error: Command timed out after ${s} seconds and was killed. ${hint}`;
      return { output, exitCode: 124, truncated };
    }
    if (r.oomKilled) {
      output += `${output && !output.endsWith("\n") ? "\n" : ""}Error: the command was killed because the sandbox ran out of memory.`;
    } else if (r.error) {
      output += `${output && !output.endsWith("\n") ? "\n" : ""}${r.error}`;
    }
    return { output, exitCode: r.exitCode, truncated };
  }

  /** The entries of a directory, directories ending with "/". A path that
   * does not exist, or is not a directory, has none (as deepagents' own backends answer). */
  async ls(path: string): Promise<LsResult> {
    let res;
    try {
      res = await this.#call(() => this.#sb.ls(path));
    } catch (e) {
      const trouble = this.#trouble(e);
      if (trouble) return { error: trouble };
      if (e instanceof BerthError && (e instanceof NotFound || e.reason === "not_directory")) return { files: [] };
      return { error: `Cannot list '${path}': ${detail(e)}` };
    }
    return {
      files: res.entries.map((ent) => {
        const dir = ent.type === "dir";
        return { path: dir ? ent.path + "/" : ent.path, is_dir: dir, size: ent.size, modified_at: ent.modified_at };
      }),
    };
  }

  // A read's error for a path, as deepagents' backends word it.
  #readError(path: string, e: unknown): ReadResult {
    const trouble = this.#trouble(e);
    if (trouble) return { error: trouble };
    if (e instanceof BerthError) {
      const code = fileCode(e);
      if (code === "file_not_found") return { error: `File '${path}' not found` };
      if (code === "is_directory") return { error: `'${path}' is a directory, not a file: list it with ls` };
      if (code === "permission_denied") return { error: `Permission denied reading '${path}'` };
    }
    return { error: `Error reading file '${path}': ${detail(e)}` };
  }

  /** A page of a text file: `limit` lines from line `offset` (0-based),
   * without line numbers (the read_file tool adds its own header), or a
   * binary file (by its extension, as deepagents decides) whole, as bytes. */
  async read(filePath: string, offset = 0, limit = 500): Promise<ReadResult> {
    const mimeType = mimeTypeOf(filePath);
    if (!isTextMimeType(mimeType)) {
      try {
        const st = await this.#call(() => this.#sb.stat(filePath));
        if (st.type === "dir") return { error: `'${filePath}' is a directory, not a file: list it with ls` };
        if (st.size > MAX_BINARY_READ_BYTES) return { error: tooLargeToRead(filePath, true) };
        // The stat does not bound the download: the sandbox may have
        // swapped the file since. The download is bounded itself.
        return { content: await this.#call(() => this.#sb.download(filePath, { maxBytes: MAX_BINARY_READ_BYTES })), mimeType };
      } catch (e) {
        if (e instanceof TooLarge) return { error: tooLargeToRead(filePath, true) };
        return this.#readError(filePath, e);
      }
    }
    const o = Number.isFinite(offset) ? Math.max(0, Math.floor(offset)) : 0;
    const l = Number.isFinite(limit) ? Math.max(0, Math.floor(limit)) : 0;
    let page;
    try {
      page = await this.#call(() => this.#sb.read(filePath, { offset: o, limit: Math.max(l, 1), maxLineChars: MAX_LINE_CHARS }));
    } catch (e) {
      return this.#readError(filePath, e);
    }
    if (page.size === 0) return { content: EMPTY_CONTENT_WARNING, mimeType };
    if (page.binary) {
      return {
        error: `File '${filePath}' holds binary data (${page.size} bytes), not text: inspect it with execute (file, xxd, od)`,
      };
    }
    if (l === 0) return { content: "", mimeType };
    const total = page.total_lines;
    if (page.lines.length === 0) return { error: `Line offset ${o} exceeds file length (${total} lines)` };
    const content = page.lines
      .map((ln) => (ln.truncated ? `${ln.text}… [line cut at ${MAX_LINE_CHARS} characters]` : ln.text))
      .join("\n");
    const end = o + page.lines.length;
    const res: ReadResult = { content, mimeType, totalLines: total, startLine: o + 1, endLine: end };
    if (end < total) res.nextOffset = end;
    return res;
  }

  /** A whole file as deepagents' FileData: text (UTF-8) or, for a binary
   * type, bytes. */
  async readRaw(filePath: string): Promise<ReadRawResult> {
    const mimeType = mimeTypeOf(filePath);
    const binary = !isTextMimeType(mimeType);
    try {
      const [st, bytes] = await this.#call(() =>
        Promise.all([this.#sb.stat(filePath), this.#sb.download(filePath, { maxBytes: MAX_RAW_READ_BYTES })]),
      );
      const content = binary ? bytes : new TextDecoder().decode(bytes);
      return { data: { content, mimeType, created_at: st.modified_at, modified_at: st.modified_at } };
    } catch (e) {
      if (e instanceof TooLarge) return { error: tooLargeToRead(filePath, binary) };
      return this.#readError(filePath, e);
    }
  }

  // Whether a path is inside a directory deepagents writes to.
  #inOwnDir(path: string): boolean {
    return this.#ownDirs.some((d) => path.startsWith(d + "/"));
  }

  // Makes deepagents' directories, as root, owned by the sandbox's user (so
  // that the agent's own commands can read, change and remove what is
  // written there), once per backend; another try after a failure. A path
  // that is already a symlink is refused, and none is followed: root would
  // otherwise chown where the sandbox pointed it (/large_tool_results -> /etc).
  #makeOwnDirs(): Promise<void> {
    this.#dirsMade ??= (async () => {
      const owner = String(this.#sb.info.raw?.user || "user");
      const dirs = this.#ownDirs.map(shellQuote).join(" ");
      const script =
        'owner=$1; shift; for d; do if [ -L "$d" ]; then echo "$d is a symlink: not made or chowned" >&2; exit 1; fi; done; ' +
        'mkdir -p -m 0755 -- "$@" && chown -h -- "$owner" "$@"';
      const r = await this.#call(() =>
        this.#sb.exec(`sh -c ${shellQuote(script)} sh ${shellQuote(owner)} ${dirs}`, { user: "root", timeoutMs: 60_000 }),
      );
      if (r.exitCode !== 0) throw new Error(`making ${this.#ownDirs.join(", ")} failed: ${(r.stdout + r.stderr).trim()}`);
    })().catch((e: unknown) => {
      this.#dirsMade = undefined;
      throw e;
    });
    return this.#dirsMade;
  }

  // Runs a write; one into deepagents' directories that is refused (the
  // sandbox's user cannot make them at /) makes them and is made again.
  async #writing<T>(path: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await this.#call(fn);
    } catch (e) {
      if (!(e instanceof BerthError) || fileCode(e) !== "permission_denied" || !this.#inOwnDir(path)) throw e;
    }
    await this.#makeOwnDirs();
    return this.#call(fn);
  }

  /** Writes a file (making its parents, replacing an existing file): text as
   * UTF-8; for a binary type (by extension) the content is base64, as
   * deepagents' backends take it. */
  async write(filePath: string, content: string): Promise<WriteResult> {
    const mime = mimeTypeOf(filePath);
    try {
      if (isTextMimeType(mime)) {
        await this.#writing(filePath, () => this.#sb.write(filePath, content));
      } else {
        const bytes = Buffer.from(content, "base64");
        await this.#writing(filePath, () => this.#sb.upload(filePath, bytes));
      }
    } catch (e) {
      const trouble = this.#trouble(e);
      if (trouble) return { error: trouble };
      if (e instanceof BerthError) {
        const code = fileCode(e);
        if (code === "is_directory") return { error: `Failed to write to ${filePath}: it is a directory` };
        if (code === "permission_denied") return { error: `Failed to write to ${filePath}: permission denied` };
      }
      return { error: `Failed to write to ${filePath}: ${detail(e)}` };
    }
    return { path: filePath, filesUpdate: null };
  }

  /** Replaces `oldString` by `newString`: it must occur exactly once unless
   * `replaceAll`. An empty `oldString` fills an empty file. */
  async edit(filePath: string, oldString: string, newString: string, replaceAll = false): Promise<EditResult> {
    try {
      if (oldString === "") {
        const st = await this.#call(() => this.#sb.stat(filePath));
        if (st.type === "dir") return { error: `Error: '${filePath}' is a directory, not a file` };
        if (st.size !== 0) return { error: "Error: oldString must not be empty unless the file is empty" };
        if (newString === "") return { path: filePath, filesUpdate: null, occurrences: 0 };
        await this.#call(() => this.#sb.write(filePath, newString));
        return { path: filePath, filesUpdate: null, occurrences: 1 };
      }
      const n = await this.#call(() => this.#sb.edit(filePath, oldString, newString, { replaceAll }), true);
      return { path: filePath, filesUpdate: null, occurrences: n };
    } catch (e) {
      const trouble = this.#trouble(e);
      if (trouble) return { error: trouble };
      if (e instanceof BerthError) {
        if (e.reason === "no_match") return { error: `Error: String not found in file '${filePath}': ${quoted(oldString)}` };
        if (e.reason === "not_unique") {
          return {
            error:
              `Error: Multiple occurrences of ${quoted(oldString)} found in '${filePath}'. ` +
              "Use replace_all=true to replace all of them, or give a longer string with surrounding context to pick one.",
          };
        }
        const code = fileCode(e);
        if (code === "file_not_found") return { error: `Error: File '${filePath}' not found` };
        if (code === "is_directory") return { error: `Error: '${filePath}' is a directory, not a file` };
        if (code === "permission_denied") return { error: `Error: Permission denied editing '${filePath}'` };
      }
      return { error: `Error editing file '${filePath}': ${detail(e)}` };
    }
  }

  /** Removes a file, or a directory with everything in it. */
  async delete(filePath: string): Promise<DeleteResult> {
    try {
      await this.#call(() => this.#sb.remove(filePath, { recursive: true }), true);
    } catch (e) {
      const trouble = this.#trouble(e);
      if (trouble) return { error: trouble };
      if (e instanceof BerthError && fileCode(e) === "file_not_found") return { error: `Error: '${filePath}' not found` };
      return { error: `Error deleting '${filePath}': ${detail(e)}` };
    }
    return { path: filePath, filesUpdate: null };
  }

  /** Lines of text files under `path` that contain `pattern` (literally,
   * case-sensitive), in the files whose name matches `glob`; at most
   * `maxCount` (then truncated). Without a path, the sandbox's working
   * directory (/home/user) is searched, as berth's Python backend does:
   * the whole of / holds the image's system files (half a minute to search
   * the host image, and matches no agent asked for). */
  async grep(pattern: string, path?: string | null, glob?: string | null, maxCount?: number | null): Promise<GrepResult> {
    const root = path || undefined;
    const where = root ?? "the working directory";
    const cap = typeof maxCount === "number" && maxCount >= 0 ? Math.floor(maxCount) : undefined;
    let res;
    try {
      res = await this.#call(() =>
        this.#sb.grep(pattern, root, { glob: glob || undefined, limit: cap !== undefined ? cap + 1 : GREP_LIMIT }),
      );
    } catch (e) {
      const trouble = this.#trouble(e);
      if (trouble) return { error: trouble };
      if (e instanceof BerthError && fileCode(e) === "file_not_found") return { error: `Path '${where}' not found` };
      return { error: `Cannot search '${where}': ${detail(e)}` };
    }
    const matches: GrepMatch[] = res.matches.map((m) => ({ path: m.path, line: m.line, text: m.text }));
    if (cap !== undefined && matches.length > cap) return { matches: matches.slice(0, cap), truncated: true };
    return { matches, truncated: Boolean(res.truncated) };
  }

  /** Files (not directories) under `path` (default /) whose path relative to
   * it matches `pattern`: `*`, `?` and `[…]` within one segment, `**` across
   * segments, so "*.py" matches only in `path` itself and "**\/*.py" at any
   * depth. Paths are absolute. */
  async glob(pattern: string, path = "/"): Promise<GlobResult> {
    const root = path || "/";
    // berth matches a pattern without "/" against names at any depth, and
    // anchors one that begins with "/" to root: deepagents' "*.py" is the latter.
    const anchored = pattern.startsWith("/") || pattern.includes("/") ? pattern : "/" + pattern;
    let res;
    try {
      res = await this.#call(() => this.#sb.glob(anchored, root, { limit: GLOB_LIMIT }));
    } catch (e) {
      const trouble = this.#trouble(e);
      if (trouble) return { error: trouble };
      if (e instanceof BerthError && fileCode(e) === "file_not_found") return { files: [] };
      return { error: `Cannot search '${root}': ${detail(e)}` };
    }
    return {
      files: res.matches.map((m) => ({ path: m.path, is_dir: false, size: m.size, modified_at: m.modified_at })),
      truncated: Boolean(res.truncated),
    };
  }

  // A batch call; an error about the sandbox itself answers every file with
  // the model's sentence (as berth's Python backend does), others are thrown.
  async #batch<T>(fn: () => Promise<T>): Promise<T | string> {
    try {
      return await this.#call(fn);
    } catch (e) {
      const text = this.#trouble(e);
      if (text === undefined) throw e;
      return text;
    }
  }

  /** Writes each file (parents made); one response per file, in order, with
   * deepagents' code on failure (or, when the sandbox itself cannot be used,
   * the sentence that says why). Throws only a failure of the whole batch
   * that is not the sandbox's (a BerthError). */
  async uploadFiles(files: Array<[string, Uint8Array]>): Promise<FileUploadResponse[]> {
    const out: FileUploadResponse[] = files.map(([path]) => ({ path, error: path.startsWith("/") ? null : "invalid_path" }));
    const todo = files.map((f, i) => [i, f] as const).filter(([i]) => out[i]!.error === null);
    if (!todo.length) return out;
    const results = await this.#batch(() => this.#sb.uploadFiles(todo.map(([, f]) => f)));
    if (typeof results === "string") {
      for (const [i] of todo) out[i]!.error = results as FileOperationError;
      return out;
    }
    // Writes refused in deepagents' own directories: make them, try again.
    const retry = todo.filter(([, [path]], k) => results[k]?.error && fileCode(results[k]!.error!) === "permission_denied" && this.#inOwnDir(path));
    const again = new Map<number, FileResult>();
    if (retry.length) {
      try {
        await this.#makeOwnDirs();
        const second = await this.#call(() => this.#sb.uploadFiles(retry.map(([, f]) => f)));
        second.forEach((r, k) => again.set(retry[k]![0], r));
      } catch (e) {
        // They keep their first answer (permission_denied).
        this.#logger?.warn(`berth sandbox ${this.#sb.id}: making ${this.#ownDirs.join(", ")}: ${e instanceof Error ? e.message : String(e)}`, e);
      }
    }
    todo.forEach(([i], k) => {
      const r = again.get(i) ?? results[k];
      out[i]!.error = r?.error ? fileCode(r.error) : null;
    });
    return out;
  }

  /** Reads each file; one response per path, in order, as uploadFiles answers. */
  async downloadFiles(paths: string[]): Promise<FileDownloadResponse[]> {
    const out: FileDownloadResponse[] = paths.map((path) => ({
      path,
      content: null,
      error: path.startsWith("/") ? null : "invalid_path",
    }));
    const todo = paths.map((p, i) => [i, p] as const).filter(([i]) => out[i]!.error === null);
    if (!todo.length) return out;
    const results = await this.#batch(() => this.#sb.downloadFiles(todo.map(([, p]) => p)));
    todo.forEach(([i], k) => {
      const r = typeof results === "string" ? results : results[k];
      if (typeof r === "string") out[i]!.error = r as FileOperationError;
      else if (!r || r.error) out[i]!.error = r?.error ? fileCode(r.error) : "file_not_found";
      else out[i]!.content = r.content ?? new Uint8Array(0);
    });
    return out;
  }
}
