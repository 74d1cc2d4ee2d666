// BerthSandbox, berth's deepagents backend, against a real daemon: the
// behaviours deepagents' sandbox standard tests check (command execution,
// upload and download, write, read, edit, ls, grep, glob, workflows: the
// package @langchain/sandbox-standard-tests is not published on npm, so
// they are checked here), those berth's Python backend is held to, and
// berth's own: a stopped sandbox started on the next call, a deleted one
// explained, deepagents' own directories made writable for the sandbox's
// user, fork. Most tests share one sandbox, each under its own directory.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { isSandboxBackend } from 'deepagents'
import { Berth, BerthError, NotFound, Sandbox } from '../dist/index.js'
import { BerthSandbox, DEEPAGENTS_DIRS, DEFAULT_TIMEOUT_MS } from '../dist/deepagents.js'
import { startDaemon, freePort, repo, sleep } from './daemon.mjs'

const enc = (s) => new TextEncoder().encode(s)
const dec = (b) => new TextDecoder().decode(b)
const lines = (n, f) => Array.from({ length: n }, (_, i) => f(i)).join('\n')

let daemon, client, shared, backend
const base = '/home/user/std'
const at = (name) => `${base}/${name}`
const cat = async (path) => (await backend.execute(`cat '${path}'`)).output

before(async () => {
  daemon = await startDaemon({ prefix: 'tsda-' })
  client = new Berth({ url: daemon.url })
  backend = await BerthSandbox.create({ client, labels: { suite: 'deepagents-js' } })
  shared = backend.sandbox
})

after(async () => {
  // Every sandbox goes, a failed test's too: a sandbox outlives its daemon.
  if (client) for (const s of await client.list()) await client.delete(s.id).catch(() => {})
  client?.close()
  await daemon?.stop()
})

describe('the backend', () => {
  it('is a deepagents sandbox backend with the sandbox id, made by create and kept', async () => {
    assert.equal(isSandboxBackend(backend), true)
    assert.equal(typeof backend.id, 'string')
    assert.match(backend.id, /^sb-/)
    assert.equal(backend.id, shared.id)
    assert.deepEqual(shared.info.labels, { suite: 'deepagents-js' })
    assert.equal(shared.ephemeral, false)
    const again = await client.get(backend.id)
    assert.equal(again.info.state, 'running')
  })

  it('says whether it is running, and close deletes the sandbox', async () => {
    assert.equal(backend.isRunning, true)
    const b = await BerthSandbox.create({ client })
    assert.equal(b.isRunning, true)
    await b.close()
    assert.equal(b.isRunning, false)
    await assert.rejects(client.get(b.id), NotFound)
    await b.close() // once more: already gone
  })

  it('refuses bad options with errors that name them', () => {
    assert.throws(() => new BerthSandbox({}), (e) => e instanceof TypeError && /sandbox is required/.test(e.message))
    assert.throws(() => new BerthSandbox({ sandbox: shared, timeoutMs: 0 }), (e) => e instanceof RangeError && /timeoutMs/.test(e.message))
    assert.equal(DEFAULT_TIMEOUT_MS, 30 * 60 * 1000)
  })

  it('checks against deepagents’ own type declarations, and so does the code of docs/deepagents-js.md', async () => {
    // The page's TypeScript blocks, each a module, compiled with test/deepagents-types.ts.
    const pkg = join(repo, 'sdk/typescript')
    const blocks = [...readFileSync(join(repo, 'docs/deepagents-js.md'), 'utf8').matchAll(/^```ts\n([^]*?)^```$/gm)].map((m) => m[1])
    assert.ok(blocks.length >= 3, `${blocks.length} TypeScript blocks in the page`)
    const dir = join(pkg, 'dist/deepagents-docs')
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir, { recursive: true })
    blocks.forEach((code, i) => writeFileSync(join(dir, `block-${i + 1}.ts`), code))
    const tsc = join(pkg, 'node_modules/typescript/bin/tsc')
    try {
      await promisify(execFile)(process.execPath, [tsc, '-p', join(pkg, 'test/deepagents-types.tsconfig.json')], { cwd: pkg })
    } catch (e) {
      assert.fail(`tsc: ${e.stdout}${e.stderr}`)
    } finally {
      rmSync(dir, { recursive: true, force: true }) // dist/ is what the package ships
    }
  })
})

describe('execute', () => {
  it('runs a command and answers its output and exit code', async () => {
    const r = await backend.execute('echo "hello"')
    assert.deepEqual(r, { output: 'hello\n', exitCode: 0, truncated: false })
    assert.equal((await backend.execute('exit 42')).exitCode, 42)
    const m = await backend.execute('echo line1 && echo line2 && echo line3')
    assert.equal(m.output, 'line1\nline2\nline3\n')
  })

  it('includes standard error, runs as the sandbox user, keeps the shell’s variables', async () => {
    const r = await backend.execute('echo "error message" >&2; id -un')
    assert.match(r.output, /error message/)
    assert.match(r.output, /^user$/m)
    const v = await backend.execute('export MY_VAR="test_value" && echo $MY_VAR')
    assert.equal(v.output.trim(), 'test_value')
  })

  it('answers a missing command with sh’s exit code and message', async () => {
    const r = await backend.execute('nonexistent_command_12345')
    assert.equal(r.exitCode, 127)
    assert.match(r.output, /not found/)
  })

  it('kills a command at its timeout and says so (exit 124, output kept)', async () => {
    const t0 = Date.now()
    const r = await backend.execute('echo started; sleep 30', { timeoutMs: 1000 })
    assert.ok(Date.now() - t0 < 15000, 'the timeout bounds the call')
    assert.equal(r.exitCode, 124)
    assert.match(r.output, /^started\n/)
    assert.match(r.output, /timed out after 1 seconds/)
    await assert.rejects(backend.execute('true', { timeoutMs: -1 }), RangeError)
  })

  it('bounds output with maxOutputBytes and says it was truncated', async () => {
    const small = new BerthSandbox({ sandbox: shared, maxOutputBytes: 1000 })
    const r = await small.execute('head -c 5000 /dev/zero | tr "\\0" x')
    assert.equal(r.truncated, true)
    assert.equal(r.output.length, 1000)
  })
})

describe('execute at the memory limit', () => {
  // On gvisor the limit bounds the whole sandbox, which berth then stops:
  // the next call starts it again.
  it('says the sandbox ran out of memory when berth reports the command OOM-killed; the next call runs', async () => {
    const b = await BerthSandbox.create({ client, memory: 64 << 20, logger: null })
    try {
      const r = await b.execute('exec python3 -c "x = bytearray(512 << 20)"')
      assert.equal(r.exitCode, 137)
      assert.match(r.output, /Error: the command was killed because the sandbox ran out of memory\.$/)
      let next = await b.execute('echo still here')
      if (process.env.BERTH_TEST_RUNTIME === 'gvisor' && next.exitCode === null) {
        // The call met the guest gone before the daemon had stopped the
        // sandbox: it may have run, so it is not made again.
        assert.match(next.output, /^Error executing command: the sandbox stopped while this ran/)
        next = await b.execute('echo still here')
      }
      assert.deepEqual(next, { output: 'still here\n', exitCode: 0, truncated: false })
    } finally {
      await b.sandbox.delete()
    }
  })
})

describe('initialFiles', () => {
  it('creates the sandbox with its files, parents made, text or bytes', async () => {
    const b = await BerthSandbox.create({
      client,
      initialFiles: {
        '/home/user/init-test.txt': 'Hello from initial file!',
        '/home/user/src/components/Button/index.tsx': 'export const Button = () => <button>Click</button>;',
        '/home/user/init-script.sh': '#!/bin/sh\necho "Hello from initialFiles script"',
        '/home/user/data.bin': new Uint8Array([0, 1, 2]),
      },
    })
    try {
      assert.equal((await b.execute('cat /home/user/init-test.txt')).output, 'Hello from initial file!')
      assert.equal((await b.read('/home/user/src/components/Button/index.tsx')).content, 'export const Button = () => <button>Click</button>;')
      assert.deepEqual(await b.execute('sh /home/user/init-script.sh'), { output: 'Hello from initialFiles script\n', exitCode: 0, truncated: false })
      assert.deepEqual([...(await b.downloadFiles(['/home/user/data.bin']))[0].content], [0, 1, 2])
      assert.deepEqual((await b.ls('/home/user/src/components')).files.map((f) => f.path), ['/home/user/src/components/Button/'])
    } finally {
      await b.sandbox.delete()
    }
    const empty = await BerthSandbox.create({ client, initialFiles: {} })
    assert.equal((await empty.execute('echo Works!')).output, 'Works!\n')
    await empty.sandbox.delete()
  })

  it('deletes the sandbox and names the path when a file cannot be written', async () => {
    await assert.rejects(
      BerthSandbox.create({ client, labels: { case: 'init-fails' }, initialFiles: { '/home/user/ok.txt': 'x', '/root/no.txt': 'x' } }),
      (e) => e instanceof BerthError && e.code === 'permission_denied' && e.message.startsWith('initialFiles: /root/no.txt: ') && e.paths[0] === '/root/no.txt',
    )
    assert.deepEqual(await client.list({ case: 'init-fails' }), [])
    await assert.rejects(
      BerthSandbox.create({ client, labels: { case: 'init-relative' }, initialFiles: { 'relative.txt': 'x' } }),
      (e) => e instanceof BerthError && e.code === 'invalid_argument' && /initialFiles: "relative.txt" is not an absolute path/.test(e.message),
    )
    assert.deepEqual(await client.list({ case: 'init-relative' }), [])
  })
})

describe('uploadFiles and downloadFiles', () => {
  it('uploads files and downloads them, in order', async () => {
    const up = await backend.uploadFiles([
      [at('up/multi1.txt'), enc('Content 1')],
      [at('up/multi2.txt'), enc('Content 2')],
      [at('up/bytes.bin'), new Uint8Array([0, 1, 2, 255])],
    ])
    assert.deepEqual(
      up.map((r) => [r.path, r.error]),
      [
        [at('up/multi1.txt'), null],
        [at('up/multi2.txt'), null],
        [at('up/bytes.bin'), null],
      ],
    )
    assert.equal(await cat(at('up/multi1.txt')), 'Content 1')
    const down = await backend.downloadFiles([at('up/multi2.txt'), at('up/bytes.bin')])
    assert.equal(dec(down[0].content), 'Content 2')
    assert.equal(down[0].error, null)
    assert.deepEqual([...down[1].content], [0, 1, 2, 255])
  })

  it('answers each failing file with deepagents’ code, the others succeeding', async () => {
    const up = await backend.uploadFiles([
      ['relative.txt', enc('x')],
      [at('up'), enc('x')],
      ['/root/forbidden.txt', enc('x')],
      [at('up/ok.txt'), enc('ok')],
    ])
    assert.deepEqual(
      up.map((r) => r.error),
      ['invalid_path', 'is_directory', 'permission_denied', null],
    )
    const down = await backend.downloadFiles([at('nonexistent-file-12345.txt'), 'relative.txt', at('up'), at('up/ok.txt')])
    assert.deepEqual(
      down.map((r) => [r.error, r.content === null]),
      [
        ['file_not_found', true],
        ['invalid_path', true],
        ['is_directory', true],
        [null, false],
      ],
    )
  })
})

describe('write', () => {
  it('writes new files, making parents, and overwrites', async () => {
    const content = 'Hello, sandbox!\nLine 2\nLine 3'
    assert.deepEqual(await backend.write(at('wt-new.txt'), content), { path: at('wt-new.txt'), filesUpdate: null })
    assert.equal(await cat(at('wt-new.txt')), content)
    assert.equal((await backend.write(at('wt-parents/deep/nested/dir/file.txt'), 'Nested')).error, undefined)
    assert.equal(await cat(at('wt-parents/deep/nested/dir/file.txt')), 'Nested')
    await backend.write(at('wt-existing.txt'), 'First content')
    assert.equal((await backend.write(at('wt-existing.txt'), 'Second content')).error, undefined)
    assert.equal(await cat(at('wt-existing.txt')), 'Second content')
  })

  it('keeps content exactly: shell characters, unicode, empty, only newlines, 1000 lines', async () => {
    const cases = {
      'wt-special.txt': 'Special chars: $VAR, `command`, $(subshell)\nTab\there\nBackslash: \\',
      'wt-unicode.txt': 'Hello 👋 世界 مرحبا Привет 🌍\nLine with émojis 🎉',
      'wt-empty.txt': '',
      'wt-newlines.txt': '\n\n\n\n\n',
      'wt-long.txt': lines(1000, (i) => `Line ${i} with some content here`),
      'wt-spaces/dir with spaces/file name.txt': 'Content in file with spaces',
    }
    for (const [name, content] of Object.entries(cases)) {
      assert.equal((await backend.write(at(name), content)).error, undefined, name)
    }
    const got = await backend.downloadFiles(Object.keys(cases).map(at))
    got.forEach((r, i) => assert.equal(dec(r.content), Object.values(cases)[i], r.path))
    assert.equal((await backend.execute(`wc -l < ${at('wt-newlines.txt')}`)).output.trim(), '5')
  })

  it('normalizes consecutive slashes', async () => {
    assert.equal((await backend.write(`${base}//wt-slashes///file.txt`, 'Content')).error, undefined)
    assert.equal(await cat(at('wt-slashes/file.txt')), 'Content')
  })

  it('decodes base64 for a binary type, as deepagents’ backends do', async () => {
    const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 1, 2, 3])
    assert.equal((await backend.write(at('img/pixel.png'), Buffer.from(png).toString('base64'))).error, undefined)
    const [r] = await backend.downloadFiles([at('img/pixel.png')])
    assert.deepEqual([...r.content], [...png])
  })

  it('explains a refused write', async () => {
    assert.match((await backend.write(at('up'), 'x')).error, /Failed to write to .*: it is a directory/)
    assert.match((await backend.write('/etc/berth-test.txt', 'x')).error, /Failed to write to \/etc\/berth-test.txt: permission denied/)
  })
})

describe('read', () => {
  it('reads the lines of a text file with pagination fields', async () => {
    await backend.write(at('rd-basic.txt'), 'Line 1\nLine 2\nLine 3')
    assert.deepEqual(await backend.read(at('rd-basic.txt')), {
      content: 'Line 1\nLine 2\nLine 3',
      mimeType: 'text/plain',
      totalLines: 3,
      startLine: 1,
      endLine: 3,
    })
  })

  it('pages by offset and limit', async () => {
    await backend.write(at('rd-offset.txt'), lines(20, (i) => `Row_${i + 1}_content`))
    const r = await backend.read(at('rd-offset.txt'), 10, 5)
    assert.equal(r.content, lines(5, (i) => `Row_${i + 11}_content`))
    assert.deepEqual([r.startLine, r.endLine, r.totalLines, r.nextOffset], [11, 15, 20, 15])
    const first = await backend.read(at('rd-offset.txt'), 0, 5)
    assert.match(first.content, /^Row_1_content\n[^]*Row_5_content$/)
    assert.doesNotMatch(first.content, /Row_6_/)
    const tail = await backend.read(at('rd-offset.txt'), 5)
    assert.match(tail.content, /^Row_6_content/)
    assert.equal(tail.nextOffset, undefined)
  })

  it('reads a large file in chunks', async () => {
    await backend.write(at('rd-chunked.txt'), lines(1000, (i) => `Line_${String(i).padStart(4, '0')}_content`))
    for (const start of [0, 500, 900]) {
      const r = await backend.read(at('rd-chunked.txt'), start, 100)
      const want = lines(100, (i) => `Line_${String(start + i).padStart(4, '0')}_content`)
      assert.equal(r.content, want)
    }
  })

  it('answers a missing file, an empty one, limit 0 and an offset past the end as deepagents does', async () => {
    assert.deepEqual(await backend.read(at('rd-nonexistent-xyz.txt')), { error: `File '${at('rd-nonexistent-xyz.txt')}' not found` })
    await backend.write(at('rd-empty.txt'), '')
    assert.deepEqual(await backend.read(at('rd-empty.txt')), {
      content: 'System reminder: File exists but has empty contents',
      mimeType: 'text/plain',
    })
    await backend.write(at('rd-three.txt'), 'Line 1\nLine 2\nLine 3')
    assert.deepEqual(await backend.read(at('rd-three.txt'), 0, 0), { content: '', mimeType: 'text/plain' })
    assert.deepEqual(await backend.read(at('rd-three.txt'), 100, 10), { error: 'Line offset 100 exceeds file length (3 lines)' })
    assert.deepEqual(await backend.read(at('rd-three.txt'), 3, 10), { error: 'Line offset 3 exceeds file length (3 lines)' })
  })

  it('reads unicode and very long lines whole', async () => {
    const long = 'x'.repeat(300_000)
    await backend.write(at('rd-unicode.txt'), `Hello 👋 世界\nПривет мир\n${long}\nend`)
    const r = await backend.read(at('rd-unicode.txt'))
    assert.equal(r.content, `Hello 👋 世界\nПривет мир\n${long}\nend`)
  })

  it('returns a binary type (by extension) as bytes, and refuses a directory or binary data as text', async () => {
    const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 9])
    await backend.uploadFiles([[at('rd/image.png'), png], [at('rd/data.txt'), new Uint8Array([104, 0, 105])]])
    const img = await backend.read(at('rd/image.png'))
    assert.equal(img.mimeType, 'image/png')
    assert.ok(img.content instanceof Uint8Array)
    assert.deepEqual([...img.content], [...png])
    assert.match((await backend.read(at('rd'))).error, /is a directory/)
    assert.match((await backend.read(at('rd/data.txt'))).error, /binary data \(3 bytes\)/)
    assert.deepEqual(await backend.read(at('rd/missing.png')), { error: `File '${at('rd/missing.png')}' not found` })
  })

  it('readRaw gives deepagents’ FileData: text as a string, a binary type as bytes', async () => {
    await backend.write(at('raw.md'), '# title\n')
    const t = await backend.readRaw(at('raw.md'))
    assert.equal(t.data.content, '# title\n')
    assert.equal(t.data.mimeType, 'text/markdown')
    assert.match(t.data.modified_at, /^\d{4}-\d\d-\d\dT/)
    const b = await backend.readRaw(at('rd/image.png'))
    assert.ok(b.data.content instanceof Uint8Array)
    assert.match((await backend.readRaw(at('nope.md'))).error, /not found/)
  })
})

describe('edit', () => {
  it('replaces one occurrence and says how many', async () => {
    await backend.write(at('ed-single.txt'), 'Hello world\nGoodbye world\nHello again')
    assert.deepEqual(await backend.edit(at('ed-single.txt'), 'Goodbye', 'Farewell'), {
      path: at('ed-single.txt'),
      filesUpdate: null,
      occurrences: 1,
    })
    assert.equal(await cat(at('ed-single.txt')), 'Hello world\nFarewell world\nHello again')
  })

  it('refuses several occurrences without replaceAll, leaving the file as it was', async () => {
    await backend.write(at('ed-multi.txt'), 'apple\nbanana\napple\norange\napple')
    const r = await backend.edit(at('ed-multi.txt'), 'apple', 'pear', false)
    assert.match(r.error.toLowerCase(), /multiple/)
    assert.match(r.error, /replace_all=true/)
    assert.equal(await cat(at('ed-multi.txt')), 'apple\nbanana\napple\norange\napple')
    assert.equal((await backend.edit(at('ed-multi.txt'), 'apple', 'pear', true)).occurrences, 3)
    assert.equal(await cat(at('ed-multi.txt')), 'pear\nbanana\npear\norange\npear')
  })

  it('says what was not found: the string, or the file', async () => {
    await backend.write(at('ed-nf.txt'), 'Hello world')
    assert.equal((await backend.edit(at('ed-nf.txt'), 'nonexistent', 'x')).error, `Error: String not found in file '${at('ed-nf.txt')}': 'nonexistent'`)
    assert.equal((await backend.edit(at('ed-none.txt'), 'old', 'new')).error, `Error: File '${at('ed-none.txt')}' not found`)
    const long = 'z'.repeat(5000)
    assert.ok((await backend.edit(at('ed-nf.txt'), long, 'x')).error.length < 400, 'a long string is not echoed whole')
  })

  it('handles special characters, multiline, deletion, identity, unicode, whitespace and long strings', async () => {
    const f = at('ed-misc.txt')
    await backend.write(f, 'Price: $100.00\nPattern: [a-z]*\nLine 1\nLine 2\nDelete this part\nSame\nHi 👋\nA    B\n' + 'x'.repeat(1000) + '\nend\n')
    const steps = [
      ['$100.00', '$200.00'],
      ['[a-z]*', '[0-9]+'],
      ['Line 1\nLine 2', 'Combined'],
      ['Delete this part\n', ''],
      ['Same', 'Same'],
      ['👋', '🌍'],
      ['    ', ' '],
      ['x'.repeat(1000), 'y'.repeat(1000)],
    ]
    for (const [o, n] of steps) {
      const r = await backend.edit(f, o, n)
      assert.equal(r.error, undefined, JSON.stringify(o))
      assert.equal(r.occurrences, 1, JSON.stringify(o))
    }
    assert.equal(
      (await backend.read(f, 0, 100)).content,
      'Price: $200.00\nPattern: [0-9]+\nCombined\nSame\nHi 🌍\nA B\n' + 'y'.repeat(1000) + '\nend',
    )
  })

  it('fills an empty file from an empty old string, and refuses one on a file with content', async () => {
    await backend.write(at('ed-empty.txt'), '')
    assert.equal((await backend.edit(at('ed-empty.txt'), '', 'first')).occurrences, 1)
    assert.equal(await cat(at('ed-empty.txt')), 'first')
    assert.match((await backend.edit(at('ed-empty.txt'), '', 'again')).error, /must not be empty/)
  })
})

describe('ls', () => {
  it('lists files and directories with absolute paths, directories ending with /', async () => {
    const d = at('li-basic')
    await backend.write(`${d}/file1.txt`, 'content1')
    await backend.write(`${d}/file2.txt`, 'content22')
    await backend.write(`${d}/.hidden`, 'h')
    await backend.execute(`mkdir -p '${d}/subdir' '${d}/dir with spaces'`)
    const r = await backend.ls(d)
    assert.equal(r.error, undefined)
    assert.deepEqual(
      r.files.map((f) => [f.path, f.is_dir]).sort(),
      [
        [`${d}/.hidden`, false],
        [`${d}/dir with spaces/`, true],
        [`${d}/file1.txt`, false],
        [`${d}/file2.txt`, false],
        [`${d}/subdir/`, true],
      ],
    )
    const f2 = r.files.find((f) => f.path.endsWith('file2.txt'))
    assert.equal(f2.size, 9)
    assert.ok(!Number.isNaN(Date.parse(f2.modified_at)))
    assert.deepEqual((await backend.ls(`${d}/`)).files.length, 5)
  })

  it('lists an empty directory, a missing one and a file as empty', async () => {
    await backend.execute(`mkdir -p ${at('li-empty')}`)
    assert.deepEqual(await backend.ls(at('li-empty')), { files: [] })
    assert.deepEqual(await backend.ls(at('li-does-not-exist-12345')), { files: [] })
    assert.deepEqual(await backend.ls(at('wt-new.txt')), { files: [] })
  })

  it('lists unicode and special names, and a large directory', async () => {
    const d = at('li-names')
    for (const n of ['测试文件.txt', 'файл.txt', 'file(1).txt', 'file-3.txt']) await backend.write(`${d}/${n}`, 'c')
    assert.equal((await backend.ls(d)).files.length, 4)
    const big = at('li-large')
    await backend.execute(`mkdir -p '${big}' && cd '${big}' && for i in $(seq 0 49); do echo c > file_$(printf '%03d' $i).txt; done`)
    const paths = (await backend.ls(big)).files.map((f) => f.path)
    assert.equal(paths.length, 50)
    assert.ok(paths.includes(`${big}/file_000.txt`) && paths.includes(`${big}/file_049.txt`))
  })

  it('explains a directory it may not read', async () => {
    await backend.execute(`mkdir -p ${at('li-locked')} && touch ${at('li-locked/x')} && chmod 000 ${at('li-locked')}`)
    const r = await backend.ls(at('li-locked'))
    assert.match(r.error, /Cannot list .*li-locked/)
    assert.match(r.error, /permission_denied/)
  })
})

describe('grep', () => {
  before(async () => {
    await backend.uploadFiles([
      [at('gr/file1.txt'), enc('Hello world\nGoodbye world')],
      [at('gr/file2.txt'), enc('Hello there\nGoodbye friend')],
      [at('gr/fruits.py'), enc('apple\nbanana\napple\norange\napple')],
      [at('gr/special.md'), enc('Price: $100\nPattern: [a-z]*\nHello\nhello\nHELLO\nHello 世界')],
      [at('gr/sub1/sub2/deep.txt'), enc('target_nested here')],
      [at('gr/long.txt'), enc(lines(100, (i) => `Line ${i + 1}`))],
    ])
  })

  it('finds literal, case-sensitive matches with absolute paths and line numbers', async () => {
    const r = await backend.grep('Hello', at('gr'))
    assert.equal(r.error, undefined)
    assert.deepEqual(
      r.matches.map((m) => [m.path, m.line, m.text]),
      [
        [at('gr/file1.txt'), 1, 'Hello world'],
        [at('gr/file2.txt'), 1, 'Hello there'],
        [at('gr/special.md'), 3, 'Hello'],
        [at('gr/special.md'), 6, 'Hello 世界'],
      ],
    )
    assert.deepEqual(
      (await backend.grep('apple', at('gr'))).matches.map((m) => m.line),
      [1, 3, 5],
    )
    assert.equal((await backend.grep('$100', at('gr'))).matches.length, 1)
    assert.equal((await backend.grep('[a-z]*', at('gr'))).matches[0].text, 'Pattern: [a-z]*')
    assert.equal((await backend.grep('世界', at('gr'))).matches.length, 1)
    assert.equal((await backend.grep('Line 50', at('gr'))).matches[0].line, 50)
    assert.equal((await backend.grep('target_nested', at('gr'))).matches[0].path, at('gr/sub1/sub2/deep.txt'))
  })

  it('filters files by a glob on their names, at any depth', async () => {
    assert.deepEqual(
      (await backend.grep('apple', at('gr'), '*.py')).matches.map((m) => m.path),
      [at('gr/fruits.py'), at('gr/fruits.py'), at('gr/fruits.py')],
    )
    assert.equal((await backend.grep('target', at('gr'), '*.txt')).matches.length, 1)
    assert.equal((await backend.grep('apple', at('gr'), '*.txt')).matches.length, 0)
  })

  it('caps matches at maxCount and says the answer was truncated', async () => {
    const r = await backend.grep('apple', at('gr'), null, 2)
    assert.equal(r.matches.length, 2)
    assert.equal(r.truncated, true)
    assert.equal((await backend.grep('apple', at('gr'), null, 3)).truncated, false)
  })

  it('searches the sandbox’s working directory (/home/user) when given no path', async () => {
    assert.deepEqual(
      (await backend.grep('target_nested')).matches.map((m) => m.path),
      [at('gr/sub1/sub2/deep.txt')],
    )
    await backend.execute('echo target_nested > /tmp/outside.txt')
    assert.equal((await backend.grep('target_nested', null, '*.txt')).matches.length, 1)
  })

  it('answers no matches as an empty list, and a missing path as an error', async () => {
    assert.deepEqual(await backend.grep('nonexistent_str', at('gr')), { matches: [], truncated: false })
    await backend.execute(`mkdir -p ${at('gr-empty')}`)
    assert.deepEqual((await backend.grep('anything', at('gr-empty'))).matches, [])
    assert.deepEqual(await backend.grep('x', at('gr-missing')), { error: `Path '${at('gr-missing')}' not found` })
  })
})

describe('glob', () => {
  before(async () => {
    const files = ['file1.txt', 'file2.txt', 'file3.txt', 'fileA.txt', 'file10.txt', 'test.py', 'test.md', '.hidden1', 'sub1/nested1.txt', 'sub2/nested2.txt', 'a/b/c/d/deep.txt']
    await backend.uploadFiles(files.map((f) => [at(`gl/${f}`), enc('content')]))
    await backend.execute(`mkdir -p ${at('gl/emptydir')}`)
  })
  const names = (r) => r.files.map((f) => f.path.slice(at('gl/').length)).sort()

  it('matches names in the searched directory only for a pattern without /, absolute paths, files only', async () => {
    const r = await backend.glob('*.txt', at('gl'))
    assert.equal(r.error, undefined)
    assert.deepEqual(names(r), ['file1.txt', 'file10.txt', 'file2.txt', 'file3.txt', 'fileA.txt'])
    assert.ok(r.files.every((f) => f.path.startsWith(at('gl/')) && f.is_dir === false && f.size === 7))
    assert.deepEqual(names(await backend.glob('*', at('gl'))).includes('emptydir'), false)
    assert.deepEqual(names(await backend.glob('*.py', at('gl'))), ['test.py'])
  })

  it('matches across directories with **, character classes, ? and explicit dot files', async () => {
    assert.deepEqual(names(await backend.glob('**/*.txt', at('gl'))), [
      'a/b/c/d/deep.txt',
      'file1.txt',
      'file10.txt',
      'file2.txt',
      'file3.txt',
      'fileA.txt',
      'sub1/nested1.txt',
      'sub2/nested2.txt',
    ])
    assert.deepEqual(names(await backend.glob('**/deep.txt', at('gl'))), ['a/b/c/d/deep.txt'])
    assert.deepEqual(names(await backend.glob('file[1-2].txt', at('gl'))), ['file1.txt', 'file2.txt'])
    assert.deepEqual(names(await backend.glob('file?.txt', at('gl'))), ['file1.txt', 'file2.txt', 'file3.txt', 'fileA.txt'])
    assert.deepEqual(names(await backend.glob('.*', at('gl'))), ['.hidden1'])
    assert.deepEqual(names(await backend.glob('sub1/*.txt', at('gl'))), ['sub1/nested1.txt'])
    assert.deepEqual(names(await backend.glob('/*.md', at('gl'))), ['test.md'])
  })

  it('answers no match, and a missing directory, as an empty list', async () => {
    assert.deepEqual(await backend.glob('*.rs', at('gl')), { files: [], truncated: false })
    assert.deepEqual(await backend.glob('*.txt', at('gl-missing')), { files: [] })
  })
})

describe('delete', () => {
  it('removes a file or a whole directory, and says when there is nothing', async () => {
    await backend.write(at('del/a/b.txt'), 'x')
    await backend.write(at('del/c.txt'), 'x')
    assert.deepEqual(await backend.delete(at('del/c.txt')), { path: at('del/c.txt'), filesUpdate: null })
    assert.deepEqual(await backend.delete(at('del')), { path: at('del'), filesUpdate: null })
    assert.equal((await backend.execute(`test -e ${at('del')} || echo gone`)).output, 'gone\n')
    assert.deepEqual(await backend.delete(at('del')), { error: `Error: '${at('del')}' not found` })
  })
})

describe('workflows', () => {
  it('write, read, edit, read', async () => {
    const f = at('intg-workflow.txt')
    assert.equal((await backend.write(f, 'Original content')).error, undefined)
    assert.equal((await backend.read(f)).content, 'Original content')
    assert.equal((await backend.edit(f, 'Original', 'Modified')).error, undefined)
    assert.equal((await backend.read(f)).content, 'Modified content')
  })

  it('a tree through ls, glob and grep', async () => {
    const d = at('intg-complex')
    await backend.write(`${d}/root.txt`, 'root file')
    await backend.write(`${d}/subdir1/file1.txt`, 'file 1')
    await backend.write(`${d}/subdir1/file2.py`, 'file 2')
    await backend.write(`${d}/subdir2/file3.txt`, 'file 3')
    assert.deepEqual(
      (await backend.ls(d)).files.map((f) => f.path),
      [`${d}/root.txt`, `${d}/subdir1/`, `${d}/subdir2/`],
    )
    assert.equal((await backend.glob('**/*.txt', d)).files.length, 3)
    assert.equal((await backend.grep('file', d)).matches.length, 4)
  })
})

describe('deepagents’ own directories', () => {
  it('are made, owned by the sandbox’s user, when deepagents first writes there', async () => {
    const sb = await client.create({ ephemeral: false })
    try {
      const b = new BerthSandbox({ sandbox: sb })
      assert.equal((await b.execute('mkdir /large_tool_results')).exitCode, 1, 'the sandbox user cannot make directories at /')
      assert.deepEqual(await b.write('/large_tool_results/call_1.txt', 'big'), { path: '/large_tool_results/call_1.txt', filesUpdate: null })
      const up = await b.uploadFiles([['/conversation_history/t1.md', enc('## history')]])
      assert.deepEqual(up, [{ path: '/conversation_history/t1.md', error: null }])
      for (const d of DEEPAGENTS_DIRS) {
        const st = await sb.stat(d)
        assert.equal(st.owner, 'user', d)
        assert.equal(st.mode & 0o777, 0o755, d)
      }
      // The agent's own commands can change and remove what deepagents wrote.
      const r = await b.execute('echo more >> /large_tool_results/call_1.txt && rm /conversation_history/t1.md && echo ok')
      assert.equal(r.output, 'ok\n')
      // Elsewhere at / a refused write stays refused.
      assert.match((await b.write('/elsewhere/x.txt', 'x')).error, /permission denied/)
      assert.equal(await sb.exists('/elsewhere'), false)
    } finally {
      await sb.delete()
    }
  })
})

// A logger that keeps what the backend logs.
function recorder() {
  const warned = []
  const infos = []
  return { warned, infos, warn: (m) => warned.push(m), info: (m) => infos.push(m) }
}

describe('the sandbox’s life', () => {
  it('a stopped sandbox is started again by the next call (once for concurrent calls)', async () => {
    const sb = await client.create({ ephemeral: false })
    try {
      const log = recorder()
      const b = new BerthSandbox({ sandbox: sb, logger: log })
      await b.write('/home/user/kept.txt', 'kept across stop')
      await sb.stop()
      assert.equal((await sb.refresh()).state, 'stopped')
      const [r1, r2, r3] = await Promise.all([b.execute('cat /home/user/kept.txt'), b.read('/home/user/kept.txt'), b.ls('/home/user')])
      assert.deepEqual(r1, { output: 'kept across stop', exitCode: 0, truncated: false })
      assert.equal(r2.content, 'kept across stop')
      assert.ok(r3.files.some((f) => f.path === '/home/user/kept.txt'))
      assert.equal((await sb.refresh()).state, 'running')
      assert.deepEqual(log.infos, [`berth sandbox ${sb.id} was stopped; the deepagents backend brought it back`])
      assert.deepEqual(log.warned, [])
    } finally {
      await sb.delete()
    }
  })

  it('a command the sandbox stopped under is not run again; the model is told, the sandbox started', async () => {
    const sb = await client.create({ ephemeral: false })
    try {
      const log = recorder()
      const b = new BerthSandbox({ sandbox: sb, logger: log })
      const running = b.execute('echo run >> /home/user/runs; sleep 10; echo done')
      await sleep(700)
      await sb.stop()
      assert.deepEqual(await running, {
        output:
          'Error executing command: the sandbox stopped while this ran, so it may not have finished. ' +
          'It was started again: its files are kept, its processes are not. Check what was done, then try again if needed.',
        exitCode: null,
        truncated: false,
      })
      assert.equal((await sb.refresh()).state, 'running')
      assert.equal((await b.execute('cat /home/user/runs')).output, 'run\n', 'the command ran once')
      assert.ok(log.warned[0].includes('while the call ran'), log.warned[0])
    } finally {
      await sb.delete()
    }
  })

  it('a paused sandbox is resumed by the next call', async () => {
    const sb = await client.create({ ephemeral: false })
    try {
      const b = new BerthSandbox({ sandbox: sb, logger: recorder() })
      await b.execute('sleep 1000 > /dev/null 2>&1 &')
      await sb.pause()
      assert.equal((await sb.refresh()).state, 'paused')
      const r = await b.execute('pgrep -c sleep')
      assert.deepEqual(r, { output: '1\n', exitCode: 0, truncated: false }, 'its processes went on')
      assert.equal((await sb.refresh()).state, 'running')
    } finally {
      await sb.delete()
    }
  })

  it('with autoStart off, a stopped sandbox is explained to the model, the detail logged', async () => {
    const sb = await client.create({ ephemeral: false })
    try {
      const log = recorder()
      const b = new BerthSandbox({ sandbox: sb, autoStart: false, logger: log })
      await sb.stop()
      const stopped = 'the sandbox is stopped, so no tool can use it until it is started again. Tell the user.'
      assert.deepEqual(await b.execute('echo hi'), { output: `Error executing command: ${stopped}`, exitCode: null, truncated: false })
      assert.deepEqual(await b.write('/home/user/x', 'x'), { error: stopped })
      assert.equal(log.warned.length, 2)
      assert.ok(log.warned[0].startsWith(`berth sandbox ${sb.id}: sandbox ${sb.id} is stopped: start it first`), log.warned[0])
      assert.equal((await sb.refresh()).state, 'stopped')
    } finally {
      await sb.delete()
    }
  })

  it('a deleted sandbox is explained to the model by every tool', async () => {
    const sb = await client.create({ ephemeral: false })
    const log = recorder()
    const b = new BerthSandbox({ sandbox: sb, logger: log })
    await sb.delete()
    const gone = 'the sandbox was deleted: its files and programs are gone, and no tool can use it. Tell the user; a new sandbox is needed.'
    assert.deepEqual(await b.execute('echo hi'), { output: `Error executing command: ${gone}`, exitCode: null, truncated: false })
    assert.deepEqual(await b.read('/home/user/a.txt'), { error: gone })
    assert.deepEqual(await b.readRaw('/home/user/a.txt'), { error: gone })
    assert.deepEqual(await b.write('/home/user/a.txt', 'x'), { error: gone })
    assert.deepEqual(await b.edit('/home/user/a.txt', 'a', 'b'), { error: gone })
    assert.deepEqual(await b.ls('/home/user'), { error: gone })
    assert.deepEqual(await b.grep('x', '/home/user'), { error: gone })
    assert.deepEqual(await b.glob('*', '/home/user'), { error: gone })
    assert.deepEqual(await b.delete('/home/user/a.txt'), { error: gone })
    assert.deepEqual(await b.uploadFiles([['/home/user/a.txt', enc('x')], ['rel', enc('x')]]), [
      { path: '/home/user/a.txt', error: gone },
      { path: 'rel', error: 'invalid_path' },
    ])
    assert.deepEqual(await b.downloadFiles(['/home/user/a.txt']), [{ path: '/home/user/a.txt', content: null, error: gone }])
    assert.equal(log.warned.length, 11)
    assert.ok(log.warned.every((m) => m === `berth sandbox ${sb.id}: sandbox "${sb.id}" not found`), log.warned[0])
  })

  it('a daemon that cannot be reached is explained, its URL logged', async () => {
    const url = `http://127.0.0.1:${await freePort()}`
    const dead = new Berth({ url })
    try {
      const log = recorder()
      const b = new BerthSandbox({ sandbox: new Sandbox(dead, shared.info), logger: log })
      const r = await b.execute('echo hi')
      assert.deepEqual(r, {
        output: 'Error executing command: the sandbox service is not answering right now. Try again in a moment; tell the user if it keeps failing.',
        exitCode: null,
        truncated: false,
      })
      assert.equal(log.warned.length, 1)
      assert.ok(log.warned[0].includes(url), log.warned[0])
    } finally {
      dead.close()
    }
  })

  it('other errors of a whole batch are thrown, typed', async () => {
    const b = new BerthSandbox({ sandbox: shared, logger: recorder() })
    const tooMany = Array.from({ length: 3 }, (_, i) => [at(`big/${i}.bin`), new Uint8Array(30 << 20)])
    await assert.rejects(b.uploadFiles(tooMany), (e) => e instanceof BerthError && e.code === 'too_large')
  })

  it('fork makes backends over copies of the files', async () => {
    await backend.write(at('fork/base.txt'), 'base')
    const copies = await backend.fork(2, { labels: { branch: 'try' } })
    try {
      assert.equal(copies.length, 2)
      await copies[0].write(at('fork/base.txt'), 'changed in copy 0')
      assert.equal((await copies[1].read(at('fork/base.txt'))).content, 'base')
      assert.equal((await backend.read(at('fork/base.txt'))).content, 'base')
      assert.equal((await copies[0].read(at('fork/base.txt'))).content, 'changed in copy 0')
      assert.equal(copies[1].sandbox.info.labels.branch, 'try')
      assert.notEqual(copies[0].id, backend.id)
    } finally {
      for (const c of copies) await c.sandbox.delete()
    }
  })
})
