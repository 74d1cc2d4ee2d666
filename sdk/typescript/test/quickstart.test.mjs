// examples/typescript/quickstart.mjs, run as a user runs it: from a
// directory whose node_modules/@berthsh/berth is this package, against a
// daemon started here (BERTH_URL).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { promisify } from 'node:util'
import { Berth } from '../dist/index.js'
import { repo, startDaemon } from './daemon.mjs'

let daemon, dir

before(async () => {
  daemon = await startDaemon({ prefix: 'tsquick-' })
  dir = mkdtempSync(join(tmpdir(), 'berth-quickstart-'))
  mkdirSync(join(dir, 'node_modules', '@berthsh'), { recursive: true })
  symlinkSync(resolve(import.meta.dirname, '..'), join(dir, 'node_modules', '@berthsh', 'berth'))
  copyFileSync(join(repo, 'examples', 'typescript', 'quickstart.mjs'), join(dir, 'quickstart.mjs'))
})

after(async () => {
  if (dir) rmSync(dir, { recursive: true, force: true })
  await daemon?.stop()
})

test('the quickstart runs against $BERTH_URL and leaves no sandbox behind', async () => {
  const { stdout } = await promisify(execFile)('node', ['quickstart.mjs'], {
    cwd: dir,
    env: { ...process.env, BERTH_URL: daemon.url },
    timeout: 60000,
  })
  const lines = stdout.split('\n')
  assert.match(lines[0], /^0 hello from sb-[0-9a-z]+$/)
  assert.match(lines[1], /^Python 3\./)
  assert.ok(stdout.includes('step 1\nstep 2\nstep 3\nexited with 0'), stdout)
  assert.ok(stdout.includes('python says 45'), stdout)
  assert.ok(stdout.includes('downloaded 22 bytes'), stdout)
  assert.ok(stdout.includes('as expected: not_found'), stdout)
  const berth = new Berth({ url: daemon.url })
  assert.deepEqual(await berth.list({ example: 'quickstart' }), [])
  berth.close()
})
