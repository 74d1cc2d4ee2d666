// E2B's own JavaScript SDK (the npm package e2b), unchanged, against berth:
// a real daemon started here, the SDK pointed at it by E2B_API_URL and
// E2B_SANDBOX_URL, and E2B_API_KEY set to a berth API key (the admin key the
// daemon writes to <state>/admin.key on its first start), as a real E2B user
// sets theirs. Run by `make test` with Node's test runner.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, mkdirSync, chmodSync, rmSync, openSync, readFileSync } from 'node:fs'
import { createServer, request } from 'node:http'
import { join, resolve } from 'node:path'
import { randomBytes, createHash } from 'node:crypto'

const repo = resolve(import.meta.dirname, '../../../..')
let daemon, state, url

function freePort() {
  return new Promise((ok) => {
    const s = createServer()
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => ok(port))
    })
  })
}

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))

before(async () => {
  const binary = process.env.BERTH_BINARY || join(repo, 'bin', 'berth')
  const root = process.env.BERTH_TEST_STATE_ROOT || '/var/tmp/berth-test'
  mkdirSync(root, { recursive: true })
  state = mkdtempSync(join(root, 'e2bjs-'))
  chmodSync(state, 0o755) // sandboxes (unprivileged uids) must traverse it
  const port = await freePort()
  url = `http://127.0.0.1:${port}`
  const log = openSync(join(state, 'daemon.log'), 'w')
  daemon = spawn(binary, ['serve', '--listen', `127.0.0.1:${port}`, '--state-dir', state, '--warm-pool', '2'], {
    stdio: ['ignore', log, log],
  })
  const deadline = Date.now() + 30000
  for (;;) {
    try {
      const res = await fetch(url + '/healthz')
      if (res.ok) break
    } catch {}
    if (daemon.exitCode !== null || Date.now() > deadline) {
      throw new Error('berth serve did not start: ' + readFileSync(join(state, 'daemon.log'), 'utf8').slice(-2000))
    }
    await sleep(50)
  }
  process.env.E2B_API_URL = url
  process.env.E2B_SANDBOX_URL = url
  // The daemon writes its first admin key before it answers /healthz.
  const key = readFileSync(join(state, 'admin.key'), 'utf8').trim()
  if (!key) throw new Error(`berth serve wrote no admin key to ${state}/admin.key`)
  process.env.E2B_API_KEY = key
})

after(async () => {
  if (daemon) {
    daemon.kill('SIGTERM')
    await new Promise((ok) => (daemon.exitCode !== null ? ok() : daemon.once('exit', ok)))
  }
  if (state) rmSync(state, { recursive: true, force: true })
})

// The SDK reads E2B_* when it makes a connection's configuration (at each
// create or connect), after before() set them.
const e2b = () => import('e2b')

test('commands: foreground, streaming, exit codes, background, stdin, kill', async () => {
  const { Sandbox, CommandExitError } = await e2b()
  const sbx = await Sandbox.create({ metadata: { suite: 'node' }, envs: { GREETING: 'hi from node' }, timeoutMs: 300_000 })
  try {
    const out = []
    const r = await sbx.commands.run('echo $GREETING; echo err >&2', { onStdout: (d) => out.push(d) })
    assert.equal(r.stdout, 'hi from node\n')
    assert.equal(r.stderr, 'err\n')
    assert.equal(out.join(''), r.stdout)
    await assert.rejects(sbx.commands.run('exit 5'), (e) => e instanceof CommandExitError && e.exitCode === 5)

    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'piped\n')
    await sbx.commands.closeStdin(h.pid)
    assert.equal((await h.wait()).stdout, 'piped\n')

    const bg = await sbx.commands.run('sleep 600', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
    assert.equal(await sbx.commands.kill(bg.pid), true)
    await assert.rejects(bg.wait(), CommandExitError)

    await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1000 }))
  } finally {
    await sbx.kill()
  }
})

test('pty: create, input, resize, kill', async () => {
  const { Sandbox } = await e2b()
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    const chunks = []
    const t = await sbx.pty.create({ rows: 24, cols: 80, onData: (d) => chunks.push(Buffer.from(d)) })
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode('stty size; touch /tmp/answered\n'))
    // Resize once the shell has answered at the first size.
    for (let i = 0; i < 200 && !(await sbx.files.exists('/tmp/answered')); i++) await sleep(50)
    await sbx.pty.resize(t.pid, { rows: 40, cols: 120 })
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode('stty size; exit\n'))
    await t.wait()
    const text = Buffer.concat(chunks).toString()
    assert.match(text, /24 80/)
    assert.match(text, /40 120/)
    const t2 = await sbx.pty.create({ rows: 10, cols: 40, onData: () => {} })
    assert.equal(await sbx.pty.kill(t2.pid), true)
  } finally {
    await sbx.kill()
  }
})

test('files: write, read, list, exists, rename, makeDir, remove, watchDir, a large upload', async () => {
  const { Sandbox, NotFoundError } = await e2b()
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    await sbx.files.write('/home/user/a/hello.txt', 'hello')
    assert.equal(await sbx.files.read('a/hello.txt'), 'hello')
    assert.equal(await sbx.files.exists('/home/user/a/hello.txt'), true)
    assert.deepEqual((await sbx.files.list('/home/user/a')).map((e) => e.name), ['hello.txt'])
    assert.equal(await sbx.files.makeDir('/home/user/a/b'), true)
    await sbx.files.rename('/home/user/a/hello.txt', '/home/user/a/b/moved.txt')
    assert.equal(await sbx.files.read('/home/user/a/b/moved.txt'), 'hello')
    await sbx.files.remove('/home/user/a')
    await assert.rejects(sbx.files.read('/home/user/a/b/moved.txt'), NotFoundError)

    await sbx.files.makeDir('/home/user/w')
    const events = []
    const w = await sbx.files.watchDir('/home/user/w', (ev) => events.push(ev))
    await sbx.files.write('/home/user/w/new.txt', 'x')
    for (let i = 0; i < 100 && !events.some((e) => e.name === 'new.txt'); i++) await sleep(100)
    await w.stop()
    assert.ok(events.some((e) => e.name === 'new.txt'), JSON.stringify(events))

    const blob = randomBytes(32 << 20)
    await sbx.files.write('/home/user/big.bin', blob)
    const sum = await sbx.commands.run("sha256sum /home/user/big.bin | cut -d' ' -f1")
    assert.equal(sum.stdout.trim(), createHash('sha256').update(blob).digest('hex'))
    const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
    assert.equal(createHash('sha256').update(back).digest('hex'), createHash('sha256').update(blob).digest('hex'))
  } finally {
    await sbx.kill()
  }
})

test('getHost reaches a server inside; setTimeout; list by metadata; connect; kill', async () => {
  const { Sandbox } = await e2b()
  const sbx = await Sandbox.create({ metadata: { suite: 'node-host' }, timeoutMs: 120_000 })
  try {
    await sbx.files.write('/home/user/site/index.html', 'node saw this')
    await sbx.commands.run('cd /home/user/site && python3 -m http.server 8000', { background: true })
    const host = sbx.getHost(8000)
    assert.ok(host.startsWith(`8000-${sbx.sandboxId}.`), host)
    const port = Number(host.split(':').pop())
    let body = ''
    for (let i = 0; i < 75; i++) {
      body = await new Promise((ok) => {
        const req = request({ host: '127.0.0.1', port, path: '/index.html', headers: { Host: host } }, (res) => {
          let b = ''
          res.on('data', (c) => (b += c))
          res.on('end', () => ok(res.statusCode === 200 ? b : ''))
        })
        req.on('error', () => ok(''))
        req.end()
      })
      if (body) break
      await sleep(200)
    }
    assert.equal(body, 'node saw this')

    await sbx.setTimeout(600_000)
    const page = await Sandbox.list({ query: { metadata: { suite: 'node-host' } } }).nextItems()
    assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId])
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
  } finally {
    assert.equal(await sbx.kill(), true)
  }
  const { Sandbox: S } = await e2b()
  assert.deepEqual(await S.list({ query: { metadata: { suite: 'node-host' } } }).nextItems(), [])
})

test('createSnapshot, listSnapshots, create from a snapshot, deleteSnapshot; fork', async () => {
  const { Sandbox } = await e2b()
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    await sbx.files.write('/home/user/state.txt', 'before')
    const snap = await sbx.createSnapshot({ name: 'node-snap' })
    assert.equal(snap.snapshotId, 'snapshot:node-snap')
    assert.deepEqual(snap.names, [snap.snapshotId])
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])
    const made = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
    try {
      assert.equal(await made.files.read('/home/user/state.txt'), 'before')
    } finally {
      await made.kill()
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)

    const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
    try {
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(f instanceof Sandbox, String(f))
        assert.equal(await f.files.read('/home/user/state.txt'), 'before')
        const info = await f.getInfo()
        assert.equal(info.endAt - info.startedAt, 60_000)
      }
    } finally {
      for (const f of forks) if (f instanceof Sandbox) await f.kill()
    }
  } finally {
    await sbx.kill()
  }
})

test('API keys: a wrong key is AuthenticationError; a tenant key sees its own sandboxes only', async () => {
  const { Sandbox, AuthenticationError, NotFoundError } = await e2b()
  await assert.rejects(
    Sandbox.create({ timeoutMs: 60_000, apiKey: 'e2b_0123456789abcdef0123456789abcdef01234567' }),
    (e) => e instanceof AuthenticationError,
  )
  await assert.rejects(
    Sandbox.list({ apiKey: 'berth_' + '0'.repeat(12) + '_' + '0'.repeat(64) }).nextItems(),
    (e) => e instanceof AuthenticationError,
  )
  // E2B's API makes no keys: this one is made through berth's (POST /v1/keys) with the admin key.
  const res = await fetch(url + '/v1/keys', {
    method: 'POST',
    headers: { Authorization: 'Bearer ' + process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ tenant: 't-e2bjs', name: `e2bjs-test-${process.pid}` }),
  })
  assert.equal(res.status, 201)
  const tenantKey = (await res.json()).key
  const mine = await Sandbox.create({ metadata: { suite: 'node-keys' }, timeoutMs: 60_000, apiKey: tenantKey })
  const theirs = await Sandbox.create({ metadata: { suite: 'node-keys' }, timeoutMs: 60_000 })
  try {
    assert.equal((await mine.commands.run('echo mine')).stdout, 'mine\n')
    const query = { metadata: { suite: 'node-keys' } }
    assert.deepEqual((await Sandbox.list({ query, apiKey: tenantKey }).nextItems()).map((s) => s.sandboxId), [mine.sandboxId])
    assert.deepEqual(
      new Set((await Sandbox.list({ query }).nextItems()).map((s) => s.sandboxId)),
      new Set([mine.sandboxId, theirs.sandboxId]),
    )
    await assert.rejects(Sandbox.getInfo(theirs.sandboxId, { apiKey: tenantKey }), NotFoundError)
    assert.equal(await Sandbox.kill(theirs.sandboxId, { apiKey: tenantKey }), false)
    assert.equal(await theirs.isRunning(), true)
  } finally {
    await theirs.kill()
    await mine.kill()
  }
})
