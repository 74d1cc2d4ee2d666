// The code of docs/typescript.md, type-checked against the built package
// (imported by its name, as a user imports it) by typecheck.test.mjs. It is
// compiled, never run.
import * as fs from "node:fs";
import { pipeline } from "node:stream/promises";
import {
  ACCESS_TOKEN_HEADER,
  Berth,
  BerthError,
  Conflict,
  DaemonUnreachable,
  InvalidArgument,
  NotFound,
  tarOf,
  type BuildResult,
  type ExecEvent,
  type Image,
  type Pool,
  type ExecResult,
  type FileResult,
  type Sandbox,
  type Terminal,
  type APIKey,
  type AuditRecord,
  ResourceExhausted,
  type Quota,
  type TenantUsage,
} from "@berthsh/berth";

export async function connect(): Promise<void> {
  const berth = new Berth();
  const remote = new Berth({ url: "http://berth.example.internal:7680", apiKey: process.env.BERTH_API_KEY, timeoutMs: 60_000 });
  const local = new Berth({ url: "unix:///var/lib/berth/berth.sock" });
  for (const b of [berth, remote, local]) b.close();
}

export async function aSandbox(): Promise<void> {
  const berth = new Berth();
  await using sb = await berth.create({ memory: 512 << 20, cpus: 1, labels: { team: "agents" } });
  const r: ExecResult = await sb.exec("python3 -c 'print(6 * 7)'", { timeoutMs: 30_000 });
  console.log(r.exitCode, r.stdout, r.stderr, r.ok, r.timedOut, r.oomKilled, r.signal, r.stdoutBytes.byteLength);
  await sb.write("/home/user/app.py", "print('hi')\n");
  const n: number = await sb.edit("/home/user/app.py", "hi", "hello");
  console.log(n, (await sb.read("/home/user/app.py")).lines[0]?.text);
  console.log((await sb.grep("hello", "/home/user", { glob: "*.py" })).matches[0]?.line);

  const thread = await berth.getOrCreate({ thread_id: "conv-42" }, { idleTimeoutMs: 15 * 60_000 });
  const again: Sandbox = await berth.get(thread.id);
  const mine = await berth.list({ labels: { team: "agents" } });
  await berth.list({ selector: "team=agents,!old" });
  console.log(again.id, mine.length);
  await thread.stop();
  await thread.start();
  await thread.refresh();
  await thread.pause();
  await thread.pause({ memory: true });
  await thread.resume();
  await berth.delete(thread.id);
}

export async function streaming(sb: Sandbox): Promise<void> {
  for await (const ev of sb.execStream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done"])) {
    const e: ExecEvent = ev;
    if (e.type === "start") console.log("pid", e.pid);
    if (e.type === "stdout" || e.type === "stderr") process.stdout.write(e.data);
    if (e.type === "exit") console.log("exit", e.result!.exitCode);
    if (e.type === "error") throw e.error;
  }
}

export async function processes(sb: Sandbox): Promise<void> {
  const pid = await sb.startProcess("python3 -m http.server 8000", { env: { PYTHONUNBUFFERED: "1" } });
  console.log(await sb.listProcesses(), await sb.getProcess(pid));
  await sb.killProcess(pid, "TERM");
  const res: ExecResult = await sb.waitProcess(pid, { timeoutMs: 10_000 });
  console.log(res.signal);
  const cat = await sb.startProcess(["cat"], { openStdin: true });
  await sb.writeStdin(cat, "hello\n", { close: true });
  const term: Terminal = await sb.openTerminal(["/bin/bash"], { rows: 40, cols: 120 });
  await term.write("ls -la\n");
  await term.resize(50, 160);
  for await (const chunk of term.output()) process.stdout.write(chunk);
  console.log(term.result?.exitCode, term.pid, term.tty?.rows);
  const again = await sb.attach(term.pid);
  const done: ExecResult = await again.wait(5000);
  console.log(done.stdout);
  await again.close();
}

export async function streams(sb: Sandbox, pid: number, signal: AbortSignal): Promise<void> {
  for await (const ev of sb.processOutput(pid, { follow: true })) {
    if (ev.type === "stdout") process.stdout.write(ev.data);
    if (ev.type === "exit") console.log("ended", ev.result!.exitCode);
  }
  await sb.removeProcess(pid);
  for await (const ev of sb.events({ signal })) console.log(ev.type, ev.pid ?? "");
  for await (const ch of sb.watch("/home/user", { recursive: true, signal })) console.log(ch.type, ch.path, ch.isDir);
  console.log(await sb.stats());
  await sb.keepalive();
  await sb.update({ labels: { stage: "review", draft: null }, memory: 1 << 30, idleTimeoutMs: 3_600_000 });
  await sb.downloadTo("/home/user/out.csv", "out.csv");
}

export async function files(sb: Sandbox, other: Sandbox): Promise<void> {
  await sb.upload("/home/user/data.bin", new Uint8Array([1, 2, 3]), { mode: 0o600 });
  await sb.upload("/home/user/big.iso", fs.createReadStream("big.iso"));
  const bytes: Uint8Array = await sb.download("/home/user/data.bin");
  const stream = await sb.downloadStream("/home/user/big.iso");
  await pipeline(stream, fs.createWriteStream("copy.iso"));
  await sb.uploadArchive("/home/user/project", fs.createReadStream("project.tar"));
  const tar: Uint8Array = await sb.downloadArchive("/home/user/project");
  await sb.uploadArchive("/srv", tarOf([{ name: "app/main.py", type: "file", data: "print(1)\n" }]));
  const results: FileResult[] = await sb.uploadFiles([["/home/user/a.txt", "a"], { path: "/etc/x", content: "no" }]);
  const got = await sb.downloadFiles(["/home/user/a.txt", "/nope"]);
  console.log(bytes.length, tar.length, results[1]?.error?.class, got[0]?.content?.length);
  await sb.stat("/x");
  await sb.exists("/x");
  await sb.ls("/x", { depth: 2 });
  await sb.mkdir("/x/y");
  await sb.move("/x/y", "/x/z");
  await sb.remove("/x", { recursive: true, force: true });
  await sb.chmod("/x", 0o755);
  await sb.chown("/x", "user");
  await sb.read("/x", { offset: 10, limit: 5 });
  await sb.glob("**/*.py", "/home/user");
  await sb.grep("TODO", "/home/user", { regex: true, ignoreCase: true, limit: 10 });

  const snap = await sb.snapshot("after-setup", { labels: { stage: "setup" } });
  const berth = new Berth();
  const copy = await berth.create({ image: snap });
  const forks = await sb.fork(3, { labels: [{ try: "a" }, { try: "b" }, { try: "c" }] });
  const d = await forks[0]!.diff();
  console.log(copy.id, d.changes.length, d.paths("added"), forks.snapshot, forks.frozenMs);
  console.log(await forks[0]!.diffPatch(snap));
  await sb.apply(forks[0]!);
  await other.applyTar(await forks[1]!.diffTar());
  await berth.listSnapshots({ stage: "setup" });
  await berth.deleteSnapshot(snap);
}

export async function network(key: string): Promise<void> {
  const berth = new Berth();
  await berth.createSecret("openai", key);
  const sb = await berth.create({
    network: {
      mode: "allowlist",
      allow: ["pypi.org", "*.pythonhosted.org"],
      secrets: [{ secret: "openai", host: "api.openai.com", env: "OPENAI_API_KEY" }],
    },
  });
  await sb.setNetwork("open");
  await sb.setNetwork(undefined, { allow: ["pypi.org"] });
  console.log(await sb.egress({ denied: true }));
  for await (const rec of sb.followEgress({ signal: AbortSignal.timeout(60_000) })) console.log(rec);
  await sb.startProcess("python3 -m http.server 8000 --bind 127.0.0.1");
  await sb.waitForPort(8000, { timeoutMs: 30_000 });
  const url: string = await sb.url(8000, "/index.html");
  await fetch(await sb.url(8000, "/", { withToken: false }), { headers: { [ACCESS_TOKEN_HEADER]: sb.accessToken } });
  console.log(url, await sb.url(8000, "/", { hostForm: true }));
  await sb.rotateAccessToken();
  await sb.setPublicPorts([8000]);
  await berth.pullImage("python:3.12-slim");
  await berth.importImage(fs.createReadStream("image.tar"), { name: "mine:1" });
  await berth.buildTemplate("agent-env:1", "./agent-env");
  await berth.setPool("agent-env:1", 4);
  console.log(await berth.listImages(), await berth.listTemplates(), await berth.pools());
  for await (const ev of berth.pullImageStream("python:3.12-slim")) {
    if (ev.status === "downloading") console.log(ev.layer, ev.current, "/", ev.total);
  }
  for await (const ev of berth.buildTemplateStream("agent-env:2", "./agent-env")) {
    if (ev.type === "step") console.log(`step ${ev.step}/${ev.steps}: ${ev.instruction}${ev.cached ? " (cached)" : ""}`);
    if (ev.type === "stdout" || ev.type === "stderr") process.stdout.write(ev.data);
    if (ev.type === "error") throw ev.error;
  }
  const rt = (await berth.runtimes()).find((r) => r.default);
  console.log(rt?.capabilities?.memory_checkpoint, (await berth.version()).ports_domain);
  const pool: Pool = await berth.setPool("agent-env:1", 0);
  const img: Image = await berth.inspectImage("agent-env:1");
  const built: BuildResult = await berth.buildTemplate("agent-env:1", "./agent-env");
  console.log(pool.ready, img.in_use, built.executed);
}

export async function errors(sb: Sandbox): Promise<void> {
  try {
    await sb.download("/home/user/report.pdf");
  } catch (err) {
    if (err instanceof NotFound) console.log("no report yet:", err.message, err.status, err.code);
    else if (err instanceof InvalidArgument && err.reason === "is_directory") console.log("a directory");
    else if (err instanceof DaemonUnreachable) console.log(err.message);
    else if (err instanceof Conflict) console.log(err.paths);
    else if (err instanceof BerthError) console.log(err.details);
    else throw err;
  }
}

export async function keys(): Promise<void> {
  const admin = new Berth();
  const key: APIKey = await admin.createApiKey({ tenant: "team-a", scope: "write", name: "ci" });
  const teamA = new Berth({ apiKey: key.key });
  const reader = await admin.createApiKey({ tenant: "team-a", scope: "read", expiresAt: new Date(Date.now() + 86_400_000) });
  console.log((await admin.listApiKeys()).map((k) => [k.id, k.tenant, k.scope, k.revoked_at]));
  await admin.revokeApiKey(reader);
  const records: AuditRecord[] = await admin.audit({ tenant: "team-a" });
  for (const r of records) console.log(r.seq, r.key_id, r.method, r.path, r.status, r.error);
  teamA.close();
  admin.close();
}

export async function quotas(): Promise<void> {
  const admin = new Berth();
  const bounds: Quota = { sandboxes: 10, cpus: 8, memory_bytes: 16 * 2 ** 30 };
  await admin.setQuota("team-a", bounds);
  const teamA = new Berth({ apiKey: (await admin.createApiKey({ tenant: "team-a" })).key });
  try {
    await using sb = await teamA.create({ cpus: 1, memory: 2 ** 30 });
    console.log((await sb.exec("echo hello")).stdout);
  } catch (err) {
    if (err instanceof ResourceExhausted) console.log(err.message);
    else throw err;
  }
  const usage: TenantUsage[] = await admin.usage();
  for (const u of usage) console.log(u.tenant, u.sandboxes, u.quota.sandboxes, u.cpu_seconds, u.egress_bytes_out);
  const mine: TenantUsage[] = await teamA.usage({ tenant: "team-a" });
  console.log(mine[0]?.sandbox_seconds);
  await admin.setQuota("team-a", {});
  teamA.close();
  admin.close();
}
