// Images from a registry through the SDK: a small OCI registry served here
// on loopback (the distribution API's reads, for one image made here), a
// pull whose progress streams as it happens, a sandbox made of the pulled
// image, a template build whose log streams, and a pull that fails.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { createHash, randomUUID } from 'node:crypto'
import { gzipSync } from 'node:zlib'
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { Berth, BerthError, NotFound, InvalidArgument, tarOf } from '../dist/index.js'
import { startDaemon } from './daemon.mjs'

const sha = (b) => 'sha256:' + createHash('sha256').update(b).digest('hex')
let daemon, berth, registry, host
const requests = []

/** The host's dash as /bin/sh with the libraries it loads (ldd says
 * which): enough of a system for sh -c and a Dockerfile's RUN. */
function shell() {
  const files = { 'bin/sh': readFileSync('/bin/dash') }
  for (const m of execFileSync('ldd', ['/bin/dash']).toString().matchAll(/(\/\S+) \(0x/g)) {
    files[m[1].replace(/^\//, '')] = readFileSync(m[1])
  }
  return files
}

function image(files) {
  // Every directory listed (0755), programs and libraries executable.
  const dirs = new Set()
  for (const name of Object.keys(files)) {
    const parts = name.split('/').slice(0, -1)
    for (let i = 1; i <= parts.length; i++) dirs.add(parts.slice(0, i).join('/'))
  }
  const tar = Buffer.from(
    tarOf([
      ...[...dirs].sort().map((name) => ({ name, type: 'dir', mode: 0o755 })),
      ...Object.entries(files).map(([name, data]) => ({ name, type: 'file', data, mode: name.startsWith('srv/') ? 0o644 : 0o755 })),
    ]),
  )
  const layer = gzipSync(tar)
  const config = Buffer.from(
    JSON.stringify({
      architecture: { x64: 'amd64', arm64: 'arm64' }[process.arch] ?? process.arch,
      os: 'linux',
      config: { Env: ['FROM_REGISTRY=yes'], WorkingDir: '/srv', User: '0' },
      rootfs: { type: 'layers', diff_ids: [sha(tar)] },
    }),
  )
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha(config), size: config.length },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', digest: sha(layer), size: layer.length }],
    }),
  )
  return { manifest, blobs: { [sha(config)]: config, [sha(layer)]: layer } }
}

const img = image({ ...shell(), 'srv/hello.txt': 'hello from a registry\n', 'srv/nonce': randomUUID() })

before(async () => {
  registry = createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`)
    const send = (type, body, digest) => {
      res.writeHead(200, { 'Content-Type': type, 'Content-Length': body.length, 'Docker-Content-Digest': digest })
      res.end(req.method === 'HEAD' ? undefined : body)
    }
    if (req.url === '/v2/') return send('application/json', Buffer.from('{}'), '')
    let m = req.url.match(/^\/v2\/ts\/hello\/manifests\/1$/)
    if (m) return send('application/vnd.oci.image.manifest.v1+json', img.manifest, sha(img.manifest))
    m = req.url.match(/^\/v2\/ts\/hello\/blobs\/(sha256:[0-9a-f]+)$/)
    if (m && img.blobs[m[1]]) return send('application/octet-stream', img.blobs[m[1]], m[1])
    res.writeHead(404, { 'Content-Type': 'application/json' })
    res.end(JSON.stringify({ errors: [{ code: 'MANIFEST_UNKNOWN', message: 'unknown' }] }))
  })
  await new Promise((ok) => registry.listen(0, '127.0.0.1', ok))
  host = `127.0.0.1:${registry.address().port}`
  daemon = await startDaemon({ prefix: 'tsreg-' })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
  registry?.closeAllConnections()
  await new Promise((ok) => (registry ? registry.close(ok) : ok()))
})

test('a pull streams its progress, then a sandbox is made of the image', async () => {
  const ref = `${host}/ts/hello:1`
  const events = []
  for await (const ev of berth.pullImageStream(ref)) events.push(ev)
  const statuses = events.map((e) => e.status)
  assert.equal(statuses[0], 'resolved', statuses.join())
  assert.ok(statuses.includes('downloading') && statuses.includes('unpacked'), statuses.join())
  const done = events.at(-1)
  assert.equal(done.status, 'done')
  assert.ok(done.image.id && done.image.names.includes(ref), JSON.stringify(done.image))
  assert.ok(requests.some((r) => r.startsWith('GET /v2/ts/hello/blobs/')))

  // Pulled again: the plain call answers the stored image.
  const again = await berth.pullImage(ref)
  assert.equal(again.id, done.image.id)
  const sb = await berth.create({ image: ref })
  try {
    assert.equal(sb.info.raw.workdir, '/srv')
    assert.equal(Buffer.from(await sb.download('hello.txt')).toString(), 'hello from a registry\n')
    const r = await sb.exec('read line < hello.txt; echo $line; echo $FROM_REGISTRY')
    assert.equal(r.stdout, 'hello from a registry\nyes\n', r.stderr)
  } finally {
    await sb.delete()
  }

  // A template on it, its log streamed.
  const name = `ts.test/streamed-${randomUUID().slice(0, 8)}:1`
  const dockerfile = `FROM ${ref}\nRUN echo built-by-run > /srv/run.txt && echo to-stderr >&2\nENV STAGE=two\n`
  const log = []
  for await (const ev of berth.buildTemplateStream(name, tarOf([{ name: 'Dockerfile', type: 'file', data: dockerfile }]))) log.push(ev)
  const types = log.map((e) => e.type)
  assert.ok(types.includes('step') && types.at(-1) === 'done', types.join())
  assert.ok(log.some((e) => e.type === 'step' && e.instruction?.startsWith('RUN')), JSON.stringify(log))
  assert.ok(log.some((e) => e.type === 'stderr' && Buffer.from(e.data).toString().includes('to-stderr')), JSON.stringify(log.map((e) => [e.type, Buffer.from(e.data).toString()])))
  assert.ok(log.at(-1).executed >= 1 && !log.at(-1).cached_steps, JSON.stringify(log.at(-1)))
  const built = await berth.create({ image: name })
  try {
    assert.equal((await built.exec('read line < /srv/run.txt; echo $line; echo $STAGE')).stdout, 'built-by-run\ntwo\n')
  } finally {
    await built.delete()
  }
  // A build that fails: its error event, as the daemon's class.
  const bad = []
  for await (const ev of berth.buildTemplateStream(name + '-bad', tarOf([{ name: 'Dockerfile', type: 'file', data: `FROM ${ref}\nRUN exit 3\n` }]))) bad.push(ev)
  const last = bad.at(-1)
  assert.equal(last.type, 'error', JSON.stringify(bad))
  assert.ok(last.error instanceof BerthError && last.error.message.includes('exit'), last.error?.message)
})

test('a pull of what the registry does not have fails with the class of the failure', async () => {
  await assert.rejects(berth.pullImage(`${host}/ts/missing:1`), (e) => e instanceof BerthError && e.message.includes('ts/missing'))
  const events = []
  const err = await (async () => {
    for await (const ev of berth.pullImageStream(`${host}/ts/missing:1`)) events.push(ev)
  })().catch((e) => e)
  // Refused before the stream began (thrown), or an error event at its end.
  if (err) assert.ok(err instanceof BerthError && err.message.includes('ts/missing'), String(err))
  else assert.ok(events.at(-1).status === 'error' && events.at(-1).error.message.includes('ts/missing'), JSON.stringify(events))
  await assert.rejects(berth.pullImage(''), InvalidArgument)
  await assert.rejects(berth.inspectImage(`${host}/ts/missing:1`), NotFound)
})
