// A sandbox that works against its host: the SDK and the deepagents backend
// hold what a sandbox controls (the size of a file, a path that is a
// symlink) to bounds of their own, against a real daemon. Plus the
// backend's `once` calls (execute, edit, delete, fork) never made twice
// when the sandbox stops under parallel calls, checked on a stand-in
// sandbox because the daemon's timing cannot be made deterministic.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Berth, Conflict, TooLarge } from '../dist/index.js'
import { BerthSandbox } from '../dist/deepagents.js'
import { startDaemon } from './daemon.mjs'

const GiB = 1 << 30
const CAP = 10 * 1024 * 1024 // deepagents' bound on a binary file read

let daemon, client

before(async () => {
  daemon = await startDaemon({ prefix: 'tshost-' })
  client = new Berth({ url: daemon.url })
})

after(async () => {
  if (client) for (const s of await client.list()) await client.delete(s.id).catch(() => {})
  client?.close()
  await daemon?.stop()
})

// Runs fn while sampling the process's RSS; resolves to [its result or error, the peak RSS].
async function peakRss(fn) {
  let peak = process.memoryUsage().rss
  const t = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5)
  try {
    const out = await fn().then((v) => ({ v }), (e) => ({ e }))
    return [out, Math.max(peak, process.memoryUsage().rss)]
  } finally {
    clearInterval(t)
  }
}

async function sh(sb, cmd, opts = {}) {
  const r = await sb.exec(cmd, opts)
  assert.equal(r.exitCode, 0, `${cmd}: ${r.stdout}${r.stderr}`)
  return r.stdout
}

describe('a file the sandbox makes huge', () => {
  let backend, sb
  before(async () => {
    backend = await BerthSandbox.create({ client, logger: null })
    sb = backend.sandbox
    // Sparse: 2 GiB to read, no disk.
    await sh(sb, 'cd /home/user && truncate -s 2G big.png big.txt && printf x > small.png && printf 0123456789 > ten.bin')
  })

  it('download with maxBytes stops past the bound with TooLarge naming the path and the bound, buffering no more', async () => {
    const base = process.memoryUsage().rss
    const [out, peak] = await peakRss(() => sb.download('/home/user/big.png', { maxBytes: CAP }))
    assert.ok(out.e instanceof TooLarge, String(out.e))
    assert.match(out.e.message, /\/home\/user\/big\.png/)
    assert.match(out.e.message, /10485760 bytes/)
    assert.deepEqual(out.e.paths, ['/home/user/big.png'])
    assert.ok(peak - base < 256 * 1024 * 1024, `RSS grew by ${peak - base} bytes`)
    // A file at the bound is read whole; one byte over is not.
    assert.equal(Buffer.from(await sb.download('/home/user/ten.bin', { maxBytes: 10 })).toString(), '0123456789')
    await assert.rejects(sb.download('/home/user/ten.bin', { maxBytes: 9 }), (e) => e instanceof TooLarge && e.message.includes('9 bytes'))
    await assert.rejects(sb.download('/home/user/ten.bin', { maxBytes: -1 }), (e) => e.code === 'invalid_argument' && e.message.includes('maxBytes'))
    // The connection is usable after an abandoned download.
    assert.equal((await sb.download('/home/user/small.png')).length, 1)
  })

  it('read of a binary type swapped for a huge file after its stat answers an error, not 2 GiB', async () => {
    // The sandbox's move, made deterministic: the stat sees 1 byte, the
    // download that follows finds 2 GiB.
    const stat = sb.stat
    sb.stat = async (path, opts) => {
      const st = await stat.call(sb, path, opts)
      delete sb.stat
      await sh(sb, 'cd /home/user && cp --sparse=always big.png swap.png.new && mv swap.png.new swap.png')
      return st
    }
    await sh(sb, 'cd /home/user && printf y > swap.png')
    const base = process.memoryUsage().rss
    const [out, peak] = await peakRss(() => backend.read('/home/user/swap.png'))
    delete sb.stat
    assert.equal(out.e, undefined, String(out.e))
    assert.equal(out.v.content, undefined)
    assert.match(out.v.error, /swap\.png' is too large to read \(exceeds 10MB limit for binary files\)/)
    assert.ok(peak - base < 256 * 1024 * 1024, `RSS grew by ${peak - base} bytes`)
    assert.ok(peak < GiB, `RSS reached ${peak} bytes`)
    // A small one still reads.
    const small = await backend.read('/home/user/small.png')
    assert.equal(small.mimeType, 'image/png')
    assert.equal(Buffer.from(small.content).toString(), 'x')
  })

  it('readRaw of a huge file, binary or text, answers an error and buffers no more than its bound', async () => {
    for (const path of ['/home/user/big.png', '/home/user/big.txt']) {
      const base = process.memoryUsage().rss
      const [out, peak] = await peakRss(() => backend.readRaw(path))
      assert.equal(out.e, undefined, String(out.e))
      assert.equal(out.v.data, undefined)
      assert.match(out.v.error, new RegExp(`'${path}' is too large to read \\(exceeds 10MB limit\\b`))
      assert.ok(peak - base < 256 * 1024 * 1024, `${path}: RSS grew by ${peak - base} bytes`)
      assert.ok(peak < GiB, `${path}: RSS reached ${peak} bytes`)
    }
    const raw = await backend.readRaw('/home/user/ten.bin')
    assert.equal(raw.data.content, '0123456789')
  })
})

describe('deepagents’ directories', () => {
  it('are not made through a symlink: a write there fails saying so, and /etc keeps its owner', async () => {
    const backend = await BerthSandbox.create({ client, logger: null })
    const sb = backend.sandbox
    await sh(sb, 'ln -s /etc /large_tool_results', { user: 'root' })
    const r = await backend.write('/large_tool_results/x.txt', 'hi')
    assert.match(r.error ?? '', /^Failed to write to \/large_tool_results\/x\.txt: .*\/large_tool_results is a symlink/)
    assert.equal((await sh(sb, 'stat -c %U /etc')).trim(), 'root')
    assert.equal((await sb.exec('test -e /etc/x.txt')).exitCode, 1)
    // The other directory was not made either (nothing is done when one is refused).
    assert.equal((await sb.exec('test -e /conversation_history')).exitCode, 1)
    // Once the symlink is gone the directories are made, owned by the sandbox's user.
    await sh(sb, 'rm /large_tool_results', { user: 'root' })
    const ok = await backend.write('/large_tool_results/x.txt', 'hi')
    assert.equal(ok.error, undefined, ok.error)
    assert.equal((await sh(sb, 'stat -c %U /large_tool_results /conversation_history')).trim(), 'user\nuser')
    await backend.close()
  })
})

describe('parallel calls when the sandbox stops', () => {
  // A stand-in for a Sandbox (the backend uses only these members): the
  // daemon cannot be made to answer "stopping" to one call exactly while
  // another starts the sandbox, so the race is staged here.
  function stub() {
    let release
    const started = new Promise((ok) => (release = ok))
    const s = {
      id: 'sb-stub',
      info: { id: 'sb-stub', state: 'stopped', raw: { user: 'user' } },
      execs: 0,
      starts: 0,
      release,
      async start() {
        s.starts++
        await started
        s.info = { ...s.info, state: 'running' }
        return s.info
      },
      async refresh() {
        return s.info
      },
      async stat() {
        if (s.info.state !== 'running') throw new Conflict('sandbox sb-stub is stopped', { reason: 'sandbox_stopped' })
        return { path: '/f', type: 'file', size: 1, modified_at: '' }
      },
      async exec() {
        s.execs++
        // The sandbox was stopping while the command ran: no reason.
        if (s.execs === 1) throw new Conflict('sandbox sb-stub was stopping while the call ran')
        return { stdout: 'ran\n', stderr: '', exitCode: 0, timedOut: false, oomKilled: false, stdoutTruncated: false, stderrTruncated: false }
      },
    }
    return s
  }

  it('execute that meets a start in progress answers that it may not have finished, and is not run again', async () => {
    const s = stub()
    const backend = new BerthSandbox({ sandbox: s, logger: null })
    // One call finds the sandbox stopped and starts it...
    const reading = backend.edit('/f', '', 'x')
    await new Promise((ok) => setImmediate(ok))
    assert.equal(s.starts, 1)
    // ...while execute, in parallel, is told the sandbox was stopping under it.
    const executing = backend.execute('make')
    await new Promise((ok) => setImmediate(ok))
    s.release()
    const r = await executing
    assert.equal(s.execs, 1, 'execute ran its command twice')
    assert.equal(r.exitCode, null)
    assert.match(r.output, /may not have finished/)
    await reading
    assert.equal(s.starts, 1)
    // A later execute runs as usual.
    assert.equal((await backend.execute('true')).output, 'ran\n')
  })
})
