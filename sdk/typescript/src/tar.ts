// A small tar writer (POSIX ustar, with a PAX extended header for names
// and link targets that do not fit), for build contexts and for callers of
// uploadArchive that have files in memory.

export interface TarEntry {
  /** The path inside the archive, "/"-separated, relative. */
  name: string;
  type: "file" | "dir" | "symlink";
  /** Permission bits (default 0644 for files and 0755 for directories). */
  mode?: number;
  /** A file's content. */
  data?: Uint8Array | string;
  /** A symlink's target. */
  target?: string;
  /** Modification time in seconds since the epoch (default 0). */
  mtime?: number;
}

const BLOCK = 512;

function octal(n: number, width: number): string {
  // width-1 digits and a NUL.
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function header(name: string, size: number, mode: number, mtime: number, type: string, link: string): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(name, 0, 100, "utf8");
  h.write(octal(mode, 8), 100, "ascii");
  h.write(octal(0, 8), 108, "ascii");
  h.write(octal(0, 8), 116, "ascii");
  h.write(octal(size, 12), 124, "ascii");
  h.write(octal(mtime, 12), 136, "ascii");
  h.write("        ", 148, "ascii"); // the checksum counts as spaces
  h.write(type, 156, "ascii");
  h.write(link, 157, 100, "utf8");
  h.write("ustar\0", 257, "ascii");
  h.write("00", 263, "ascii");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, "ascii");
  return h;
}

function pad(n: number): Buffer {
  const r = n % BLOCK;
  return Buffer.alloc(r === 0 ? 0 : BLOCK - r);
}

function paxRecord(key: string, value: string): string {
  // "%d %s=%s\n", where the length counts itself.
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return `${len}${body}`;
}

/** A tar archive of entries, in order. */
export function tarOf(entries: TarEntry[]): Uint8Array {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const name = e.type === "dir" && !e.name.endsWith("/") ? e.name + "/" : e.name;
    const data = e.type === "file" ? Buffer.from(e.data ?? "") : Buffer.alloc(0);
    const target = e.type === "symlink" ? (e.target ?? "") : "";
    const mode = e.mode ?? (e.type === "dir" ? 0o755 : 0o644);
    const mtime = Math.floor(e.mtime ?? 0);
    let pax = "";
    if (Buffer.byteLength(name) > 100) pax += paxRecord("path", name);
    if (Buffer.byteLength(target) > 100) pax += paxRecord("linkpath", target);
    if (pax) {
      const p = Buffer.from(pax, "utf8");
      parts.push(header("././@PaxHeader", p.length, 0o644, mtime, "x", ""), p, pad(p.length));
    }
    const type = e.type === "file" ? "0" : e.type === "dir" ? "5" : "2";
    parts.push(header(name.slice(0, 100), data.length, mode, mtime, type, target.slice(0, 100)), data, pad(data.length));
  }
  parts.push(Buffer.alloc(BLOCK * 2));
  const out = Buffer.concat(parts);
  return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
}
