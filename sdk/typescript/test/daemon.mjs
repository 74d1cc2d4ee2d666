// A real `berth serve` for a test file: on a free loopback port, as root,
// with a state directory of its own under /var/tmp/berth-test (chmod 755:
// sandboxes run as unprivileged uids and must traverse it). The binary is
// $BERTH_BINARY, else the repository's bin/berth. Stop it with stop().
// Its TCP API wants an API key: the admin key it writes to <state>/admin.key
// on its first start goes into process.env.BERTH_API_KEY, so that every
// client the test file makes (the SDK's default) sends it, as a user's would.
import { execFileSync, spawn } from 'node:child_process'
import { chmodSync, existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { join, resolve } from 'node:path'

export const repo = resolve(import.meta.dirname, '../../..')

export function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer()
    s.on('error', fail)
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => ok(port))
    })
  })
}

export const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))

/** Starts a daemon (args are more flags of berth serve); resolves to
 * { url, socketUrl, state, adminKey, stop, logPath }. */
export async function startDaemon({ prefix = 'tssdk-', warmPool = 2, args: extra = [] } = {}) {
  const binary = process.env.BERTH_BINARY || join(repo, 'bin', 'berth')
  if (!existsSync(binary)) throw new Error(`no berth binary at ${binary}: run make build (or set BERTH_BINARY)`)
  const root = process.env.BERTH_TEST_STATE_ROOT || '/var/tmp/berth-test'
  mkdirSync(root, { recursive: true })
  const state = mkdtempSync(join(root, prefix))
  chmodSync(state, 0o755)
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logPath = join(state, 'daemon.log')
  const log = openSync(logPath, 'w')
  const args = ['serve', '--listen', `127.0.0.1:${port}`, '--state-dir', state, '--warm-pool', String(warmPool)]
  if (process.env.BERTH_TEST_RUNTIME) args.push('--default-runtime', process.env.BERTH_TEST_RUNTIME)
  if (process.env.BERTH_RUNSC) args.push('--runsc', process.env.BERTH_RUNSC)
  args.push(...extra)
  const proc = spawn(binary, args, { stdio: ['ignore', log, log] })
  closeSync(log)
  // A test runner that dies (a timeout's signal) takes its daemon along,
  // which then stops its sandboxes as at any shutdown.
  const orphaned = () => proc.exitCode === null && proc.kill('SIGTERM')
  process.once('exit', orphaned)
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.once(sig, () => {
      orphaned()
      process.exit(128 + (sig === 'SIGINT' ? 2 : 15))
    })
  }
  const deadline = Date.now() + 30000
  for (;;) {
    try {
      const res = await fetch(url + '/healthz')
      if (res.ok) break
    } catch {}
    if (proc.exitCode !== null || Date.now() > deadline) {
      proc.kill('SIGKILL')
      const tail = readFileSync(logPath, 'utf8').slice(-2000)
      removeState(state)
      throw new Error('berth serve did not start: ' + tail)
    }
    await sleep(50)
  }
  // The daemon writes the key before it answers /healthz.
  const adminKey = readFileSync(join(state, 'admin.key'), 'utf8').trim()
  if (!adminKey) {
    proc.kill('SIGKILL')
    removeState(state)
    throw new Error(`berth serve wrote no admin key to ${state}/admin.key`)
  }
  process.env.BERTH_API_KEY = adminKey
  const stop = async () => {
    if (proc.exitCode === null) {
      const exited = new Promise((ok) => proc.once('exit', ok))
      proc.kill('SIGTERM')
      const t = setTimeout(() => proc.kill('SIGKILL'), 30000)
      await exited
      clearTimeout(t)
    }
    removeState(state)
  }
  return { url, socketUrl: 'unix://' + join(state, 'berth.sock'), state, adminKey, stop, logPath }
}

/** Removes a state directory, first detaching what the daemon left mounted
 * in it (gvisor's network namespace files stay bound after a stop). */
function removeState(state) {
  try {
    rmSync(state, { recursive: true, force: true })
    return
  } catch (e) {
    if (e.code !== 'EBUSY') throw e
  }
  const mounts = readFileSync('/proc/self/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[1])
    .filter((m) => m && (m === state || m.startsWith(state + '/')))
    .sort((a, b) => b.length - a.length)
  for (const m of mounts) execFileSync('umount', ['-l', m])
  rmSync(state, { recursive: true, force: true })
}
