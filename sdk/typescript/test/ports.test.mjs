// Ports through the SDK, against a daemon started here: an HTTP server
// inside a sandbox (python3's http.server, and a small echo server), reached
// through sandbox.url(port) with the access token in each of its forms,
// the host form, public ports, a rotated token, and the errors of a closed
// port, bad port numbers and a stopped sandbox.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { request } from 'node:http'
import {
  ACCESS_TOKEN_HEADER,
  Berth,
  Conflict,
  DeadlineExceeded,
  InvalidArgument,
  Sandbox,
  Unauthenticated,
  Unavailable,
  errorFor,
} from '../dist/index.js'
import { startDaemon } from './daemon.mjs'

const PORT = 8000
let daemon, berth

before(async () => {
  daemon = await startDaemon({ prefix: 'tsports-' })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
})

// Answers every GET and POST with what it received, as JSON.
const ECHO = `
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "headers": dict(self.headers),
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
`

async function serve(sb, port = PORT) {
  await sb.write('/home/user/echo.py', ECHO)
  await sb.startProcess(`exec python3 /home/user/echo.py ${port}`)
  return sb.waitForPort(port, { timeoutMs: 20000 })
}

/** The SDK's error for a daemon's error answer on a port's URL. */
async function raised(res) {
  assert.equal(res.headers.get('content-type'), 'application/json')
  return errorFor(res.status, await res.json())
}

/** A GET sent to the daemon's address with another Host header (fetch cannot set Host). */
function getWithHost(url, host) {
  return new Promise((resolve, reject) => {
    const req = request(url, { headers: { Host: host } }, (res) => {
      let body = ''
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('python3 -m http.server inside a sandbox, reached through sandbox.url', async () => {
  const sb = await berth.create()
  try {
    await sb.write('/home/user/site/index.html', '<h1>hello from the sandbox</h1>\n')
    await sb.startProcess(['python3', '-m', 'http.server', '--bind', '127.0.0.1', '--directory', '/home/user/site', String(PORT)])
    const p = await sb.waitForPort(PORT, { timeoutMs: 20000 })
    assert.deepEqual([p.port, p.address, p.proto, p.public], [PORT, '127.0.0.1', 'tcp', false])
    const res = await fetch(await sb.url(PORT, '/index.html'))
    assert.equal(res.status, 200)
    assert.equal(await res.text(), '<h1>hello from the sandbox</h1>\n')
  } finally {
    await sb.delete()
  }
})

test('a private port and its token: query, header, cookie; rotation', async () => {
  const sb = await berth.create()
  try {
    const token = sb.accessToken
    assert.ok(token.length >= 32)
    assert.deepEqual(sb.publicPorts, [])
    await serve(sb)
    assert.deepEqual((await sb.ports()).map((p) => p.port), [PORT])

    const prefix = `${daemon.url}/v1/sandboxes/${sb.id}/ports/${PORT}`
    assert.equal(await sb.url(PORT), `${prefix}/?berth_access_token=${token}`)
    assert.equal(await sb.url(PORT, '/', { withToken: false }), `${prefix}/`)
    assert.equal(await sb.url(PORT, '/a/b?x=1#top'), `${prefix}/a/b?x=1&berth_access_token=${token}#top`)

    let r = await fetch(await sb.url(PORT, '/x', { withToken: false }))
    assert.equal(r.status, 401)
    const err = await raised(r)
    assert.ok(err instanceof Unauthenticated && err.message.includes(sb.id) && err.message.includes(String(PORT)), err.message)

    r = await fetch(await sb.url(PORT, '/api/run?n=2', { withToken: false }), {
      method: 'POST',
      headers: { [ACCESS_TOKEN_HEADER]: token },
      body: 'ping',
    })
    assert.equal(r.status, 200)
    const seen = await r.json()
    assert.deepEqual([seen.method, seen.path, seen.body], ['POST', '/api/run?n=2', 'ping'])
    assert.ok(!Object.keys(seen.headers).some((h) => h.toLowerCase() === ACCESS_TOKEN_HEADER.toLowerCase()))
    assert.equal(seen.headers['X-Forwarded-Prefix'], `/v1/sandboxes/${sb.id}/ports/${PORT}`)

    r = await fetch(await sb.url(PORT, '/page?q=1'))
    assert.equal(r.status, 200)
    assert.equal((await r.json()).path, '/page?q=1')
    const cookie = r.headers.get('set-cookie')
    assert.ok(cookie.startsWith(`berth_access_token=${token};`) && cookie.includes('HttpOnly'), cookie)
    r = await fetch(await sb.url(PORT, '/', { withToken: false }), { headers: { Cookie: `berth_access_token=${token}; theme=dark` } })
    assert.equal(r.status, 200)
    assert.equal((await r.json()).headers.Cookie, 'theme=dark')

    const fresh = await sb.rotateAccessToken()
    assert.notEqual(fresh, token)
    assert.equal(sb.accessToken, fresh)
    assert.equal(sb.info.raw.access_token, fresh)
    assert.equal((await berth.get(sb.id)).accessToken, fresh)
    r = await fetch(await sb.url(PORT, '/', { withToken: false }), { headers: { [ACCESS_TOKEN_HEADER]: token } })
    assert.equal(r.status, 401)
    assert.equal((await fetch(await sb.url(PORT))).status, 200)
  } finally {
    await sb.delete()
  }
})

test('the host form', async () => {
  const domain = (await berth.version()).ports_domain
  assert.equal(domain, 'berth.localhost')
  const sb = await berth.create()
  try {
    await serve(sb)
    const port = new URL(daemon.url).port
    const url = await sb.url(PORT, '/app/', { hostForm: true })
    assert.equal(url, `http://${PORT}-${sb.id}.${domain}:${port}/app/?berth_access_token=${sb.accessToken}`)
    assert.equal(await sb.url(PORT, '/', { hostForm: true, withToken: false }), `http://${PORT}-${sb.id}.${domain}:${port}/`)
    const u = new URL(url)
    const r = await getWithHost(`${daemon.url}${u.pathname}${u.search}`, u.host)
    assert.equal(r.status, 200, r.body)
    assert.equal(JSON.parse(r.body).path, '/app/')
    const denied = await getWithHost(`${daemon.url}/`, u.host)
    assert.equal(denied.status, 401)
  } finally {
    await sb.delete()
  }
})

test('public ports', async () => {
  const sb = await berth.create({ publicPorts: [PORT, PORT] })
  try {
    assert.deepEqual(sb.publicPorts, [PORT])
    const p = await serve(sb)
    assert.ok(p.public)
    assert.ok(!(await sb.url(PORT)).includes('berth_access_token'))
    let r = await fetch(await sb.url(PORT, '/open'))
    assert.equal(r.status, 200)
    assert.equal((await r.json()).path, '/open')
    assert.deepEqual((await sb.setPublicPorts([])).publicPorts, [])
    assert.equal((await sb.ports())[0].public, false)
    assert.equal((await fetch(await sb.url(PORT, '/', { withToken: false }))).status, 401)
    assert.equal((await fetch(await sb.url(PORT))).status, 200)
    assert.deepEqual((await sb.setPublicPorts([9000, PORT])).publicPorts, [PORT, 9000])
    assert.deepEqual((await berth.get(sb.id)).publicPorts, [PORT, 9000])
    await assert.rejects(sb.setPublicPorts([PORT, 0]), InvalidArgument)
  } finally {
    await sb.delete()
  }
  await assert.rejects(berth.create({ publicPorts: [70000] }), (e) => e instanceof InvalidArgument && e.message.includes('public_ports[0]') && e.message.includes('70000'))
})

test('a closed port, bad port numbers, a stopped sandbox', async () => {
  const sb = await berth.create()
  try {
    assert.deepEqual(await sb.ports(), [])
    const r = await fetch(await sb.url(PORT))
    assert.equal(r.status, 502)
    const err = await raised(r)
    assert.ok(err instanceof Unavailable && err.reason === 'port_closed' && err.message.includes(sb.id), err.message)
    const started = Date.now()
    await assert.rejects(sb.waitForPort(PORT, { timeoutMs: 500 }), (e) => e instanceof DeadlineExceeded && e.message.includes(`port ${PORT}`) && e.message.includes(sb.id))
    assert.ok(Date.now() - started >= 500)
    for (const bad of [0, 70000, -1, 1.5, '8000']) {
      await assert.rejects(sb.url(bad), (e) => e instanceof InvalidArgument && e.message.includes(String(bad)))
      await assert.rejects(sb.waitForPort(bad, { timeoutMs: 100 }), InvalidArgument)
    }
    await serve(sb)
    await sb.stop()
    await assert.rejects(sb.ports(), Conflict)
    await assert.rejects(sb.waitForPort(PORT, { timeoutMs: 5000 }), (e) => e instanceof Conflict && e.message.includes('stopped'))
    const stopped = await fetch(await sb.url(PORT))
    assert.equal(stopped.status, 409)
    assert.ok((await raised(stopped)) instanceof Conflict)
    await sb.start()
    assert.deepEqual(await sb.ports(), [])
  } finally {
    await sb.delete()
  }
})

test('URLs are made without a daemon; a unix socket has none', async () => {
  const info = { id: 'sb-abc', state: 'running', image: '', runtime: '', labels: {}, publicPorts: [443], accessToken: 't0k', createdAt: '', error: '', raw: {} }
  const c = new Berth({ url: 'http://127.0.0.1:1/base' })
  const sb = new Sandbox(c, info)
  assert.equal(await sb.url(80), 'http://127.0.0.1:1/base/v1/sandboxes/sb-abc/ports/80/?berth_access_token=t0k')
  assert.equal(await sb.url(80, 'a'), 'http://127.0.0.1:1/base/v1/sandboxes/sb-abc/ports/80/a?berth_access_token=t0k')
  assert.equal(await sb.url(443, '/x'), 'http://127.0.0.1:1/base/v1/sandboxes/sb-abc/ports/443/x')
  const u = new Berth({ url: 'unix:///nonexistent/berth.sock' })
  await assert.rejects(new Sandbox(u, info).url(80), (e) => e instanceof InvalidArgument && e.message.includes('unix socket') && e.message.includes('berth port-forward'))
})
