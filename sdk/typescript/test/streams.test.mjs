// The daemon's other streams and knobs through the SDK, against a daemon
// started here with a small exec output budget: a plain exec past it is
// ResourceExhausted while a streamed one has no such bound; a process's
// output followed as it prints; the sandbox's events; file watches; stats,
// keepalive and updates; a download to a local file.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Berth, Conflict, InvalidArgument, NotFound, ResourceExhausted } from '../dist/index.js'
import { startDaemon, sleep } from './daemon.mjs'

let daemon, berth

before(async () => {
  daemon = await startDaemon({ prefix: 'tsstream-', args: ['--exec-output-budget', '256K'] })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
})

test('the exec output budget: a plain exec past it is ResourceExhausted, a streamed one goes through', async () => {
  const sb = await berth.create()
  try {
    const cmd = 'head -c 1000000 /dev/zero'
    await assert.rejects(
      sb.exec(cmd),
      (e) => e instanceof ResourceExhausted && e.status === 429 && e.code === 'resource_exhausted' && e.message.includes('stream'),
    )
    let n = 0
    for await (const ev of sb.execStream(cmd)) if (ev.type === 'stdout') n += ev.data.length
    assert.equal(n, 1000000)
    assert.equal((await sb.exec(cmd, { maxOutputBytes: 1000 })).stdoutBytes.length, 1000)
  } finally {
    await sb.delete()
  }
})

test("a background process's output: kept, then followed as it prints", async () => {
  const sb = await berth.create()
  try {
    const pid = await sb.startProcess('echo first; sleep 0.5; echo second >&2; sleep 0.5; echo third; exit 5')
    const events = []
    const t0 = Date.now()
    for await (const ev of sb.processOutput(pid, { follow: true })) events.push([ev, Date.now() - t0])
    const text = (type) => events.filter(([e]) => e.type === type).map(([e]) => Buffer.from(e.data).toString()).join('')
    assert.equal(text('stdout'), 'first\nthird\n')
    assert.equal(text('stderr'), 'second\n')
    const [exit] = events.at(-1)
    assert.equal(exit.type, 'exit')
    assert.equal(exit.result.exitCode, 5)
    const firstAt = events.find(([e]) => e.type === 'stdout')[1]
    assert.ok(events.at(-1)[1] - firstAt >= 700, 'the output came as it was printed')
    // Without follow: what it kept, once it ended.
    const kept = []
    for await (const ev of sb.processOutput(pid)) kept.push(ev.type)
    assert.ok(kept.includes('stdout') && kept.includes('stderr'), kept.join())
    await sb.removeProcess(pid)
    await assert.rejects(sb.getProcess(pid), NotFound)
    const running = await sb.startProcess('sleep 30')
    await assert.rejects(sb.removeProcess(running), Conflict)
  } finally {
    await sb.delete()
  }
})

test("the sandbox's events as they happen, until it is deleted", async () => {
  const sb = await berth.create()
  let deleted = false
  try {
    const events = sb.events()
    const first = events.next() // the request goes out with the first step
    await sleep(200)
    const pid = await sb.startProcess('sleep 30')
    await sb.stop()
    await sb.start()
    await sb.delete()
    deleted = true
    const seen = [(await first).value]
    // The stream ends by itself once the sandbox is deleted.
    for await (const ev of events) seen.push(ev)
    assert.deepEqual(
      seen.map((e) => e.type),
      ['process_started', 'stopped', 'started', 'deleted'],
      JSON.stringify(seen),
    )
    assert.equal(seen[0].pid, pid)
    assert.ok(seen.every((e) => e.sandbox === sb.id && e.time))
  } finally {
    if (!deleted) await sb.delete()
  }
})

test('file watches, and a stream stopped by its signal', async () => {
  const sb = await berth.create()
  try {
    await sb.mkdir('/home/user/w')
    // A write is a temporary file renamed into place; an exec's file is created, then written.
    const ac = new AbortController()
    const timer = setTimeout(() => ac.abort(), 15000)
    const got = []
    const watching = (async () => {
      for await (const ev of sb.watch('/home/user/w', { recursive: true, signal: ac.signal })) {
        got.push(ev)
        if (ev.path === '/home/user/w/b.txt' && ev.type === 'write') break
      }
    })()
    await sleep(300)
    await sb.write('/home/user/w/note.txt', 'hi')
    await sb.exec('echo x > /home/user/w/b.txt')
    await watching
    clearTimeout(timer)
    assert.ok(!ac.signal.aborted, `no write of b.txt within 15 s: ${JSON.stringify(got)}`)
    assert.ok(got.some((e) => e.type === 'rename' && e.path === '/home/user/w/note.txt'), JSON.stringify(got))
    assert.ok(got.some((e) => e.type === 'create' && e.path === '/home/user/w/b.txt' && !e.isDir && e.time), JSON.stringify(got))
    await assert.rejects(sb.watch('/home/user/none').next(), NotFound)

    // An abort ends an events stream quietly.
    const stop = new AbortController()
    const quiet = (async () => {
      const seen = []
      for await (const ev of sb.events({ signal: stop.signal })) seen.push(ev)
      return seen
    })()
    await sleep(200)
    stop.abort()
    assert.deepEqual(await quiet, [])
  } finally {
    await sb.delete()
  }
})

test('stats, keepalive, update of labels, limits and timeouts; a download to a local file', async () => {
  const sb = await berth.create({ labels: { a: '1', b: '2' }, memory: 256 << 20 })
  const dir = mkdtempSync(join(tmpdir(), 'tsstream-'))
  try {
    const st = await sb.stats()
    assert.ok(st.memory_bytes > 0 && st.pids >= 1, JSON.stringify(st))
    await sb.keepalive()
    const info = await sb.update({ labels: { a: 'one', b: null, c: '3' }, memory: 512 << 20, idleTimeoutMs: 600_000 })
    assert.deepEqual(info.labels, { a: 'one', c: '3' })
    assert.equal(info.raw.limits.memory_bytes, 512 << 20)
    assert.equal(info.raw.timeouts.idle_timeout_s, 600)
    assert.deepEqual(sb.info.labels, { a: 'one', c: '3' })
    await assert.rejects(sb.update({ memory: -1 }), InvalidArgument)

    const data = Buffer.alloc(3 << 20, 'berth')
    await sb.upload('/home/user/data.bin', data)
    await sb.downloadTo('/home/user/data.bin', join(dir, 'copy.bin'))
    const sha = (b) => createHash('sha256').update(b).digest('hex')
    assert.equal(sha(readFileSync(join(dir, 'copy.bin'))), sha(data))
    await assert.rejects(sb.downloadTo('/home/user/none', join(dir, 'none.bin')), NotFound)
  } finally {
    rmSync(dir, { recursive: true, force: true })
    await sb.delete()
  }
})
