// Snapshots, forks, diff, apply, pause and resume through the SDK, against
// a daemon started here.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  Berth,
  MERGE_CONFLICT,
  AlreadyExists,
  Conflict,
  InvalidArgument,
  NotFound,
  NotImplementedByRuntime,
  Snapshot,
  Sandbox,
} from '../dist/index.js'
import { startDaemon } from './daemon.mjs'

const HOME = '/home/user'
let daemon, berth

before(async () => {
  daemon = await startDaemon({ prefix: 'tssnap-' })
  berth = new Berth({ url: daemon.url })
})

after(async () => {
  berth?.close()
  await daemon?.stop()
})

const name = (what) => `ts-${what}-${randomUUID().slice(0, 8)}`
const text = (b) => Buffer.from(b).toString('utf8')

async function deleting(sandboxes, fn) {
  try {
    return await fn()
  } finally {
    for (const sb of sandboxes) await sb.delete().catch((e) => (e instanceof NotFound ? undefined : Promise.reject(e)))
  }
}

function tarNames(bytes) {
  const dir = mkdtempSync(join(tmpdir(), 'tssnap-'))
  try {
    writeFileSync(join(dir, 'x.tar'), bytes)
    return execFileSync('tar', ['-tf', join(dir, 'x.tar')]).toString().split('\n').filter(Boolean)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

test('a snapshot made into sandboxes, listed, refused while in use, stacked, deleted', async () => {
  const n = name('notes')
  const sb = await berth.create({ labels: { suite: 'ts-snap' } })
  let snap
  try {
    await sb.write(`${HOME}/notes.txt`, 'taken before the snapshot\n')
    snap = await sb.snapshot(n, { labels: { suite: 'ts-snapshots', kind: 'notes' } })
    assert.ok(snap instanceof Snapshot)
    assert.ok(snap.id.startsWith('snap-'))
    assert.equal(snap.name, n)
    assert.equal(snap.sandbox, sb.id)
    assert.equal(snap.ref, `snapshot:${n}`)
    assert.deepEqual(snap.labels, { suite: 'ts-snapshots', kind: 'notes' })
    assert.ok(snap.sizeBytes > 0 && snap.frozenMs >= 0 && snap.createdAt)
    await sb.write(`${HOME}/later.txt`, 'after\n')
    await assert.rejects(sb.snapshot(n), AlreadyExists)
    await assert.rejects(sb.snapshot('no spaces allowed'), InvalidArgument)
  } finally {
    await sb.delete()
  }
  assert.ok((await berth.listSnapshots({ selector: 'suite=ts-snapshots' })).some((s) => s.name === n))
  assert.ok((await berth.listSnapshots({ kind: 'notes' })).some((s) => s.name === n))
  assert.ok(!(await berth.listSnapshots({ kind: 'other' })).some((s) => s.name === n))
  assert.deepEqual((await berth.getSnapshot(n)).inUse, [])
  assert.equal((await berth.getSnapshot(`snapshot:${n}`)).id, snap.id)

  const copy = await berth.create({ image: `snapshot:${n}` })
  const copy2 = await berth.create({ image: snap })
  await deleting([copy, copy2], async () => {
    assert.equal(text(await copy.download(`${HOME}/notes.txt`)), 'taken before the snapshot\n')
    assert.equal(text(await copy2.download(`${HOME}/notes.txt`)), 'taken before the snapshot\n')
    assert.equal(await copy.exists(`${HOME}/later.txt`), false)
    assert.deepEqual((await berth.getSnapshot(n)).inUse.sort(), [copy.id, copy2.id].sort())
    await assert.rejects(berth.deleteSnapshot(n), (e) => e instanceof Conflict && e.message.includes(copy.id))
    const child = await copy.snapshot(name('child'))
    assert.equal(child.parent, snap.id)
    await berth.deleteSnapshot(child)
  })
  await berth.deleteSnapshot(n)
  await assert.rejects(berth.getSnapshot(n), NotFound)
  await assert.rejects(berth.deleteSnapshot(n), NotFound)
})

test('three forks: the files, none of the processes, their own labels', async () => {
  const sb = await berth.create({ labels: { role: 'source' } })
  try {
    await sb.write(`${HOME}/work.txt`, 'state to branch from\n')
    const pid = await sb.startProcess(['sleep', '300'])
    const forks = await sb.fork(3, { labels: [0, 1, 2].map((i) => ({ branch: String(i) })) })
    await deleting(forks, async () => {
      assert.equal(forks.length, 3)
      assert.ok(forks.every((f) => f instanceof Sandbox && f.ephemeral))
      assert.ok(forks.snapshot.startsWith('snap-') && forks.frozenMs >= 0)
      assert.equal(new Set([sb.id, ...forks.map((f) => f.id)]).size, 4)
      for (const [i, f] of forks.entries()) {
        assert.equal(f.info.state, 'running')
        assert.deepEqual(f.info.labels, { branch: String(i), 'berth.fork_of': sb.id })
        assert.equal(text(await f.download(`${HOME}/work.txt`)), 'state to branch from\n')
        assert.deepEqual(await f.listProcesses(), [])
      }
      await forks[0].write(`${HOME}/work.txt`, 'branch 0\n')
      assert.equal(text(await forks[1].download(`${HOME}/work.txt`)), 'state to branch from\n')
      assert.equal(text(await sb.download(`${HOME}/work.txt`)), 'state to branch from\n')
      assert.ok((await sb.getProcess(pid)).running)
      const listed = await berth.list({ selector: `berth.fork_of=${sb.id}` })
      assert.deepEqual(listed.map((s) => s.id).sort(), forks.map((f) => f.id).sort())
    })
    const more = await sb.fork(2, { labels: { batch: 'b' } })
    const one = await sb.fork()
    await deleting([...more, ...one], async () => {
      assert.deepEqual(more.map((f) => f.info.labels.batch), ['b', 'b'])
      assert.equal(one.length, 1)
      assert.deepEqual(one[0].info.labels, { 'berth.fork_of': sb.id })
    })
    await assert.rejects(sb.fork(1, { labels: [{ a: '1' }, { a: '2' }] }), InvalidArgument)
  } finally {
    await sb.delete()
  }
})

test('diff as JSON, as a patch and as a layer tar', async () => {
  const sb = await berth.create()
  try {
    await sb.write(`${HOME}/keep.txt`, 'one\ntwo\nthree\n')
    await sb.write(`${HOME}/gone.txt`, 'bye\n')
    const base = await sb.snapshot(name('diff-base'))
    await sb.write(`${HOME}/keep.txt`, 'one\nTWO\nthree\n')
    await sb.remove(`${HOME}/gone.txt`)
    await sb.write(`${HOME}/new.txt`, 'hello\n')

    const d = await sb.diff(base.name)
    assert.equal(d.against, `snapshot:${base.name}`)
    assert.deepEqual(Object.fromEntries(d.changes.map((c) => [c.path, c.kind])), {
      [`${HOME}/keep.txt`]: 'modified',
      [`${HOME}/gone.txt`]: 'deleted',
      [`${HOME}/new.txt`]: 'added',
    })
    assert.deepEqual(d.paths('added'), [`${HOME}/new.txt`])
    const added = d.changes.find((c) => c.path === `${HOME}/new.txt`)
    assert.deepEqual([added.type, added.size, added.mode, added.uid], ['file', 6, 0o644, 1000])
    assert.deepEqual((await sb.diff(base)).changes, d.changes)
    assert.deepEqual((await sb.diff(base.ref)).changes, d.changes)
    const vsImage = await sb.diff()
    assert.equal(vsImage.against, sb.info.image)
    assert.ok(vsImage.paths().includes(`${HOME}/new.txt`))
    assert.ok(!vsImage.paths().includes(`${HOME}/gone.txt`))

    const patch = await sb.diffPatch(base)
    for (const want of ['-two\n', '+TWO\n', '+hello\n', '-bye\n', '+++ b/home/user/new.txt', 'deleted file mode']) {
      assert.ok(patch.includes(want), `${JSON.stringify(want)} not in ${patch}`)
    }
    const names = tarNames(await sb.diffTar(base))
    for (const want of ['home/user/.wh.gone.txt', 'home/user/new.txt', 'home/user/keep.txt']) assert.ok(names.includes(want), names.join(' '))
    await assert.rejects(sb.diff('no-such-snapshot'), NotFound)
    await berth.deleteSnapshot(base)
  } finally {
    await sb.delete()
  }
})

test('apply merges, refuses a conflict naming its paths, overwrites; applyTar', async () => {
  const sb = await berth.create()
  let snap
  try {
    await sb.write(`${HOME}/shared.txt`, 'original\n')
    const [a, b] = await sb.fork(2)
    await deleting([a, b], async () => {
      await a.write(`${HOME}/shared.txt`, 'from a\n')
      await a.write(`${HOME}/a.txt`, 'only in a\n')
      await b.write(`${HOME}/shared.txt`, 'from b\n')
      await b.write(`${HOME}/b.txt`, 'only in b\n')

      let res = await sb.apply(a)
      assert.deepEqual(Object.fromEntries(res.changes.map((c) => [c.path, c.kind])), {
        [`${HOME}/shared.txt`]: 'modified',
        [`${HOME}/a.txt`]: 'added',
      })
      assert.deepEqual(res.conflicts, [])
      assert.ok(res.entries >= 2)
      assert.equal(text(await sb.download(`${HOME}/shared.txt`)), 'from a\n')

      const err = await sb.apply(b.id).catch((e) => e)
      assert.ok(err instanceof Conflict, String(err))
      assert.equal(err.reason, MERGE_CONFLICT)
      assert.equal(err.status, 409)
      assert.deepEqual(err.paths, [`${HOME}/shared.txt`])
      assert.equal(await sb.exists(`${HOME}/b.txt`), false)

      res = await sb.apply(b, { overwrite: true })
      assert.deepEqual(res.conflicts, [`${HOME}/shared.txt`])
      assert.equal(text(await sb.download(`${HOME}/shared.txt`)), 'from b\n')
      assert.equal(text(await sb.download(`${HOME}/b.txt`)), 'only in b\n')

      await a.write(`${HOME}/from-snapshot.txt`, 'snap\n')
      snap = await a.snapshot(name('apply'))
      await assert.rejects(sb.apply(snap.ref), (e) => e instanceof Conflict && e.paths.join() === `${HOME}/shared.txt`)
      res = await sb.apply(snap, { overwrite: true })
      assert.equal(text(await sb.download(`${HOME}/from-snapshot.txt`)), 'snap\n')
      await a.remove(`${HOME}/a.txt`)
      res = await sb.applyTar(await a.diffTar(snap))
      assert.equal(res.whiteouts, 1)
      assert.equal(await sb.exists(`${HOME}/a.txt`), false)

      await assert.rejects(sb.apply(sb), InvalidArgument)
      await assert.rejects(sb.apply(42), InvalidArgument)
    })
    await berth.deleteSnapshot(snap)
  } finally {
    await sb.delete()
  }
})

test('pause freezes, refuses exec, resume thaws; pause with memory where the runtime cannot is NotImplementedByRuntime', async () => {
  const sb = await berth.create()
  try {
    const pid = await sb.startProcess(['sleep', '300'])
    const info = await sb.pause()
    assert.equal(info.state, 'paused')
    assert.equal(sb.info.state, 'paused')
    assert.equal((await berth.get(sb.id)).info.state, 'paused')
    await assert.rejects(sb.exec('true'), (e) => e instanceof Conflict && e.message.includes('paused'))
    assert.equal((await sb.resume()).state, 'running')
    assert.ok((await sb.getProcess(pid)).running)
    assert.equal((await sb.exec('echo back')).stdout, 'back\n')
    const rt = (await berth.runtimes()).find((r) => r.name === sb.info.runtime)
    if (!rt.capabilities.memory_checkpoint) {
      await assert.rejects(sb.pause({ memory: true }), (e) => e instanceof NotImplementedByRuntime && e.status === 501)
    } else {
      assert.equal((await sb.pause({ memory: true })).raw.checkpointed, true)
      assert.equal((await sb.resume()).state, 'running')
    }
  } finally {
    await sb.delete()
  }
})
