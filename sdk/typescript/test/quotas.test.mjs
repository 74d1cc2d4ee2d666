// Tenants' quotas and usage against a daemon started here: the operator's
// quota bounds what a tenant's key may create, a tenant reads its own usage
// only and may not set its quota, and bad arguments are refused before any
// request.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Berth, DaemonUnreachable, InvalidArgument, PermissionDenied, ResourceExhausted } from '../dist/index.js'
import { freePort, startDaemon } from './daemon.mjs'

const TENANT = 'q-a'
const NO_QUOTA = { sandboxes: 0, cpus: 0, memory_bytes: 0, disk_bytes: 0, snapshot_bytes: 0 }

let daemon, admin
const made = []

before(async () => {
  daemon = await startDaemon({ prefix: 'tsquotas-' })
  admin = new Berth({ url: daemon.url }) // $BERTH_API_KEY: the admin key
})

after(async () => {
  for (const c of made) c.close()
  admin?.close()
  await daemon?.stop()
})

function clientWith(apiKey, url = daemon.url) {
  const c = new Berth({ url, apiKey })
  made.push(c)
  return c
}

const invalid = (name) => (e) => {
  assert.ok(e instanceof InvalidArgument, `${e?.name}: ${e?.message}`)
  assert.ok(e.message.startsWith(name + ':'), e.message)
  return true
}

test('a quota of one sandbox refuses the tenant\'s second; a tenant reads its own usage and may not set its quota', async () => {
  const key = await admin.createApiKey({ tenant: TENANT, name: `ts-test-quota-${process.pid}` })
  try {
    const set = await admin.setQuota(TENANT, { sandboxes: 1 })
    assert.deepEqual([set.tenant, set.quota, set.sandboxes], [TENANT, { ...NO_QUOTA, sandboxes: 1 }, 0])
    const a = clientWith(key.key)
    const sb = await a.create()
    try {
      await assert.rejects(a.create(), (e) => {
        assert.ok(e instanceof ResourceExhausted, `${e?.name}: ${e?.message}`)
        assert.equal(e.code, 'resource_exhausted')
        assert.match(e.message, /sandboxes/)
        assert.ok(e.message.includes(TENANT), e.message)
        return true
      })
      // The tenant's key reads its own usage, one entry, whatever tenant it names.
      for (const mine of [await a.usage(), await a.usage({ tenant: 't-b' })]) {
        assert.deepEqual(mine.map((u) => [u.tenant, u.sandboxes, u.quota.sandboxes]), [[TENANT, 1, 1]])
        assert.equal(typeof mine[0].sandbox_seconds, 'number')
      }
      // The operator reads every tenant's, or one's.
      const every = await admin.usage()
      assert.equal(every.find((u) => u.tenant === TENANT)?.sandboxes, 1, JSON.stringify(every))
      assert.deepEqual((await admin.usage({ tenant: TENANT })).map((u) => [u.tenant, u.sandboxes]), [[TENANT, 1]])
      // Setting a quota is the operator's call.
      await assert.rejects(a.setQuota(TENANT, { sandboxes: 5 }), (e) => e instanceof PermissionDenied && e.status === 403)
      assert.ok((await a.list()).some((s) => s.id === sb.id))
    } finally {
      await sb.delete()
    }
    // An empty quota removes it.
    const removed = await admin.setQuota(TENANT)
    assert.deepEqual([removed.quota, removed.sandboxes], [NO_QUOTA, 0])
  } finally {
    await admin.setQuota(TENANT, {})
    await admin.revokeApiKey(key)
  }
})

test('quota arguments are checked before any request', async () => {
  // Nothing listens there: a request from this client is DaemonUnreachable.
  const unreachable = clientWith(undefined, `http://127.0.0.1:${await freePort()}`)
  await assert.rejects(unreachable.usage(), DaemonUnreachable)
  const bad = [
    ['tenant', () => unreachable.setQuota('', { sandboxes: 1 })],
    ['tenant', () => unreachable.setQuota(undefined, { sandboxes: 1 })],
    ['tenant', () => unreachable.usage({ tenant: '' })],
    ['quota', () => unreachable.setQuota(TENANT, null)],
    ['sandboxes', () => unreachable.setQuota(TENANT, { sandboxes: -1 })],
    ['sandboxes', () => unreachable.setQuota(TENANT, { sandboxes: 1.5 })],
    ['sandboxes', () => unreachable.setQuota(TENANT, { sandboxes: '1' })],
    ['cpus', () => unreachable.setQuota(TENANT, { cpus: -0.5 })],
    ['cpus', () => unreachable.setQuota(TENANT, { cpus: NaN })],
    ['memory_bytes', () => unreachable.setQuota(TENANT, { memory_bytes: -5 })],
    ['disk_bytes', () => unreachable.setQuota(TENANT, { disk_bytes: -1 })],
    ['snapshot_bytes', () => unreachable.setQuota(TENANT, { snapshot_bytes: Infinity })],
    ['memoryBytes', () => unreachable.setQuota(TENANT, { memoryBytes: 1 << 30 })],
  ]
  for (const [name, call] of bad) await assert.rejects(call(), invalid(name), name)
  // What only the daemon knows, it says: a tenant's name is a DNS label.
  await assert.rejects(admin.setQuota('Not_A_Label', { sandboxes: 1 }), invalid('tenant'))
  // Every bound at once, and a fractional CPU count, come back as set.
  const q = { sandboxes: 3, cpus: 1.5, memory_bytes: 2 ** 30, disk_bytes: 2 ** 31, snapshot_bytes: 2 ** 20 }
  try {
    assert.deepEqual((await admin.setQuota('q-b', q)).quota, q)
  } finally {
    await admin.setQuota('q-b')
  }
})
