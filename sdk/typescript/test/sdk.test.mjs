// The SDK against a real daemon started here: lifecycle, labels and
// get-or-create, exec (results, streaming as it happens, timeouts, stdin,
// OOM), background processes, files (binary, streams, archives, batches),
// the agent file tools, and an error class for each kind of bad input.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Readable } from 'node:stream'
import { inspect } from 'node:util'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  Berth,
  BerthError,
  Conflict,
  AlreadyExists,
  DaemonUnreachable,
  DeadlineExceeded,
  InvalidArgument,
  NotFound,
  PermissionDenied,
  Unavailable,
  TooLarge,
  MethodNotAllowed,
  ExecResult,
  errorFor,
  tarOf,
} from '../dist/index.js'
import { startDaemon, sleep } from './daemon.mjs'

let daemon, berth

before(async () => {
  daemon = await startDaemon({ prefix: 'tssdk-' })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
})

const sha = (b) => createHash('sha256').update(b).digest('hex')
const text = (b) => Buffer.from(b).toString('utf8')

test('lifecycle: create, list by labels, stop refuses exec, start, delete', async () => {
  const sb = await berth.create({ labels: { suite: 'ts-sdk' }, memory: 256 << 20, env: { GREETING: 'hi' } })
  try {
    assert.equal(sb.info.state, 'running')
    assert.match(sb.id, /^sb-/)
    assert.equal(sb.info.raw.limits.memory_bytes, 256 << 20)
    assert.ok((await berth.list({ suite: 'ts-sdk' })).some((s) => s.id === sb.id))
    assert.ok((await berth.list({ labels: { suite: 'ts-sdk' } })).some((s) => s.id === sb.id))
    assert.ok((await berth.list({ selector: 'suite=ts-sdk' })).some((s) => s.id === sb.id))
    assert.ok(!(await berth.list({ suite: 'nobody' })).some((s) => s.id === sb.id))
    assert.equal((await sb.exec('echo $GREETING')).stdout, 'hi\n')
    assert.equal((await sb.stop()).state, 'stopped')
    await assert.rejects(sb.exec('true'), (e) => e instanceof Conflict && e.message.includes('stopped') && e.status === 409)
    assert.equal((await sb.start()).state, 'running')
    assert.equal((await sb.exec('echo $HOSTNAME')).stdout.trim(), sb.id)
    assert.equal((await sb.refresh()).state, 'running')
    assert.equal((await berth.get(sb.id)).id, sb.id)
    assert.equal(JSON.parse(JSON.stringify(sb)).id, sb.id)
    assert.equal(inspect(sb), `Sandbox { id: '${sb.id}', state: 'running', ephemeral: true }`)
    assert.equal(inspect(berth), `Berth { url: '${daemon.url}' }`)
  } finally {
    await sb.delete()
  }
  await assert.rejects(berth.get(sb.id), (e) => e instanceof NotFound && e.message.includes(sb.id) && e.code === 'not_found')
})

test('get-or-create is one sandbox per conversation, and runtimes and version answer', async () => {
  const a = await berth.getOrCreate({ thread_id: 'ts-conv-1' })
  try {
    const b = await berth.getOrCreate({ thread_id: 'ts-conv-1' })
    assert.equal(a.id, b.id)
    assert.equal(a.ephemeral, false)
    assert.deepEqual(a.info.labels, { thread_id: 'ts-conv-1' })
  } finally {
    await a.delete()
  }
  const rts = await berth.runtimes()
  assert.equal(rts.filter((r) => r.default).length, 1)
  assert.ok(rts.find((r) => r.name === 'native').available)
  const v = await berth.version()
  assert.equal(v.api, 'v1')
  await assert.rejects(berth.create({ runtime: 'no-such-runtime' }), (e) => e instanceof InvalidArgument && e.message.includes('no-such-runtime'))
})

test('Symbol.asyncDispose deletes an ephemeral sandbox, not a kept one', async () => {
  const sb = await berth.create()
  assert.equal(sb.ephemeral, true)
  await sb[Symbol.asyncDispose]()
  await assert.rejects(berth.get(sb.id), NotFound)
  const kept = await berth.create({ ephemeral: false })
  await kept[Symbol.asyncDispose]()
  assert.equal((await berth.get(kept.id)).id, kept.id)
  await kept.delete()
})

test('exec: results, argv and shell, env, cwd, user, stdin, timeouts, truncation, OOM', async () => {
  const sb = await berth.create({ memory: 64 << 20 })
  try {
    let r = await sb.exec(['sh', '-c', 'echo out; echo err >&2; exit 3'], { env: { X: '1' } })
    assert.ok(r instanceof ExecResult)
    assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.ok], [3, 'out\n', 'err\n', false])
    assert.ok(r.pid > 0 && r.durationMs >= 0)
    r = await sb.exec('echo $X in $(pwd) as $(id -un)', { env: { X: 'x' }, cwd: '/tmp', user: 'root' })
    assert.equal(r.stdout, 'x in /tmp as root\n')
    assert.ok(r.ok)
    assert.equal((await sb.exec('cat', { stdin: 'piped' })).stdout, 'piped')
    const bin = randomBytes(1000)
    r = await sb.exec('cat', { stdin: bin })
    assert.deepEqual(Buffer.from(r.stdoutBytes), bin)
    r = await sb.exec('sleep 10', { timeoutMs: 500 })
    assert.ok(r.timedOut)
    assert.equal(r.signal, 9)
    assert.ok(r.durationMs < 5000)
    r = await sb.exec('head -c 100000 /dev/zero', { maxOutputBytes: 1000 })
    assert.ok(r.stdoutTruncated)
    assert.equal(r.stdoutBytes.length, 1000)
    r = await sb.exec(['no-such-program'])
    assert.equal(r.exitCode, 127)
    assert.ok(r.error.includes('no-such-program'), r.error)
    r = await sb.exec(['python3', '-c', 'b = bytearray(1 << 30)'])
    assert.ok(r.oomKilled)
    assert.equal(r.exitCode, 137)
  } finally {
    await sb.delete()
  }
})

test('execStream yields events as they happen, and stops when the loop breaks', async () => {
  const sb = await berth.create()
  try {
    const events = []
    const at = []
    for await (const ev of sb.execStream('for i in 1 2 3; do echo $i; sleep 0.3; done; echo bad >&2; exit 4')) {
      events.push(ev)
      at.push(Date.now())
    }
    assert.equal(events[0].type, 'start')
    assert.ok(events[0].pid > 0)
    const out = events.filter((e) => e.type === 'stdout')
    assert.equal(text(Buffer.concat(out.map((e) => e.data))), '1\n2\n3\n')
    assert.equal(text(Buffer.concat(events.filter((e) => e.type === 'stderr').map((e) => e.data))), 'bad\n')
    const last = events.at(-1)
    assert.equal(last.type, 'exit')
    assert.equal(last.result.exitCode, 4)
    // The first line came well before the end: streamed, not buffered.
    const first = at[events.indexOf(out[0])]
    assert.ok(at.at(-1) - first >= 500, `first output ${at.at(-1) - first} ms before the exit`)

    // Breaking out closes the stream.
    let n = 0
    for await (const ev of sb.execStream(['sh', '-c', 'while true; do echo tick; sleep 0.1; done'], { timeoutMs: 20000 })) {
      if (ev.type === 'stdout' && ++n >= 2) break
    }
    assert.equal(n, 2)
    // A refused stream throws at the first step.
    const gen = sb.execStream('true', { cwd: 'relative/dir' })
    await assert.rejects(gen.next(), InvalidArgument)
  } finally {
    await sb.delete()
  }
})

test('background processes: start, list, get, wait with a timeout, kill, stdin', async () => {
  const sb = await berth.create()
  try {
    const pid = await sb.startProcess('sleep 30')
    assert.ok((await sb.listProcesses()).some((p) => p.pid === pid))
    const p = await sb.getProcess(pid)
    assert.ok(p.running)
    assert.deepEqual(p.cmd.slice(-1), ['sleep 30'])
    await assert.rejects(sb.waitProcess(pid, { timeoutMs: 200 }), DeadlineExceeded)
    await sb.killProcess(pid)
    const r = await sb.waitProcess(pid, { timeoutMs: 10000 })
    assert.equal(r.signal, 9)
    assert.equal((await sb.getProcess(pid)).running, false)

    const out = await sb.startProcess('echo started; echo e >&2')
    const res = await sb.waitProcess(out)
    assert.equal(res.stdout, 'started\n')
    assert.equal(res.stderr, 'e\n')

    const cat = await sb.startProcess(['cat'], { openStdin: true })
    assert.equal((await sb.getProcess(cat)).openStdin, true)
    await sb.writeStdin(cat, 'one ')
    await sb.writeStdin(cat, new TextEncoder().encode('two'), { close: true })
    assert.equal((await sb.waitProcess(cat, { timeoutMs: 10000 })).stdout, 'one two')
    await assert.rejects(sb.writeStdin(cat, 'more'), Conflict)
    const other = await sb.startProcess(['sleep', '30'])
    await assert.rejects(sb.writeStdin(other, 'x'), (e) => e instanceof Conflict && e.message.includes('stdin'))
    await sb.killProcess(other, 'TERM')
    assert.equal((await sb.waitProcess(other)).signal, 15)
    await assert.rejects(sb.getProcess(99999), (e) => e instanceof NotFound && e.message.includes('99999'))
  } finally {
    await sb.delete()
  }
})

test('files: a 10 MiB binary round trip, text, streams in and out, modes, create-only', async () => {
  const sb = await berth.create()
  try {
    const data = randomBytes(10 << 20)
    const fi = await sb.upload('/home/user/big.bin', data)
    assert.equal(fi.size, data.length)
    assert.equal(fi.owner, 'user')
    assert.equal(sha(await sb.download('/home/user/big.bin')), sha(data))
    assert.equal((await sb.exec('sha256sum /home/user/big.bin')).stdout.split(' ')[0], sha(data))

    // A download as a stream, chunk by chunk.
    const stream = await sb.downloadStream('/home/user/big.bin')
    const h = createHash('sha256')
    let chunks = 0
    for await (const c of stream) {
      h.update(c)
      chunks++
    }
    assert.equal(h.digest('hex'), sha(data))
    assert.ok(chunks > 1)

    // Uploads from a Node Readable, an async generator and a web ReadableStream.
    await sb.upload('/home/user/from-readable.bin', Readable.from([data.subarray(0, 1 << 20), data.subarray(1 << 20, 3 << 20)]))
    assert.equal(sha(await sb.download('/home/user/from-readable.bin')), sha(data.subarray(0, 3 << 20)))
    async function* gen() {
      for (let i = 0; i < 5; i++) {
        await sleep(10)
        yield Buffer.from(`part ${i}\n`)
      }
    }
    await sb.upload('/home/user/gen.txt', gen())
    assert.equal(text(await sb.download('/home/user/gen.txt')), 'part 0\npart 1\npart 2\npart 3\npart 4\n')
    await sb.upload('/home/user/web.txt', new Blob(['from a web stream']).stream())
    assert.equal(text(await sb.download('/home/user/web.txt')), 'from a web stream')

    // Text, a mode, parents made, create-only.
    const t = await sb.upload('/home/user/deep/er/run.sh', '#!/bin/sh\necho ran\n', { mode: 0o755 })
    assert.equal(t.mode & 0o777, 0o755)
    assert.equal((await sb.exec('/home/user/deep/er/run.sh')).stdout, 'ran\n')
    await assert.rejects(sb.upload('/home/user/gen.txt', 'x', { createOnly: true }), AlreadyExists)
    assert.equal((await sb.download('/nonexistent', { user: 'root' }).catch((e) => e)).constructor, NotFound)
  } finally {
    await sb.delete()
  }
})

test('archives: a tar in, a tree out; batches of files with per-file errors', async () => {
  const sb = await berth.create()
  try {
    const tar = tarOf([
      { name: 'proj', type: 'dir' },
      { name: 'proj/a.txt', type: 'file', data: 'alpha\n' },
      { name: 'proj/bin/tool', type: 'file', data: '#!/bin/sh\necho tool\n', mode: 0o755 },
      { name: 'proj/link', type: 'symlink', target: 'a.txt' },
      { name: 'proj/' + 'n'.repeat(150) + '.txt', type: 'file', data: 'long name' },
    ])
    const up = await sb.uploadArchive('/home/user/in', tar)
    assert.ok(up.entries >= 4, JSON.stringify(up))
    assert.equal(text(await sb.download('/home/user/in/proj/link')), 'alpha\n')
    assert.equal((await sb.exec('/home/user/in/proj/bin/tool')).stdout, 'tool\n')
    assert.equal(text(await sb.download('/home/user/in/proj/' + 'n'.repeat(150) + '.txt')), 'long name')

    // A tar from the system's tar, streamed in from a file.
    const dir = mkdtempSync(join(tmpdir(), 'tssdk-'))
    try {
      mkdirSync(join(dir, 'src'))
      writeFileSync(join(dir, 'src', 'x.txt'), 'x\n')
      const sysTar = execFileSync('tar', ['-C', dir, '-cf', '-', 'src'])
      await sb.uploadArchive('/home/user/sys', Readable.from([sysTar]))
      assert.equal(text(await sb.download('/home/user/sys/src/x.txt')), 'x\n')
      // And a tree out, read by the system's tar.
      const out = await sb.downloadArchive('/home/user/in/proj')
      writeFileSync(join(dir, 'out.tar'), out)
      const names = execFileSync('tar', ['-tf', join(dir, 'out.tar')]).toString().split('\n').filter(Boolean)
      assert.ok(names.includes('proj/a.txt'), names.join(' '))
      assert.ok(names.includes('proj/bin/tool'), names.join(' '))
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }

    const ups = await sb.uploadFiles([
      ['/home/user/b/one.txt', 'one'],
      { path: '/home/user/b/two.bin', content: new Uint8Array([0, 1, 2, 255]) },
      ['/etc/no.txt', 'no'],
      ['rel.txt', 'relative to the workdir'],
      ['', 'x'],
    ])
    assert.deepEqual(
      ups.map((u) => u.error?.class ?? null),
      [null, null, 'permission_denied', null, 'invalid_argument'],
    )
    assert.equal(ups[4].error.reason, 'invalid_path')
    assert.equal(text(await sb.download('/home/user/rel.txt')), 'relative to the workdir')
    const downs = await sb.downloadFiles(['/home/user/b/one.txt', '/home/user/b/two.bin', '/home/user/missing', '/home'])
    assert.equal(text(downs[0].content), 'one')
    assert.deepEqual([...downs[1].content], [0, 1, 2, 255])
    assert.equal(downs[2].error.class, 'not_found')
    assert.equal(downs[3].error.reason, 'is_directory')
  } finally {
    await sb.delete()
  }
})

test('agent file tools: write, read, edit, ls, glob, grep, stat, exists, mkdir, move, remove', async () => {
  const sb = await berth.create()
  try {
    await sb.write('/home/user/p/a.py', 'x = 1\ny = 2\n')
    await sb.write('/home/user/p/sub/b.py', 'def f():\n    return 1\n')
    await sb.write('/home/user/p/c.txt', 'Y = 3\n')
    assert.equal(await sb.edit('/home/user/p/a.py', 'x = 1', 'x = 10'), 1)
    await assert.rejects(sb.edit('/home/user/p/a.py', 'nowhere', 'z'), (e) => e instanceof InvalidArgument && e.message.includes('not found'))
    await sb.write('/home/user/p/dup.txt', 'a a a\n')
    await assert.rejects(sb.edit('/home/user/p/dup.txt', 'a', 'b'), (e) => e instanceof BerthError && e.message.includes('3'))
    assert.equal(await sb.edit('/home/user/p/dup.txt', 'a', 'b', { replaceAll: true }), 3)

    const page = await sb.read('/home/user/p/a.py')
    assert.deepEqual(page.lines.map((l) => l.text), ['x = 10', 'y = 2'])
    assert.deepEqual(page.lines.map((l) => l.number), [1, 2])
    assert.equal(page.total_lines, 2)
    await sb.write('/home/user/long.txt', Array.from({ length: 50 }, (_, i) => `line ${i + 1}`).join('\n') + '\n')
    const p2 = await sb.read('/home/user/long.txt', { offset: 10, limit: 5 })
    assert.deepEqual(p2.lines.map((l) => l.number), [11, 12, 13, 14, 15])
    assert.equal(p2.next_offset, 15)

    assert.deepEqual((await sb.grep('y =', '/home/user/p')).matches.map((m) => [m.path, m.line]), [['/home/user/p/a.py', 2]])
    const ci = await sb.grep('y =', '/home/user/p', { ignoreCase: true, glob: '*.txt' })
    assert.deepEqual(ci.matches.map((m) => m.path), ['/home/user/p/c.txt'])
    const rx = await sb.grep('^def \\w+', '/home/user/p', { regex: true })
    assert.deepEqual(rx.matches.map((m) => m.text), ['def f():'])
    assert.deepEqual((await sb.glob('**/*.py', '/home/user')).matches.map((m) => m.path), ['/home/user/p/a.py', '/home/user/p/sub/b.py'])

    const ls = await sb.ls('/home/user/p')
    assert.deepEqual(ls.entries.map((e) => e.name).sort(), ['a.py', 'c.txt', 'dup.txt', 'sub'])
    assert.equal(ls.entries.find((e) => e.name === 'sub').type, 'dir')
    const st = await sb.stat('/home/user/p/a.py')
    assert.equal(st.type, 'file')
    assert.equal(st.size, 13)
    assert.equal(await sb.exists('/home/user/p/a.py'), true)
    assert.equal(await sb.exists('/home/user/p/none'), false)
    assert.equal((await sb.mkdir('/home/user/q/r/s')).type, 'dir')
    await sb.move('/home/user/p/c.txt', '/home/user/q/c.txt')
    assert.equal(await sb.exists('/home/user/p/c.txt'), false)
    await assert.rejects(sb.remove('/home/user/q'), (e) => e instanceof BerthError)
    await sb.remove('/home/user/q', { recursive: true })
    assert.equal(await sb.exists('/home/user/q'), false)
    await sb.remove('/home/user/q', { force: true })
  } finally {
    await sb.delete()
  }
})

test('error classes: each kind of bad input gets its class, the daemon message verbatim', async () => {
  const sb = await berth.create()
  try {
    await assert.rejects(sb.download('/nope'), (e) => e instanceof NotFound && e.message.includes('/nope') && e.status === 404)
    await assert.rejects(sb.download('/home'), (e) => e instanceof InvalidArgument && e.reason === 'is_directory' && e.status === 400)
    await assert.rejects(sb.write('/etc/x', 'no'), (e) => e instanceof PermissionDenied && e.status === 403 && e.code === 'permission_denied')
    await assert.rejects(sb.download(''), (e) => e instanceof InvalidArgument && e.reason === 'invalid_path' && e.message.includes('path'))
    await assert.rejects(sb.download('relative'), (e) => e instanceof NotFound && e.message.includes('/home/user/relative'))
    await assert.rejects(berth.create({ memory: -1 }), (e) => e instanceof InvalidArgument && /memory/.test(e.message))
    await assert.rejects(berth.create({ idleTimeoutMs: -5 }), (e) => e instanceof InvalidArgument && e.message.includes('idleTimeoutMs'))
    await assert.rejects(berth.get('sb-nosuchsandbox'), (e) => e instanceof NotFound && e.message.includes('sb-nosuchsandbox'))
    await assert.rejects(berth.delete('sb-nosuchsandbox'), NotFound)
    await assert.rejects(sb.exec([]), InvalidArgument)
    await assert.rejects(sb.killProcess(1, 'NOSUCHSIGNAL'), InvalidArgument)
    // The daemon's error object is kept whole.
    const err = await sb.download('/nope').catch((e) => e)
    assert.equal(err.details.class, 'not_found')
    assert.equal(err.details.message, err.message)
    assert.equal(err.name, 'NotFound')
    assert.ok(err instanceof Error)
    // A body over a route's bound, a method a route does not serve.
    await assert.rejects(
      sb.uploadFiles([['/home/user/huge', new Uint8Array(70 << 20)]]),
      (e) => e instanceof TooLarge && e.status === 413,
    )
    await assert.rejects(
      berth.transport.json({ method: 'PUT', path: '/v1/version' }),
      (e) => e instanceof MethodNotAllowed && e.status === 405,
    )
    // errorFor maps any answer: a class, or a status without a body.
    assert.ok(errorFor(404, { error: { class: 'not_found', message: 'gone' } }) instanceof NotFound)
    assert.ok(errorFor(503, '<html>') instanceof Unavailable)
    assert.ok(errorFor(409, { error: { class: 'already_exists', message: 'x' } }) instanceof AlreadyExists)
  } finally {
    await sb.delete()
  }
})

test('a daemon that is down: DaemonUnreachable naming the URL, for calls, streams and terminals', async () => {
  const down = new Berth({ url: 'http://127.0.0.1:9', timeoutMs: 2000 })
  await assert.rejects(down.list(), (e) => e instanceof DaemonUnreachable && e instanceof Unavailable && e.message.includes('http://127.0.0.1:9'))
  const sock = new Berth({ url: 'unix:///var/tmp/berth-test/no-such.sock' })
  await assert.rejects(sock.version(), (e) => e instanceof DaemonUnreachable && e.message.includes('unix:///var/tmp/berth-test/no-such.sock'))
  // A handle made with a reachable client, then used through one that is not.
  const sb = await berth.create()
  try {
    const { Sandbox } = await import('../dist/index.js')
    const ghost = new Sandbox(down, sb.info)
    await assert.rejects(ghost.exec('true'), DaemonUnreachable)
    await assert.rejects(ghost.execStream('true').next(), DaemonUnreachable)
    await assert.rejects(ghost.openTerminal(), (e) => e instanceof DaemonUnreachable && e.message.includes('http://127.0.0.1:9'))
  } finally {
    await sb.delete()
  }
  const prev = process.env.BERTH_URL
  process.env.BERTH_URL = 'http://127.0.0.1:9'
  try {
    const env = new Berth()
    assert.equal(env.url, 'http://127.0.0.1:9')
  } finally {
    if (prev === undefined) delete process.env.BERTH_URL
    else process.env.BERTH_URL = prev
  }
})

test('the unix socket: a client at unix:///path does everything a TCP one does', async () => {
  const local = new Berth({ url: daemon.socketUrl })
  try {
    const sb = await local.create()
    try {
      assert.equal((await sb.exec('echo via-socket')).stdout, 'via-socket\n')
      await sb.upload('/home/user/s.txt', 'sock')
      assert.equal(text(await sb.download('/home/user/s.txt')), 'sock')
      const chunks = []
      for await (const ev of sb.execStream(['printf', 'abc'])) if (ev.type === 'stdout') chunks.push(ev.data)
      assert.equal(text(Buffer.concat(chunks)), 'abc')
      await assert.rejects(sb.url(8000), (e) => e instanceof InvalidArgument && e.message.includes('unix socket'))
    } finally {
      await sb.delete()
    }
  } finally {
    local.close()
  }
})
