// deepagents end to end on BerthSandbox, with no real model: a scripted
// chat model (@langchain/core's fakeModel) drives createDeepAgent, a real
// daemon runs the sandbox. The example examples/typescript/deepagents.mjs
// runs as a user's copy would (from a directory whose node_modules has
// @berthsh/berth and deepagents); a 300 KB command output and a 250 KB
// user message are offloaded by deepagents into its own directories at /,
// which berth's default user (uid 1000) could not make by itself.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { createDeepAgent } from 'deepagents'
import { fakeModel } from '@langchain/core/testing'
import { AIMessage, HumanMessage, ToolMessage } from '@langchain/core/messages'
import { Berth } from '../dist/index.js'
import { BerthSandbox } from '../dist/deepagents.js'
import { repo, startDaemon } from './daemon.mjs'

let daemon, client

before(async () => {
  daemon = await startDaemon({ prefix: 'tsdagent-' })
  client = new Berth({ url: daemon.url })
})

after(async () => {
  // Every sandbox goes, a failed test's too: a sandbox outlives its daemon.
  if (client) for (const s of await client.list()) await client.delete(s.id).catch(() => {})
  client?.close()
  await daemon?.stop()
})

const text = (m) => (typeof m.content === 'string' ? m.content : JSON.stringify(m.content))
const toolMessages = (messages) => Object.fromEntries(messages.filter((m) => ToolMessage.isInstance(m)).map((m) => [m.name, m]))

function firstPrimes(k) {
  const out = []
  for (let n = 2; out.length < k; n++) if (out.every((p) => n % p)) out.push(n)
  return out
}

const PRIMES_PY = `primes, n = [], 2
while len(primes) < 50:
    if all(n % p for p in primes if p * p <= n):
        primes.append(n)
    n += 1
print(" ".join(map(str, primes)))
`

describe('the example, examples/typescript/deepagents.mjs', () => {
  let dir

  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'berth-deepagents-example-'))
    const pkg = resolve(import.meta.dirname, '..')
    mkdirSync(join(dir, 'node_modules', '@berthsh'), { recursive: true })
    symlinkSync(pkg, join(dir, 'node_modules', '@berthsh', 'berth'))
    symlinkSync(join(pkg, 'node_modules', 'deepagents'), join(dir, 'node_modules', 'deepagents'))
    copyFileSync(join(repo, 'examples', 'typescript', 'deepagents.mjs'), join(dir, 'deepagents.mjs'))
  })

  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  it('computes primes in a sandbox with a scripted model and deletes the sandbox', async () => {
    const example = await import(pathToFileURL(join(dir, 'deepagents.mjs')).href)
    const model = fakeModel()
      .respondWithTools([{ name: 'write_file', args: { file_path: '/home/user/primes.py', content: PRIMES_PY }, id: 'call_1' }])
      .respondWithTools([{ name: 'execute', args: { command: 'python3 /home/user/primes.py > /home/user/primes.txt && echo ran' }, id: 'call_2' }])
      .respondWithTools([{ name: 'read_file', args: { file_path: '/home/user/primes.txt' }, id: 'call_3' }])
      .respond(new AIMessage('The largest of the first 50 primes is 229.'))
    const { answer, primes, messages } = await example.run({ model, client })

    const want = firstPrimes(50).join(' ')
    assert.equal(primes.trim(), want)
    assert.equal(answer, 'The largest of the first 50 primes is 229.')
    const tools = toolMessages(messages)
    assert.match(text(tools.write_file), /primes\.py/)
    assert.equal(text(tools.execute), 'ran\n\n[Command succeeded with exit code 0]')
    assert.ok(text(tools.read_file).includes(want), text(tools.read_file))
    assert.equal(model.callCount, 4)
    assert.equal(messages.at(0).content, example.TASK)
    assert.deepEqual(await client.list({ example: 'deepagents' }), [], 'the example deletes its sandbox')
  })
})

describe('deepagents’ offloading into the sandbox', () => {
  let backend

  before(async () => {
    backend = await BerthSandbox.create({ client })
  })

  after(async () => {
    await backend?.sandbox.delete()
  })

  it('moves a 300 KB command output to /large_tool_results/ and the model reads it back from there', async () => {
    const model = fakeModel()
      .respondWithTools([{ name: 'execute', args: { command: "head -c 300000 /dev/zero | tr '\\0' a; echo; echo END" }, id: 'call_big' }])
      .respondWithTools([{ name: 'read_file', args: { file_path: '/large_tool_results/call_big.txt', offset: 1, limit: 1 }, id: 'call_read' }])
      .respond(new AIMessage('done'))
    const agent = createDeepAgent({ model, backend })
    const { messages } = await agent.invoke({ messages: [{ role: 'user', content: 'Print a lot.' }] })

    // What the model saw of the command: a short notice naming the file, not 300 KB.
    const seen = model.calls[1].messages.filter((m) => ToolMessage.isInstance(m))
    assert.equal(seen.length, 1)
    const notice = text(seen[0])
    assert.ok(notice.length < 10_000, `the model saw ${notice.length} characters`)
    assert.ok(notice.includes('/large_tool_results/call_big.txt'), notice)
    assert.doesNotMatch(notice, /could not be saved/)

    // The whole output is in the sandbox, in a directory the sandbox's user owns.
    const saved = new TextDecoder().decode(await backend.sandbox.download('/large_tool_results/call_big.txt'))
    assert.ok(saved.startsWith('a'.repeat(300000) + '\nEND\n'), saved.slice(300000, 300100))
    const dir = await backend.sandbox.stat('/large_tool_results')
    assert.equal(dir.owner, 'user')

    // read_file of the offloaded file pages through it like any other.
    assert.match(text(toolMessages(messages).read_file), /END/)
    assert.equal(messages.at(-1).content, 'done')
  })

  it('moves a 250 KB user message to /conversation_history/', async () => {
    const big = 'word '.repeat(50_000)
    const model = fakeModel().respond(new AIMessage('noted'))
    const agent = createDeepAgent({ model, backend })
    const { messages } = await agent.invoke({ messages: [{ role: 'user', content: big }] })
    assert.equal(messages.at(-1).content, 'noted')

    const human = model.calls[0].messages.filter((m) => HumanMessage.isInstance(m))
    assert.equal(human.length, 1)
    assert.ok(text(human[0]).length < 10_000, `the model saw ${text(human[0]).length} characters`)
    const ls = await backend.ls('/conversation_history')
    assert.equal(ls.files.length, 1, JSON.stringify(ls))
    assert.ok(text(human[0]).includes(ls.files[0].path), text(human[0]).slice(0, 500))
    const saved = new TextDecoder().decode(await backend.sandbox.download(ls.files[0].path))
    assert.equal(saved, big)
  })
})
