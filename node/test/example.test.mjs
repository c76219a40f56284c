// examples/node as its README section runs it: an OpenAI-compatible endpoint, a coordinator,
// a Node worker and a Rust worker side by side, and Node hosts killed -9 in the middle of a
// tool call; every trip is finished, each repeating only the call in flight.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { Config, Store } from '../index.mjs'
import { Fleet, binPath, finished, tempDir, waitFor } from './helpers.mjs'

const HERE = path.dirname(fileURLToPath(import.meta.url))
const EXAMPLE = path.resolve(HERE, '..', '..', 'examples', 'node')

test('Node hosts crash mid tool call and Node and Rust workers finish their trips', async () => {
  const tmp = tempDir()
  const work = path.join(tmp, 'example')
  fs.cpSync(EXAMPLE, work, { recursive: true, filter: (p) => !p.includes('node_modules') })
  // As `npm install` in the example does: its `rekindle` is this package.
  fs.mkdirSync(path.join(work, 'node_modules'))
  fs.symlinkSync(path.resolve(HERE, '..'), path.join(work, 'node_modules', 'rekindle'))
  const url = path.join(tmp, 'bucket')
  const fleet = new Fleet(url, tmp)
  try {
    const endpoint = fleet.spawn(process.execPath, [path.join(work, 'fake_openai.mjs'), '0'], { cwd: work })
    await waitFor('the endpoint', () => endpoint.lines.length > 0)
    const port = endpoint.lines[0].match(/^listening (\d+)$/)[1]
    const toml = path.join(work, 'rekindle.toml')
    fs.writeFileSync(toml, fs.readFileSync(toml, 'utf8').replace('127.0.0.1:8765', `127.0.0.1:${port}`))
    const ledger = path.join(tmp, 'ledger.jsonl')
    const env = { ...process.env, EXAMPLE_LEDGER: ledger }
    const agent = [path.join(work, 'agent.mjs'), '--store', url]
    const store = await Store.open(url)
    fleet.coordinator()
    const nodeWorker = fleet.spawn(process.execPath, [...agent, '--state-dir', path.join(tmp, 'nw'), 'worker', '--id', 'node-1'], { cwd: work, env })
    await waitFor('the Node worker', () => nodeWorker.lines.length > 0 || nodeWorker.exitCode !== null)
    assert.match(nodeWorker.lines[0] ?? '', /^worker node-1 ready/, fleet.log(nodeWorker))
    fleet.spawn(binPath('rekindle-worker'), ['--store', url, '--config', toml, '--id', 'rust-1', '--concurrency', '1',
      '--lease-ttl-ms', '3000', '--poll-interval-ms', '250', '--state-dir', path.join(tmp, 'rw')], { cwd: work, env })
    await waitFor('both workers to register', async () => (await store.status()).workers.length === 2)
    const fingerprint = Config.load(toml).fingerprint()
    assert.deepEqual(new Set((await store.status()).workers.map((w) => w.fingerprint_sha256)), new Set([fingerprint]),
      'one fingerprint: the JavaScript tools have the names and schemas of the command tools')

    const trips = { 'trip-0': 'Oslo', 'trip-1': 'Lisbon', 'trip-2': 'Tokyo', 'trip-3': 'Oslo' }
    const hosts = Object.entries(trips).map(([run, city]) =>
      fleet.spawn(process.execPath, [...agent, '--state-dir', path.join(tmp, run), 'host', run, `Plan a trip to ${city}`],
        { cwd: work, env: { ...env, EXAMPLE_CRASH: '1' } }))
    for (const host of hosts) assert.equal(await host.exited, 'SIGKILL', fleet.log(host))
    for (const [run, city] of Object.entries(trips)) {
      const terminal = await waitFor(`${run} to be finished`, () => finished(store, `recovery-of-${run}`))
      assert.equal(terminal.outcome, 'completed')
      const final = (await store.load(`recovery-of-${run}`)).messages.at(-1).content
      assert.ok(final.startsWith(`Trip to ${city} planned`), final)
    }
    const lines = fs.readFileSync(ledger, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
    const byKey = {}
    for (const line of lines) (byKey[`${line.tool} ${line.key}`] ||= []).push(line)
    for (const run of Object.keys(trips)) {
      const weather = byKey[`weather ${run}:call_1`]
      const note = byKey[`note ${run}:call_2`]
      assert.equal(weather.length, 1, `${run}: weather ran once`)
      assert.equal(note.length, 2, `${run}: the note in flight ran twice`)
      assert.equal(note[0].executor, 'node-host')
      assert.ok(['node-worker', 'rust-worker'].includes(note[1].executor), JSON.stringify(note))
      assert.ok(note[1].epoch > note[0].epoch, 'the repeat runs at a later epoch')
    }
  } finally {
    fleet.stop()
  }
})
