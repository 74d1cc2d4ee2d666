// The documentation's code (test/usage.ts) type-checks against the built
// package's declarations, imported by the package's name.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { join, resolve } from 'node:path'
import { promisify } from 'node:util'

const pkg = resolve(import.meta.dirname, '..')

test('docs/typescript.md code compiles against dist/*.d.ts', async () => {
  const tsc = join(pkg, 'node_modules', '.bin', 'tsc')
  const res = await promisify(execFile)(tsc, ['-p', join(pkg, 'test', 'tsconfig.json')], { cwd: pkg }).catch((e) => e)
  assert.equal(res.code ?? 0, 0, `${res.stdout}${res.stderr}`)
})
