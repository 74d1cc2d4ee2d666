// The daemon-wide parts through the SDK, against a daemon started here:
// network policies and the egress log (only refused connections: no packet
// leaves this machine), secrets that never come back, images imported from
// a docker save tarball made here, a template built from a directory with
// a .dockerignore, and warm pools.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomUUID } from 'node:crypto'
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Berth, Conflict, InvalidArgument, NotFound, tarOf } from '../dist/index.js'
import { startDaemon, sleep } from './daemon.mjs'

let daemon, berth

before(async () => {
  daemon = await startDaemon({ prefix: 'tsadmin-' })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
})

const text = (b) => Buffer.from(b).toString('utf8')

test('an allowlist refuses what it does not list, the egress log says so, followed as it happens', async () => {
  // 203.0.113.0/24 is TEST-NET-3; the allowlist names .10, so a connection
  // to .66 is refused by the daemon's proxy and never leaves.
  const sb = await berth.create({ allow: ['203.0.113.10/32:8080'] })
  try {
    assert.equal(sb.info.raw.network.mode, 'allowlist')
    assert.deepEqual(sb.info.raw.network.allow, ['203.0.113.10/32:8080'])
    const ac = new AbortController()
    const followed = []
    const following = (async () => {
      for await (const rec of sb.followEgress({ signal: ac.signal })) {
        followed.push(rec)
        if (followed.length >= 2) break
      }
    })()
    for (const port of [81, 82]) {
      const r = await sb.exec(`curl -sS -m 5 http://203.0.113.66:${port}/`)
      assert.notEqual(r.exitCode, 0)
    }
    const all = await sb.egress()
    assert.ok(all.length >= 2, JSON.stringify(all))
    const denied = await sb.egress({ denied: true })
    assert.ok(denied.some((x) => x.addr === '203.0.113.66' && !x.allowed && x.rule), JSON.stringify(denied))
    assert.ok(denied.every((x) => !x.allowed))
    const first = await sb.egress({ limit: 1 })
    assert.equal(first.length, 1)
    assert.equal(first[0].seq, all[0].seq)
    assert.equal((await sb.egress({ after: all[0].seq })).length, all.length - 1)
    await Promise.race([following, sleep(10000).then(() => assert.fail('followEgress yielded nothing'))])
    assert.deepEqual(followed.map((r) => r.seq), all.slice(0, 2).map((r) => r.seq))
    // A follow stopped by its signal ends quietly.
    const stop = new AbortController()
    const quiet = (async () => {
      let n = 0
      for await (const _ of sb.followEgress({ after: all.at(-1).seq, signal: stop.signal })) n++
      return n
    })()
    await sleep(200)
    stop.abort()
    assert.equal(await quiet, 0)

    assert.equal((await sb.setNetwork('none')).raw.network.mode, 'none')
    assert.equal(sb.info.raw.network.mode, 'none')
    const back = await sb.setNetwork(undefined, { allow: ['203.0.113.10/32'] })
    assert.equal(back.raw.network.mode, 'allowlist')
    assert.deepEqual(back.raw.network.allow, ['203.0.113.10/32'])
  } finally {
    await sb.delete()
  }
})

test('bad policies name the field', async () => {
  await assert.rejects(berth.create({ allow: ['*.com'] }), (e) => e instanceof InvalidArgument && e.message.includes('network.allow[0]'))
  await assert.rejects(
    berth.create({ network: { mode: 'open', secrets: [{ secret: 'nope', host: 'api.example.com', header: 'X' }] } }),
    (e) => e instanceof InvalidArgument && e.message.includes('network.secrets[0].secret'),
  )
  await assert.rejects(berth.create({ network: 'sideways' }), (e) => e instanceof InvalidArgument && e.message.includes('sideways'))
})

test('secrets: stored, listed without values, bound by placeholder, refused removal while used', async () => {
  await berth.createSecret('ts-key', 'sk-ts-0123456789')
  try {
    const listed = (await berth.listSecrets()).filter((s) => s.name === 'ts-key')
    assert.equal(listed.length, 1)
    assert.ok(!('value' in listed[0]))
    await berth.updateSecret('ts-key', 'sk-ts-9876543210')
    const policy = { mode: 'open', secrets: [{ secret: 'ts-key', host: 'api.example.com', env: 'TS_KEY' }] }
    const sb = await berth.create({ network: policy })
    try {
      const ph = sb.info.raw.network.secrets[0].placeholder
      assert.ok(ph.startsWith('berth-ph-'))
      assert.equal((await sb.exec('echo $TS_KEY')).stdout.trim(), ph)
      assert.ok(!(await sb.exec('env; cat /proc/self/environ')).stdout.includes('sk-ts-'))
      await assert.rejects(berth.deleteSecret('ts-key'), (e) => e instanceof Conflict && e.message.includes(sb.id))
    } finally {
      await sb.delete()
    }
  } finally {
    await berth.deleteSecret('ts-key')
  }
  await assert.rejects(berth.updateSecret('ts-key', 'x'), NotFound)
})

function dockerSave(tag, files) {
  const layer = tarOf(Object.entries(files).map(([name, data]) => ({ name, type: 'file', data })))
  const diffId = 'sha256:' + createHash('sha256').update(layer).digest('hex')
  const config = Buffer.from(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: { Env: ['GREETING=from-image'], WorkingDir: '/srv', User: '0' },
      rootfs: { type: 'layers', diff_ids: [diffId] },
    }),
  )
  const configName = createHash('sha256').update(config).digest('hex') + '.json'
  const manifest = JSON.stringify([{ Config: configName, RepoTags: [tag], Layers: ['layer.tar'] }])
  return tarOf([
    { name: 'manifest.json', type: 'file', data: manifest },
    { name: configName, type: 'file', data: config },
    { name: 'layer.tar', type: 'file', data: layer },
  ])
}

test('an image imported from a docker save tarball, a sandbox made of it, removal refused while used', async () => {
  const n = randomUUID().slice(0, 8)
  const tag = `ts.test/greeting-${n}:1`
  const imgs = await berth.importImage(dockerSave(tag, { 'srv/hello.txt': 'hello from an image\n', 'srv/nonce': n }))
  assert.deepEqual(imgs[0].names, [tag])
  const id = imgs[0].id
  assert.ok((await berth.listImages()).some((i) => i.id === id))
  const sb = await berth.create({ image: tag })
  try {
    assert.equal(sb.info.raw.workdir, '/srv')
    assert.equal(sb.info.raw.env.GREETING, 'from-image')
    assert.equal(text(await sb.download('hello.txt')), 'hello from an image\n')
    await assert.rejects(berth.removeImage(tag), (e) => e instanceof Conflict && e.message.includes(sb.id))
    assert.deepEqual((await berth.inspectImage(tag)).in_use, [sb.id])
  } finally {
    await sb.delete()
  }
  await berth.removeImage(id)
  await assert.rejects(berth.inspectImage(tag), NotFound)
})

test('a template built from a directory (its .dockerignore obeyed), cached the second time', async () => {
  const n = randomUUID().slice(0, 8)
  const base = `ts.test/template-base-${n}:1`
  await berth.importImage(dockerSave(base, { 'srv/hello.txt': 'hello from an image\n', 'srv/nonce': n }))
  const dir = mkdtempSync(join(tmpdir(), 'tstpl-'))
  try {
    writeFileSync(join(dir, 'Dockerfile'), `FROM ${base}\nENV STAGE=built\nWORKDIR /srv/app\nCOPY app/ ./\nCOPY notes.txt /srv/notes/\n`)
    mkdirSync(join(dir, 'app'))
    writeFileSync(join(dir, 'app', 'main.py'), "print('hi')\n")
    writeFileSync(join(dir, 'notes.txt'), 'notes\n')
    writeFileSync(join(dir, 'secret.txt'), 'never sent\n')
    writeFileSync(join(dir, '.dockerignore'), 'secret.txt\n')
    const name = `ts.test/agent-env-${n}:1`
    const res = await berth.buildTemplate(name, dir)
    assert.equal(res.executed, 3, JSON.stringify(res))
    assert.equal(res.cached_steps, 0)
    assert.equal(res.image.config.working_dir, '/srv/app')
    assert.ok((await berth.listTemplates()).some((t) => t.id === res.image.id))
    const sb = await berth.create({ image: name })
    try {
      assert.equal(sb.info.raw.env.STAGE, 'built')
      assert.equal(text(await sb.download('main.py')), "print('hi')\n")
      assert.equal(text(await sb.download('/srv/notes/notes.txt')), 'notes\n')
    } finally {
      await sb.delete()
    }
    const again = await berth.buildTemplate(name, dir)
    assert.deepEqual([again.executed, again.cached_steps, again.image.id], [0, 3, res.image.id])
    await assert.rejects(
      berth.buildTemplate('ts.test/broken:1', tarOf([{ name: 'Dockerfile', type: 'file', data: `FROM ${base}\nVOLUME /data\n` }])),
      (e) => e instanceof InvalidArgument && e.message.includes('line 2') && e.message.includes('VOLUME'),
    )
    writeFileSync(join(dir, 'Dockerfile.secret'), `FROM ${base}\nCOPY secret.txt /x\n`)
    await assert.rejects(
      berth.buildTemplate('ts.test/broken:1', dir, { dockerfile: 'Dockerfile.secret' }),
      (e) => e instanceof NotFound && e.message.includes('secret.txt'),
    )
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

test('warm pools: set, listed with their readiness, removed', async () => {
  const set = await berth.setPool('host', 1)
  assert.equal(set.image, 'host')
  assert.equal(set.size, 1)
  const pools = await berth.pools()
  const host = pools.find((p) => p.image === 'host')
  assert.ok(host && host.size === 1 && typeof host.ready === 'number', JSON.stringify(pools))
  await assert.rejects(berth.setPool('host', -1), InvalidArgument)
})
