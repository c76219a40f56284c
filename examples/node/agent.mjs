// A small Node agent on Rekindle: a host that runs trips, and a worker that finishes the trips
// of hosts that died. The model is the OpenAI-compatible endpoint of rekindle.toml; the tools
// are JavaScript functions.
//
//   node agent.mjs --store DIR_OR_S3_URL host RUN_ID "Plan a trip to Oslo"
//   node agent.mjs --store DIR_OR_S3_URL worker [--id ID]
//
// With EXAMPLE_CRASH=1 the host is killed (-9) in the middle of its `note` call; a
// rekindle-coordinator on the same store hands the run to a worker (this one, or a Rust
// `rekindle-worker --config rekindle.toml`), which finishes it, repeating only that call.
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Config, Host, Store, Tool, Worker } from 'rekindle'
import { SCHEMAS, note, weather } from './tools.mjs'

const HERE = path.dirname(fileURLToPath(import.meta.url))

function tools(executor) {
  return [
    new Tool(({ city }, ctx) => weather({ city }, ctx.idempotencyKey, ctx.epoch, executor), { name: 'weather', description: "Today's weather in a city", schema: SCHEMAS.weather }),
    new Tool(({ text }, ctx) => note({ text }, ctx.idempotencyKey, ctx.epoch, executor), { name: 'note', description: 'Write a note for the traveller', schema: SCHEMAS.note }),
  ]
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    store: { type: 'string' },
    config: { type: 'string', default: path.join(HERE, 'rekindle.toml') },
    'state-dir': { type: 'string' },
    id: { type: 'string' },
    listen: { type: 'string' },
  },
})
const [role, runId, prompt] = positionals
if (!values.store || !['host', 'worker'].includes(role) || (role === 'host' && !prompt)) {
  console.error('usage: node agent.mjs --store DIR_OR_S3_URL host RUN_ID PROMPT | worker [--id ID] [--listen ADDR]')
  process.exit(2)
}
const store = await Store.open(values.store)
const config = Config.load(values.config)
if (role === 'host') {
  const host = await Host.open(store, config, { tools: tools('node-host'), stateDir: values['state-dir'], leaseTtlMs: 3000 })
  console.log(JSON.stringify(await host.run(runId, prompt)))
  await host.close()
} else {
  const worker = new Worker(store, config, { tools: tools('node-worker'), workerId: values.id, stateDir: values['state-dir'], concurrency: 1, pollIntervalMs: 250, listen: values.listen })
  process.on('SIGTERM', () => worker.stop())
  console.log(`worker ${worker.workerId} ready (fingerprint ${worker.fingerprint.slice(0, 12)})`)
  await worker.run()
  console.log(JSON.stringify(worker.stats()))
}
