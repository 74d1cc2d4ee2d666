// Attachments to processes over a WebSocket: terminals and interactive
// input. The protocol is the daemon's (api/terminals.go): binary messages
// carry bytes, the process's input from us and its output (a terminal's,
// or stdout) from the daemon; text messages are one JSON TerminalMessage
// each: resize and eof from us, attached (first), stderr, error (the
// attachment goes on) and exit (last, then a 1000 close) from the daemon.
// When the sandbox goes away the daemon sends an error event, then closes
// with 1001 and the reason.

import WebSocket from "ws";
import type { IncomingMessage } from "node:http";
import {
  type ApiError,
  BerthError,
  Conflict,
  DeadlineExceeded,
  InternalError,
  InvalidArgument,
  Unavailable,
  errorFor,
  errorFromApi,
} from "./errors.js";
import { type Transport, queryString, type Query, MAX_ERROR_BODY, readAtMost } from "./http.js";
import { ExecResult, type TTY, b64decode } from "./types.js";

// The largest message the daemon sends is a 1 MiB frame of output, as
// base64 in JSON for stderr.
const MAX_MESSAGE = 4 << 20;
/** The daemon's bound on a terminal's rows and columns. */
export const MAX_TTY = 10000;

/** One event of an attachment: `stdout` (a terminal's output, or a process's
 * standard output) or `stderr` bytes in data; `error`, what the daemon could
 * not do (a message it could not take, and the attachment goes on; or what
 * ends it, which recv then throws); `exit`, the last, with result (its output
 * is what came in the events before). */
export interface TerminalEvent {
  type: "stdout" | "stderr" | "error" | "exit";
  data: Uint8Array;
  result?: ExecResult;
  error?: BerthError;
}

type Incoming = { data: WebSocket.RawData; binary: boolean };

const EMPTY = new Uint8Array(0);

function toBytes(d: WebSocket.RawData): Uint8Array {
  const b = Array.isArray(d) ? Buffer.concat(d) : Buffer.isBuffer(d) ? d : Buffer.from(d);
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

function checkSize(rows: number, cols: number): void {
  for (const [name, n] of [
    ["rows", rows],
    ["cols", cols],
  ] as const) {
    if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > MAX_TTY) {
      throw new InvalidArgument(`resize: ${name} ${String(n)}; each must be 1 to ${MAX_TTY}`);
    }
  }
}

/** Opens a WebSocket to the daemon and waits for its first message. */
export async function openTerminal(t: Transport, path: string, query?: Query): Promise<Terminal> {
  const base = new URL(t.ep.origin);
  const prefix = base.pathname.replace(/\/+$/, "");
  const target = prefix + path + queryString(query);
  const address =
    t.ep.socketPath !== undefined
      ? `ws+unix://${t.ep.socketPath}:${target}`
      : (base.protocol === "https:" ? "wss://" : "ws://") + base.host + target;
  const headers: Record<string, string> = { "User-Agent": t.headers["User-Agent"]! };
  if (t.headers.Authorization) headers.Authorization = t.headers.Authorization;
  const ws = new WebSocket(address, {
    headers,
    maxPayload: MAX_MESSAGE,
    perMessageDeflate: false,
    handshakeTimeout: t.timeoutMs > 0 ? t.timeoutMs : undefined,
  });
  const term = new Terminal(ws, path);
  await term.opened(t);
  return term;
}

/** An attachment to a process over a WebSocket, from Sandbox.openTerminal or
 * Sandbox.attach. Its output comes from recv() or `for await`, as
 * TerminalEvents (stdout, stderr, error, and exit last); its input goes to
 * write(). What the process printed before the attachment comes first (a
 * terminal's recent screen, another process's kept output). close() leaves
 * the process running: attach again by pid. */
export class Terminal implements AsyncIterable<TerminalEvent> {
  /** The process attached to. */
  pid = 0;
  /** The terminal's size (undefined for a process without one): as
   * attached, then as last asked for by resize. */
  tty: TTY | undefined;
  /** How the process ended, once the exit event came. */
  result: ExecResult | undefined;

  private readonly ws: WebSocket;
  private readonly path: string;
  private readonly queue: Incoming[] = [];
  // The readers waiting for a message (recv may be called again before an
  // earlier call returned: each message goes to one of them).
  private readonly waiters = new Set<() => void>();
  private closedByUs = false;
  private closeInfo: { code: number; reason: string } | undefined;
  private socketError: Error | undefined;
  private lastError: BerthError | undefined;
  private out: Uint8Array[] = [];
  private err: Uint8Array[] = [];

  /** @internal */
  constructor(ws: WebSocket, path: string) {
    this.ws = ws;
    this.path = path;
    ws.on("message", (data, binary) => {
      this.queue.push({ data, binary });
      this.wake();
    });
    ws.on("close", (code, reason) => {
      this.closeInfo = { code, reason: reason.toString("utf8") };
      this.wake();
    });
    ws.on("error", (e) => {
      this.socketError = e;
      this.wake();
    });
  }

  /** @internal Waits for the WebSocket to open and the attached message. */
  async opened(t: Transport): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const done = (e?: unknown) => {
        this.ws.off("open", onOpen);
        this.ws.off("unexpected-response", onResponse);
        this.ws.off("error", onError);
        if (e) reject(e);
        else resolve();
      };
      const onOpen = () => done();
      const onError = (e: Error) => done(t.unreachable(e));
      const onResponse = (_req: unknown, res: IncomingMessage) => {
        readAtMost(res, MAX_ERROR_BODY).then(
          (raw) => {
            const text = raw.toString("utf8");
            let body: unknown;
            try {
              body = JSON.parse(text);
            } catch {
              body = undefined;
            }
            done(errorFor(res.statusCode ?? 0, body, text));
            this.ws.terminate();
          },
          (e) => done(t.unreachable(e)),
        );
      };
      this.ws.on("open", onOpen);
      this.ws.on("unexpected-response", onResponse);
      this.ws.on("error", onError);
    });
    let first: Incoming | undefined;
    try {
      first = await this.next(t.timeoutMs > 0 ? t.timeoutMs : 30000);
    } catch (e) {
      this.ws.terminate();
      throw new Unavailable(`${this.path}: no attached message from the daemon: ${(e as Error).message}`);
    }
    let m: any;
    try {
      m = first && !first.binary ? JSON.parse(first.data.toString()) : undefined;
    } catch {
      m = undefined;
    }
    if (!m || m.type !== "attached" || !(Number(m.pid) > 0)) {
      this.ws.terminate();
      const what = first ? first.data.toString().slice(0, 200) : "the connection closed";
      throw new Unavailable(`${this.path}: the attachment did not begin with an attached message: ${what}`);
    }
    this.pid = Number(m.pid);
    this.tty = m.tty && typeof m.tty === "object" ? { rows: Number(m.tty.rows), cols: Number(m.tty.cols) } : undefined;
  }

  private wake(): void {
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }

  private get done(): boolean {
    return this.result !== undefined || this.closedByUs;
  }

  /** The next raw message; undefined once the socket closed. Throws
   * DeadlineExceeded after timeoutMs. */
  private async next(timeoutMs?: number): Promise<Incoming | undefined> {
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (;;) {
      const m = this.queue.shift();
      if (m) return m;
      if (this.closeInfo || this.socketError || this.closedByUs) return undefined;
      let timer: NodeJS.Timeout | undefined;
      let waiter: (() => void) | undefined;
      const arrived = new Promise<boolean>((resolve) => {
        waiter = () => resolve(true);
        this.waiters.add(waiter);
        if (deadline !== undefined) timer = setTimeout(() => resolve(false), Math.max(0, deadline - Date.now()));
      });
      const ok = await arrived;
      if (timer) clearTimeout(timer);
      this.waiters.delete(waiter!);
      if (!ok) throw new DeadlineExceeded(`process ${this.pid}: no output after ${timeoutMs} ms`);
    }
  }

  private event(m: Incoming): TerminalEvent | undefined {
    if (m.binary) return { type: "stdout", data: toBytes(m.data) };
    let d: any;
    try {
      d = JSON.parse(m.data.toString());
    } catch (e) {
      throw new Unavailable(`process ${this.pid}: a terminal message that is not JSON: ${(e as Error).message}`);
    }
    switch (d?.type) {
      case "stderr":
        return { type: "stderr", data: b64decode(d.data) };
      case "exit":
        if (!d.result || typeof d.result !== "object") {
          throw new Unavailable(`process ${this.pid}: an exit message without a result`);
        }
        this.result = ExecResult.fromJSON(d.result);
        return { type: "exit", data: EMPTY, result: this.result };
      case "error": {
        const e =
          d.error && typeof d.error === "object" && typeof d.error.message === "string"
            ? errorFromApi(d.error as ApiError)
            : new InternalError("an error message without an error");
        this.lastError = e;
        return { type: "error", data: EMPTY, error: e };
      }
      default:
        return undefined; // a type from a newer daemon
    }
  }

  /** What a closed WebSocket means: the end (undefined) after the exit or
   * our own close, else the error that broke it. */
  private broken(): BerthError | undefined {
    if (this.done) return undefined;
    const c = this.closeInfo;
    if (c && c.reason) {
      const last = this.lastError;
      if (last && last.message.startsWith(c.reason)) {
        const Cls = last.constructor as new (m: string, o?: object) => BerthError;
        return new Cls(last.message, { reason: last.reason, details: last.details });
      }
      return new Unavailable(c.reason);
    }
    if (c && c.code === 1000) {
      return new Unavailable(`process ${this.pid}: the daemon closed the attachment before the process exited`);
    }
    const why = this.socketError ? this.socketError.message : `close code ${c?.code ?? "none"}`;
    return new Unavailable(`process ${this.pid}: the connection to the daemon broke (${why})`);
  }

  /** The next event; undefined after the exit event or close(). Throws
   * DeadlineExceeded when none comes within timeoutMs (the attachment goes
   * on), Unavailable (or the class the daemon named) when the attachment
   * broke (the sandbox went away, the daemon stopped). */
  async recv(timeoutMs?: number): Promise<TerminalEvent | undefined> {
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    while (!this.closedByUs) {
      if (this.result !== undefined && this.queue.length === 0) return undefined;
      const m = await this.next(deadline === undefined ? undefined : Math.max(0, deadline - Date.now()));
      if (m === undefined) {
        const err = this.broken();
        if (err) throw err;
        return undefined;
      }
      const ev = this.event(m);
      if (ev) return ev;
    }
    return undefined;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<TerminalEvent> {
    for (;;) {
      const ev = await this.recv();
      if (ev === undefined) return;
      yield ev;
    }
  }

  /** The output as it comes: stdout and stderr bytes, until the exit or close(). */
  async *output(): AsyncGenerator<Uint8Array> {
    for await (const ev of this) if (ev.type === "stdout" || ev.type === "stderr") yield ev.data;
  }

  private async send(msg: Uint8Array | string): Promise<void> {
    if (this.done || this.ws.readyState !== WebSocket.OPEN) {
      if (this.done) {
        throw new Conflict(`process ${this.pid}: the attachment is closed (the process exited, or close() was called)`);
      }
      throw this.broken() ?? new Unavailable(`process ${this.pid}: the attachment is closed`);
    }
    await new Promise<void>((resolve, reject) => {
      this.ws.send(msg, { binary: typeof msg !== "string" }, (e) => (e ? reject(this.broken() ?? new Unavailable(e.message)) : resolve()));
    });
  }

  /** Sends bytes (a string as UTF-8) to the process's input: keys to a
   * terminal ("\x03" is Ctrl-C, "\x04" Ctrl-D), lines to a REPL. */
  async write(data: Uint8Array | string): Promise<void> {
    await this.send(typeof data === "string" ? Buffer.from(data, "utf8") : data);
  }

  /** Gives the terminal a new size (each of rows and cols 1 to 10000). */
  async resize(rows: number, cols: number): Promise<void> {
    checkSize(rows, cols);
    await this.send(JSON.stringify({ type: "resize", rows, cols }));
    this.tty = { rows, cols };
  }

  /** Closes the process's input (EOF; on a terminal, its EOF character). */
  async closeStdin(): Promise<void> {
    await this.send(JSON.stringify({ type: "eof" }));
  }

  /** @internal A raw text message (tests of the daemon's refusals). */
  async sendText(text: string): Promise<void> {
    await this.send(text);
  }

  /** Reads until the process exits and returns how it ended, with the output
   * read meanwhile (a terminal's as stdout). Throws DeadlineExceeded after
   * timeoutMs: the process and the attachment go on, and the next wait keeps
   * the output read so far. */
  async wait(timeoutMs?: number): Promise<ExecResult> {
    if (this.result !== undefined && this.queue.length === 0 && this.out.length === 0 && this.err.length === 0) {
      return this.result;
    }
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (;;) {
      let ev: TerminalEvent | undefined;
      try {
        ev = await this.recv(deadline === undefined ? undefined : Math.max(0, deadline - Date.now()));
      } catch (e) {
        if (e instanceof DeadlineExceeded) throw new DeadlineExceeded(`process ${this.pid}: still running after ${timeoutMs} ms`);
        throw e;
      }
      if (ev === undefined) {
        if (this.result !== undefined) return this.result;
        throw new Conflict(`process ${this.pid}: the attachment is closed`);
      }
      if (ev.type === "stdout") this.out.push(ev.data);
      else if (ev.type === "stderr") this.err.push(ev.data);
      else if (ev.type === "exit" && ev.result) {
        const res = ev.result.withOutput(concat(this.out), concat(this.err));
        this.out = [];
        this.err = [];
        this.result = res;
        return res;
      }
    }
  }

  /** Ends the attachment; the process goes on. */
  async close(): Promise<void> {
    if (this.closedByUs) return;
    this.closedByUs = true;
    this.wake();
    if (this.ws.readyState === WebSocket.CLOSED) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.ws.terminate();
        resolve();
      }, 2000);
      this.ws.once("close", () => {
        clearTimeout(t);
        resolve();
      });
      this.ws.close(1000);
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function concat(parts: Uint8Array[]): Uint8Array {
  const b = Buffer.concat(parts);
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}
