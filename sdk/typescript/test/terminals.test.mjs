// Terminals and interactive input through the SDK, against a daemon
// started here: a shell on a terminal (its size, a resize, Ctrl-C, a
// message the daemon refuses, a detach and a reattach with the scrollback,
// the exit code), a REPL fed by writeStdin and an attachment, the errors
// before anything starts, a sandbox deleted under a terminal, and the unix
// socket.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Berth, Conflict, DaemonUnreachable, DeadlineExceeded, InvalidArgument, NotFound, Sandbox, Terminal } from '../dist/index.js'
import { startDaemon, sleep } from './daemon.mjs'

let daemon, berth

before(async () => {
  daemon = await startDaemon({ prefix: 'tsterm-' })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
})

/** Reads the terminal until its output holds want; that output. */
async function until(term, want, timeoutMs = 15000) {
  let out = ''
  const deadline = Date.now() + timeoutMs
  while (!out.includes(want)) {
    let ev
    try {
      ev = await term.recv(Math.max(0, deadline - Date.now()))
    } catch (e) {
      if (e instanceof DeadlineExceeded) assert.fail(`no ${JSON.stringify(want)} after ${timeoutMs} ms; output ${JSON.stringify(out)}`)
      throw e
    }
    assert.ok(ev, `the attachment ended before ${JSON.stringify(want)}; output ${JSON.stringify(out)}`)
    assert.notEqual(ev.type, 'exit', `exited before ${JSON.stringify(want)}; output ${JSON.stringify(out)}`)
    out += Buffer.from(ev.data).toString()
  }
  return out
}

async function collect(term) {
  const events = []
  for await (const ev of term) events.push(ev)
  return events
}

test('a shell on a terminal: size, resize, Ctrl-C, a refused message, detach and reattach, the exit code', async () => {
  const sb = await berth.create()
  try {
    const term = await sb.openTerminal(['/bin/sh'], { rows: 30, cols: 100 })
    assert.ok(term instanceof Terminal)
    assert.ok(term.pid > 0)
    assert.deepEqual(term.tty, { rows: 30, cols: 100 })
    const p = await sb.getProcess(term.pid)
    assert.ok(p.running && p.openStdin)
    assert.deepEqual(p.tty, { rows: 30, cols: 100 })
    assert.deepEqual(p.cmd, ['/bin/sh'])

    await term.write('stty size; tty\n')
    assert.ok((await until(term, '/dev/pts/')).includes('30 100'))
    await term.resize(40, 120)
    assert.deepEqual(term.tty, { rows: 40, cols: 120 })
    await term.write(new TextEncoder().encode('stty size\n'))
    await until(term, '40 120')

    await term.write('sleep 100\n')
    await sleep(300) // let sleep start: a ^C before it would hit the shell's read
    await term.write('\x03')
    await term.write('echo x-$?\n')
    await until(term, 'x-130')

    // A size out of bounds is refused here; a message the daemon cannot take
    // comes back as an error event, and the terminal goes on.
    for (const [rows, cols] of [[0, 80], [24, 10001], [1.5, 80]]) {
      await assert.rejects(term.resize(rows, cols), InvalidArgument)
    }
    assert.deepEqual(term.tty, { rows: 40, cols: 120 })
    await term.sendText('{"type":"dance"}')
    let ev
    while ((ev = await term.recv(15000)) && ev.type !== 'error') {}
    assert.ok(ev.error instanceof InvalidArgument && ev.error.message.includes('dance'), String(ev?.error))
    await term.write('echo still-$((20+1))\n')
    await until(term, 'still-21')

    // A detach leaves the shell running; a reattach shows the recent screen first.
    await term.write('echo before-$((1+1))\n')
    await until(term, 'before-2')
    await term.close()
    assert.equal(await term.recv(), undefined)
    assert.deepEqual(await collect(term), [])
    await assert.rejects(term.write('echo nobody reads this\n'), Conflict)
    assert.ok((await sb.getProcess(term.pid)).running)

    const again = await sb.attach(term.pid)
    try {
      assert.equal(again.pid, term.pid)
      assert.deepEqual(again.tty, { rows: 40, cols: 120 })
      const scrollback = await until(again, 'before-2')
      assert.ok(scrollback.includes('40 120') && scrollback.includes('x-130') && scrollback.includes('still-21'), scrollback)
      await again.write('echo last-$((2+2)); exit 3\n')
      const res = await again.wait(15000)
      assert.equal(res.exitCode, 3)
      assert.equal(res.pid, term.pid)
      assert.ok(res.stdout.includes('last-4'), res.stdout)
      assert.equal(res.stderrBytes.length, 0)
      assert.equal(again.result, res)
      assert.equal(await again.wait(), res)
      assert.equal(await again.recv(), undefined)
      await assert.rejects(again.write('x'), Conflict)
    } finally {
      await again.close()
    }
    const ended = await sb.getProcess(term.pid)
    assert.equal(ended.running, false)
    assert.equal(ended.result.exitCode, 3)
  } finally {
    await sb.delete()
  }
})

test('the default shell, a command string with cwd and env, wait timing out, a killed process', async () => {
  const sb = await berth.create()
  try {
    const term = await sb.openTerminal()
    assert.deepEqual(term.tty, { rows: 24, cols: 80 })
    await term.write('echo shell=$0 size=$(stty size)\n')
    let out = await until(term, 'size=24 80')
    assert.ok(out.includes('shell=-bash') || out.includes('shell=bash'), out)
    if (!out.slice(out.indexOf('size=24 80')).includes('$ ')) await until(term, '$ ')
    await term.write('\x04') // Ctrl-D: the login shell ends
    assert.equal((await term.wait(15000)).exitCode, 0)
    await term.close()

    const t2 = await sb.openTerminal('echo $GREETING from $(pwd) as $(id -un); exit 7', { cwd: '/tmp', env: { GREETING: 'hi' } })
    const res = await t2.wait(15000)
    assert.equal(res.exitCode, 7)
    assert.ok(res.stdout.includes('hi from /tmp as user'), res.stdout)
    assert.ok(res.stdout.includes('\r\n'))

    const t3 = await sb.openTerminal(['sh', '-c', 'echo early; sleep 1; echo late'])
    await assert.rejects(t3.wait(200), (e) => e instanceof DeadlineExceeded && e.message.includes(String(t3.pid)))
    const r3 = await t3.wait(15000)
    assert.ok(r3.ok && r3.stdout.includes('early') && r3.stdout.includes('late'), r3.stdout)

    // The output as plain chunks, until the exit.
    const t4 = await sb.openTerminal(['sh', '-c', 'echo one; echo two'])
    const chunks = []
    for await (const c of t4.output()) chunks.push(c)
    assert.match(Buffer.concat(chunks).toString(), /one\r\ntwo/)
    assert.equal(t4.result.exitCode, 0)

    const t5 = await sb.openTerminal(['sleep', '100'])
    await sb.killProcess(t5.pid)
    const events = await collect(t5)
    assert.equal(events.at(-1).type, 'exit')
    assert.equal(events.at(-1).result.signal, 9)
    assert.equal(events.at(-1).result.exitCode, 137)
  } finally {
    await sb.delete()
  }
})

test('interactive stdin: a REPL fed by writeStdin and an attachment, stderr events, EOF, a terminal started in the background', async () => {
  const sb = await berth.create()
  try {
    const pid = await sb.startProcess(['python3', '-u', '-i', '-q'], { openStdin: true })
    const p = await sb.getProcess(pid)
    assert.ok(p.openStdin && p.running && p.tty === undefined)
    await sb.writeStdin(pid, 'x = 6 * 7\n')
    const term = await sb.attach(pid)
    assert.equal(term.tty, undefined)
    await term.write('print(x)\n')
    await until(term, '42')
    await term.write("import sys; print('to-' + 'stderr', file=sys.stderr)\n")
    let ev
    while ((ev = await term.recv(15000)) && !Buffer.from(ev.data).toString().includes('to-stderr')) {}
    assert.equal(ev.type, 'stderr')
    await sb.writeStdin(pid, "print('b' + 'ye')\n", { close: true })
    const res = await term.wait(15000)
    assert.equal(res.exitCode, 0)
    assert.ok(res.stdout.includes('bye'), res.stdout)
    await term.close()
    assert.equal((await sb.waitProcess(pid, { timeoutMs: 10000 })).exitCode, 0)

    const cat = await sb.startProcess(['cat'], { openStdin: true })
    const ct = await sb.attach(cat)
    await ct.write('hello\n')
    await ct.closeStdin()
    const cr = await ct.wait(15000)
    assert.equal(cr.exitCode, 0)
    assert.equal(cr.stdout, 'hello\n')
    await ct.close()

    const tty = await sb.startProcess('read line; echo got-$line; stty size', { tty: { rows: 12, cols: 34 } })
    assert.deepEqual((await sb.getProcess(tty)).tty, { rows: 12, cols: 34 })
    await sb.writeStdin(tty, 'it\n')
    const tt = await sb.attach(tty)
    assert.deepEqual(tt.tty, { rows: 12, cols: 34 })
    const tr = await tt.wait(15000)
    assert.ok(tr.ok && tr.stdout.includes('got-it') && tr.stdout.includes('12 34'), tr.stdout)
    await tt.close()
  } finally {
    await sb.delete()
  }
})

test('errors before anything starts, and a sandbox deleted under a terminal', async () => {
  const sb = await berth.create()
  try {
    await assert.rejects(sb.attach(99999), (e) => e instanceof NotFound && e.message.includes('99999'))
    for (const [rows, cols] of [[0, 80], [24, 20000]]) {
      await assert.rejects(sb.openTerminal(undefined, { rows, cols }), (e) => e instanceof InvalidArgument && e.message.includes('tty'))
    }
    await assert.rejects(sb.openTerminal(undefined, { env: { '': 'x' } }), InvalidArgument)
    await assert.rejects(new Sandbox(berth, { ...sb.info, id: 'sb-nosuchsandbox' }).openTerminal(), NotFound)
    await sb.stop()
    await assert.rejects(sb.openTerminal(), Conflict)
  } finally {
    await sb.delete()
  }
  const nobody = new Berth({ url: 'http://127.0.0.1:1' })
  await assert.rejects(new Sandbox(nobody, { ...sb.info, id: 'sb-x' }).attach(1), DaemonUnreachable)

  const gone = await berth.create()
  const term = await gone.openTerminal(['sleep', '100'])
  await gone.delete()
  // The process dies with the sandbox and says so, or the attachment ends with the reason.
  const events = []
  try {
    for await (const ev of term) events.push(ev)
    assert.equal(events.at(-1).type, 'exit', JSON.stringify(events.map((e) => e.type)))
  } catch (e) {
    assert.ok(e instanceof NotFound, String(e))
    assert.ok(e.message.includes(gone.id) && e.message.includes('deleted'), e.message)
    assert.deepEqual(events.map((ev) => ev.type), ['error'])
    assert.ok(events[0].error instanceof NotFound)
  }
  await term.close()
})

test('terminals over the unix socket', async () => {
  const local = new Berth({ url: daemon.socketUrl })
  try {
    const sb = await local.create()
    try {
      const term = await sb.openTerminal(['sh', '-c', 'echo via-$((40+2))'])
      const res = await term.wait(15000)
      assert.ok(res.ok && res.stdout.includes('via-42'), res.stdout)
      await term.close()
    } finally {
      await sb.delete()
    }
  } finally {
    local.close()
  }
})

test('one task reads while another writes; recv calls made together each get an event', async () => {
  const sb = await berth.create()
  try {
    const term = await sb.openTerminal(['/bin/sh'])
    const reading = (async () => {
      let out = ''
      for await (const chunk of term.output()) out += Buffer.from(chunk).toString()
      return out
    })()
    for (let i = 1; i <= 3; i++) {
      await term.write(`echo line-$((${i}*11))\n`)
      await sleep(50)
    }
    await term.write('exit 0\n')
    const out = await reading
    for (const want of ['line-11', 'line-22', 'line-33']) assert.ok(out.includes(want), out)
    assert.equal(term.result.exitCode, 0)

    const cat = await sb.attach(await sb.startProcess(['sh', '-c', 'echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three'], { openStdin: true }))
    const [a, b] = await Promise.all([cat.recv(10000), cat.recv(10000)])
    assert.ok(a && b, 'both got an event')
    const rest = []
    for await (const ev of cat) rest.push(ev)
    const text = [a, b, ...rest].filter((e) => e.type !== 'exit').map((e) => Buffer.from(e.data).toString()).join('')
    assert.ok(['one', 'two', 'three'].every((w) => text.includes(w)), text)
    assert.equal(rest.at(-1).type, 'exit')
    await cat.close()
  } finally {
    await sb.delete()
  }
})
