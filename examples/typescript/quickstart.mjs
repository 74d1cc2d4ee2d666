// berth from TypeScript or JavaScript: a sandbox, a command, its output as
// it streams, files in and out, an error, and the sandbox deleted.
//
//   npm install @berthsh/berth
//   BERTH_URL=http://127.0.0.1:7680 node quickstart.mjs
import { Berth, NotFound } from '@berthsh/berth'

const berth = new Berth() // $BERTH_URL, else http://127.0.0.1:7680
const sandbox = await berth.create({ labels: { example: 'quickstart' }, memory: 512 << 20 })
try {
  const result = await sandbox.exec('echo "hello from $(hostname)"; python3 --version')
  console.log(result.exitCode, result.stdout.trim())

  for await (const event of sandbox.execStream('for i in 1 2 3; do echo "step $i"; sleep 0.2; done')) {
    if (event.type === 'stdout') process.stdout.write(event.data)
    if (event.type === 'exit') console.log('exited with', event.result.exitCode)
  }

  await sandbox.write('/home/user/app.py', 'print(sum(range(10)))\n')
  console.log('python says', (await sandbox.exec(['python3', 'app.py'])).stdout.trim())
  const bytes = await sandbox.download('/home/user/app.py')
  console.log('downloaded', bytes.length, 'bytes')

  try {
    await sandbox.download('/home/user/missing.txt')
  } catch (err) {
    if (!(err instanceof NotFound)) throw err
    console.log('as expected:', err.code, err.message)
  }
} finally {
  await sandbox.delete()
}
