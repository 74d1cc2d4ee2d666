// The client's transport against a stand-in daemon on loopback (a plain
// node:http server that misbehaves on purpose): the API key and the URL's
// path prefix on the wire, a call with no answer within timeoutMs, an error
// answer that is not berth's JSON, and connections that break in the middle
// of an answer, of a stream and of a download.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import {
  Berth,
  DeadlineExceeded,
  InternalError,
  NotFound,
  Sandbox,
  Unavailable,
  DaemonUnreachable,
} from '../dist/index.js'

let server, base
const seen = []

before(async () => {
  server = createServer((req, res) => {
    seen.push({ method: req.method, url: req.url, headers: req.headers })
    const path = req.url.split('?')[0]
    if (path.endsWith('/v1/version')) {
      res.writeHead(200, { 'Content-Type': 'application/json' })
      return res.end(JSON.stringify({ version: 'fake', api: 'v1', runtimes: [] }))
    }
    if (path.endsWith('/v1/sandboxes/sb-silent')) return // never answers
    if (path.endsWith('/v1/sandboxes/sb-html')) {
      res.writeHead(502, { 'Content-Type': 'text/html' })
      return res.end('<html>bad gateway</html>')
    }
    if (path.endsWith('/v1/sandboxes/sb-long')) {
      res.writeHead(500, { 'Content-Type': 'text/plain' })
      return res.end('  ' + 'y'.repeat(5000) + '\n')
    }
    if (path.endsWith('/v1/sandboxes/sb-empty')) {
      res.writeHead(503)
      return res.end()
    }
    if (path.endsWith('/v1/sandboxes/sb-gone')) {
      res.writeHead(404, { 'Content-Type': 'application/json' })
      return res.end(JSON.stringify({ error: { class: 'not_found', message: 'sandbox "sb-gone" not found', reason: 'sandbox_gone' } }))
    }
    if (path.endsWith('/v1/sandboxes/sb-odd')) {
      res.writeHead(418, { 'Content-Type': 'application/json' })
      return res.end(JSON.stringify({ error: { class: 'from_the_future', message: 'a class this SDK does not know' } }))
    }
    if (path.endsWith('/exec')) {
      res.writeHead(200, { 'Content-Type': 'application/x-ndjson' })
      res.write('{"type":"start","pid":7}\n{"type":"stdout","data":"aGk="}\n')
      return setTimeout(() => req.socket.destroy(), 50)
    }
    if (path.endsWith('/files')) {
      res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': '1000000' })
      res.write(Buffer.alloc(1000, 'x'))
      return setTimeout(() => req.socket.destroy(), 50)
    }
    res.writeHead(404, { 'Content-Type': 'application/json' })
    res.end(JSON.stringify({ error: { class: 'not_found', message: `no route ${path}` } }))
  })
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok))
  base = `http://127.0.0.1:${server.address().port}`
})

after(async () => {
  server.closeAllConnections()
  await new Promise((ok) => server.close(ok))
})

const info = (id) => ({ id, state: 'running', image: '', runtime: '', labels: {}, publicPorts: [], accessToken: '', createdAt: '', error: '', raw: {} })

test('the API key, the user agent and the URL path prefix reach the wire; $BERTH_API_KEY is the default key', async () => {
  const c = new Berth({ url: base + '/prefix/', apiKey: 'k-123' })
  assert.equal((await c.version()).version, 'fake')
  const last = seen.at(-1)
  assert.equal(last.url, '/prefix/v1/version')
  assert.equal(last.headers.authorization, 'Bearer k-123')
  assert.match(last.headers['user-agent'], /^berth-typescript\//)
  c.close()
  process.env.BERTH_API_KEY = 'from-env'
  try {
    const e = new Berth({ url: base })
    await e.version()
    assert.equal(seen.at(-1).headers.authorization, 'Bearer from-env')
    e.close()
  } finally {
    delete process.env.BERTH_API_KEY
  }
  const none = new Berth({ url: base })
  await none.version()
  assert.equal(seen.at(-1).headers.authorization, undefined)
  none.close()
})

test('a call with no answer within timeoutMs is DeadlineExceeded naming the URL', async () => {
  const c = new Berth({ url: base, timeoutMs: 300 })
  const t0 = Date.now()
  await assert.rejects(c.get('sb-silent'), (e) => e instanceof DeadlineExceeded && e.message.includes(base) && e.message.includes('300 ms'))
  assert.ok(Date.now() - t0 < 5000)
  c.close()
})

test('answers that are not berth JSON, and classes this SDK does not know', async () => {
  const c = new Berth({ url: base })
  await assert.rejects(c.get('sb-html'), (e) => e instanceof Unavailable && !(e instanceof DaemonUnreachable) && e.status === 502 && e.message === 'HTTP 502: <html>bad gateway</html>')
  // The body's text is kept, trimmed and cut at 1 KiB (as the Go client keeps it).
  await assert.rejects(c.get('sb-long'), (e) => e instanceof InternalError && e.status === 500 && e.message.startsWith('HTTP 500: yyy') && e.message.length < 1100 && e.message.endsWith('…'))
  await assert.rejects(c.get('sb-empty'), (e) => e instanceof Unavailable && e.status === 503 && e.message === 'HTTP 503: Service Unavailable')
  await assert.rejects(c.get('sb-gone'), (e) => e instanceof NotFound && e.reason === 'sandbox_gone' && e.message === 'sandbox "sb-gone" not found')
  await assert.rejects(c.get('sb-odd'), (e) => e instanceof InternalError && e.status === 418 && e.details.class === 'from_the_future')
  c.close()
})

test('a connection that breaks mid-stream or mid-download is Unavailable naming the URL', async () => {
  const c = new Berth({ url: base })
  const sb = new Sandbox(c, info('sb-x'))
  const events = []
  await assert.rejects(
    (async () => {
      for await (const ev of sb.execStream('true')) events.push(ev)
    })(),
    (e) => e instanceof Unavailable && e.message.includes(`berth daemon at ${base} broke`),
  )
  assert.deepEqual(events.map((e) => e.type), ['start', 'stdout'])
  assert.equal(Buffer.from(events[1].data).toString(), 'hi')
  await assert.rejects(sb.download('/f'), (e) => e instanceof Unavailable && e.message.includes(base))
  const stream = await sb.downloadStream('/f')
  let got = 0
  await assert.rejects(
    (async () => {
      for await (const chunk of stream) got += chunk.length
    })(),
    (e) => e instanceof Unavailable && e.message.includes(base),
  )
  assert.equal(got, 1000)
  c.close()
})

test('every error class of api/openapi.yaml becomes its typed error, message and reason kept', async () => {
  const { readFileSync } = await import('node:fs')
  const { errorFor, BerthError } = await import('../dist/index.js')
  const doc = readFileSync(new URL('../../../api/openapi.yaml', import.meta.url), 'utf8')
  let block = doc.slice(doc.indexOf('\n    Error:\n'))
  block = block.slice(block.indexOf('enum:'), block.indexOf('message:'))
  const classes = block.split('\n').map((l) => l.trim()).filter((l) => l.startsWith('- ')).map((l) => l.slice(2))
  assert.ok(classes.length >= 13, String(classes))
  for (const cls of classes) {
    const e = errorFor(400, { error: { class: cls, message: `the daemon's words for ${cls}`, reason: 'sandbox_gone' } })
    assert.ok(e instanceof BerthError, cls)
    assert.equal(e.code, cls)
    assert.equal(e.message, `the daemon's words for ${cls}`)
    assert.equal(e.reason, 'sandbox_gone')
    assert.notEqual(e.constructor, BerthError, `${cls} has no class of its own`)
  }
})

test('the API key shows in no JSON or inspection of the client, its transport or a sandbox', async () => {
  const { inspect } = await import('node:util')
  const key = 'k-secret-4c1d'
  const c = new Berth({ url: base, apiKey: key })
  const sb = new Sandbox(c, { ...info('sb-k'), raw: { id: 'sb-k', state: 'running' } })
  const shown = [
    JSON.stringify(c),
    JSON.stringify({ client: c }),
    JSON.stringify(c.transport),
    JSON.stringify(sb),
    JSON.stringify({ sb, berth: sb.berth }),
    inspect(c, { depth: Infinity, showHidden: true }),
    inspect(c.transport, { depth: Infinity, showHidden: true }),
    inspect(sb, { depth: Infinity, showHidden: true }),
    inspect({ sb }, { depth: Infinity, showHidden: true, customInspect: true }),
  ]
  for (const s of shown) assert.ok(!s.includes(key), s)
  assert.deepEqual(JSON.parse(JSON.stringify(c)), { url: base })
  assert.deepEqual(JSON.parse(JSON.stringify(sb)), { id: 'sb-k', state: 'running' })
  // It still reaches the wire.
  await c.version()
  assert.equal(seen.at(-1).headers.authorization, `Bearer ${key}`)
  c.close()
})
