// A deep agent (LangChain's deepagents) whose files and commands live in a
// berth sandbox: it writes a Python script there, runs it, and reads what
// it printed. docs/deepagents-js.md explains each part.
//
//   npm install @berthsh/berth deepagents @langchain/anthropic
//   BERTH_URL=http://127.0.0.1:7680 ANTHROPIC_API_KEY=… node deepagents.mjs
//
// MODEL picks another model ("openai:gpt-5" with @langchain/openai, …).
// The tests run run() below with a scripted model instead of a real one.
import { pathToFileURL } from 'node:url'
import { createDeepAgent } from 'deepagents'
import { Berth } from '@berthsh/berth'
import { BerthSandbox } from '@berthsh/berth/deepagents'

export const TASK =
  'Write a Python script /home/user/primes.py that prints the first 50 prime numbers on one line, ' +
  'separated by spaces. Run it in the sandbox with its output saved to /home/user/primes.txt, ' +
  'then read that file and tell me the largest of them.'

/** Runs the task with `model` in a new sandbox, then deletes the sandbox.
 * Resolves to the agent's last answer, the file it made, and every message. */
export async function run({ model, client = new Berth() }) {
  // A sandbox of its own, kept until deleted below; with no network (the
  // daemon's default): the model is called from here, not from inside.
  const backend = await BerthSandbox.create({ client, labels: { example: 'deepagents' }, memory: 1 << 30 })
  try {
    const agent = createDeepAgent({ model, backend })
    const { messages } = await agent.invoke({ messages: [{ role: 'user', content: TASK }] })
    const primes = new TextDecoder().decode(await backend.sandbox.download('/home/user/primes.txt'))
    return { answer: messages.at(-1).content, primes, messages }
  } finally {
    await backend.sandbox.delete()
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { answer, primes } = await run({ model: process.env.MODEL ?? 'anthropic:claude-sonnet-4-6' })
  console.log('primes.txt:', primes.trim())
  console.log('agent:', answer)
}
