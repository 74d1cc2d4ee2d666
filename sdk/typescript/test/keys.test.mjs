// API keys against a daemon started here: a missing or wrong key is
// Unauthenticated on every kind of call (JSON, NDJSON streams, downloads,
// uploads, WebSocket handshakes) and names no sandbox; keys made through
// the API act for their tenant and scope; a revoked key is refused at once;
// the audit log names who did what.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Readable } from 'node:stream'
import { inspect } from 'node:util'
import { Berth, InvalidArgument, NotFound, PermissionDenied, Sandbox, Unauthenticated } from '../dist/index.js'
import { startDaemon } from './daemon.mjs'

let daemon, admin
const made = []

before(async () => {
  daemon = await startDaemon({ prefix: 'tskeys-' })
  admin = new Berth({ url: daemon.url }) // $BERTH_API_KEY: the admin key
})

after(async () => {
  for (const c of made) c.close()
  admin?.close()
  await daemon?.stop()
})

// Well formed (berth_, a 12-hex-digit id, _, 64 hex digits) but never made.
const UNKNOWN_KEY = 'berth_' + '0'.repeat(12) + '_' + '0'.repeat(64)

/** A client with that key; undefined: none at all, as a user without $BERTH_API_KEY has. */
function clientWith(apiKey) {
  const saved = process.env.BERTH_API_KEY
  delete process.env.BERTH_API_KEY
  try {
    const c = new Berth({ url: daemon.url, apiKey })
    made.push(c)
    return c
  } finally {
    process.env.BERTH_API_KEY = saved
  }
}

/** A handle on a sandbox through client c, without asking the daemon (as get would). */
const handle = (c, info) => new Sandbox(c, info)

const name = (what) => `ts-test-${what}-${process.pid}`

async function drain(iterable) {
  const out = []
  for await (const x of iterable) out.push(x)
  return out
}

function refuses(cls, status, sbId) {
  return (e) => {
    assert.ok(e instanceof cls, `${e?.name}: ${e?.message}`)
    assert.equal(e.status, status)
    if (sbId) assert.ok(!e.message.includes(sbId), e.message)
    return true
  }
}

test('no key: every kind of call is Unauthenticated (401) and names no sandbox', async () => {
  const sb = await admin.create()
  try {
    await noKey(sb)
  } finally {
    await sb.delete()
  }
})

async function noKey(sb) {
  const anonymous = clientWith(undefined)
  const h = handle(anonymous, sb.info)
  const calls = {
    get: () => anonymous.get(sb.id),
    list: () => anonymous.list(),
    create: () => anonymous.create(),
    delete: () => anonymous.delete(sb.id),
    execStream: () => drain(h.execStream('true')),
    download: () => h.download('/etc/hostname'),
    downloadStream: () => h.downloadStream('/etc/hostname'),
    upload: () => h.upload('/tmp/x', Readable.from([Buffer.from('streamed')])),
    events: () => drain(h.events()),
    openTerminal: () => h.openTerminal(['true']),
  }
  for (const [what, call] of Object.entries(calls)) {
    await assert.rejects(call(), (e) => {
      refuses(Unauthenticated, 401, sb.id)(e)
      assert.equal(e.code, 'unauthenticated', what)
      assert.match(e.message, /API key/, what)
      return true
    }, what)
  }
  // The sandbox is untouched, and the admin key works.
  assert.equal((await admin.get(sb.id)).info.state, 'running')
  assert.equal((await admin.get(sb.id).then((s) => s.download('/tmp/x').catch((e) => e))).code, 'not_found')
}

test('a wrong key is Unauthenticated, as a missing one', async () => {
  const sb = await admin.create()
  try {
    for (const key of [UNKNOWN_KEY, 'not-a-berth-key', UNKNOWN_KEY.slice(0, -1) + '1']) {
      const wrong = clientWith(key)
      await assert.rejects(wrong.get(sb.id), refuses(Unauthenticated, 401, sb.id))
      await assert.rejects(handle(wrong, sb.info).openTerminal(['true']), refuses(Unauthenticated, 401, sb.id))
    }
  } finally {
    await sb.delete()
  }
})

test('a tenant sees only its own sandboxes; the audit log names the tenant and key', async () => {
  const ka = await admin.createApiKey({ tenant: 't-a', scope: 'write', name: name('a') })
  const kb = await admin.createApiKey({ tenant: 't-b', name: name('b') })
  assert.deepEqual([ka.tenant, ka.scope], ['t-a', 'write'])
  assert.deepEqual([kb.tenant, kb.scope], ['t-b', 'write']) // write is the default
  assert.ok(ka.key.startsWith(`berth_${ka.id}_`))
  // The secret never shows when the key is logged.
  assert.ok(!JSON.stringify(ka).includes(ka.key))
  assert.ok(!inspect(ka).includes(ka.key))
  const a = clientWith(ka.key)
  const b = clientWith(kb.key)
  const sb = await b.create({ labels: { who: 'b' } })
  try {
    await tenants(admin, a, b, ka, kb, sb)
  } finally {
    await sb.delete()
  }
})

async function tenants(admin, a, b, ka, kb, sb) {
  assert.equal((await b.get(sb.id)).id, sb.id)
  assert.ok((await b.list()).some((s) => s.id === sb.id))
  // Another tenant's sandbox is not found, whatever the call.
  await assert.rejects(a.get(sb.id), refuses(NotFound, 404))
  await assert.rejects(a.delete(sb.id), NotFound)
  await assert.rejects(handle(a, sb.info).exec('true'), NotFound)
  await assert.rejects(drain(handle(a, sb.info).execStream('true')), NotFound)
  await assert.rejects(handle(a, sb.info).openTerminal(['true']), NotFound)
  assert.ok(!(await a.list()).some((s) => s.id === sb.id))
  // The operator (the admin key) sees every tenant's.
  assert.equal((await admin.get(sb.id)).id, sb.id)
  const mine = await a.create()
  try {
    assert.ok((await a.list()).some((s) => s.id === mine.id))
    assert.ok(!(await b.list()).some((s) => s.id === mine.id))
  } finally {
    await mine.delete()
  }
  const created = (await admin.audit({ sandbox: sb.id })).filter((r) => r.method === 'POST' && r.route === '/v1/sandboxes')
  assert.deepEqual(created.map((r) => [r.tenant, r.key_id, r.status]), [['t-b', kb.id, 201]])
  assert.deepEqual(new Set((await b.audit()).map((r) => r.tenant)), new Set(['t-b']))
  // Of b's sandbox, a reads only its own refused calls.
  const refused = await a.audit({ sandbox: sb.id })
  assert.deepEqual(
    refused.filter((r) => r.method === 'DELETE').map((r) => [r.tenant, r.key_id, r.status, r.error]),
    [['t-a', ka.id, 404, 'not_found']],
  )
  assert.ok(refused.every((r) => r.tenant === 't-a' && r.error === 'not_found'), JSON.stringify(refused))
}

test('a read key cannot create (PermissionDenied, 403); only an admin key makes keys', async () => {
  const kr = await admin.createApiKey({ tenant: 't-a', scope: 'read', name: name('read') })
  const reader = clientWith(kr.key)
  assert.ok(Array.isArray(await reader.list()))
  await assert.rejects(reader.create(), (e) => {
    refuses(PermissionDenied, 403)(e)
    assert.equal(e.code, 'permission_denied')
    assert.match(e.message, /scope read/)
    return true
  })
  const kw = await admin.createApiKey({ tenant: 't-a', name: name('write') })
  await assert.rejects(clientWith(kw.key).createApiKey({ tenant: 't-a' }), PermissionDenied)
  await assert.rejects(reader.listApiKeys(), PermissionDenied)
})

test('a revoked key is refused at once, and stays listed without its secret', async () => {
  const k = await admin.createApiKey({ tenant: 't-a', name: name('revoked') })
  const c = clientWith(k.key)
  assert.ok(Array.isArray(await c.list()))
  const revoked = await admin.revokeApiKey(k)
  assert.equal(revoked.id, k.id)
  assert.ok(revoked.revoked_at)
  assert.equal(revoked.key, undefined)
  await assert.rejects(c.list(), refuses(Unauthenticated, 401))
  const listed = await admin.listApiKeys()
  const again = listed.find((x) => x.id === k.id)
  assert.ok(again?.revoked_at)
  assert.ok(listed.every((x) => x.key === undefined))
  await assert.rejects(admin.revokeApiKey('000000000000'), NotFound)
})

test('key arguments are checked; a key with an expiry works until then', async () => {
  await assert.rejects(admin.createApiKey({ tenant: 'Not A Label' }), (e) => e instanceof InvalidArgument && /tenant/.test(e.message))
  await assert.rejects(admin.createApiKey({ tenant: 't-a', expiresAt: new Date('nonsense') }), (e) => e instanceof InvalidArgument && /expiresAt/.test(e.message))
  await assert.rejects(admin.revokeApiKey(''), (e) => e instanceof InvalidArgument && /key/.test(e.message))
  const k = await admin.createApiKey({ tenant: 't-a', name: name('expiring'), expiresAt: new Date(Date.now() + 3600_000) })
  assert.ok(k.expires_at)
  assert.ok(Array.isArray(await clientWith(k.key).list()))
})
