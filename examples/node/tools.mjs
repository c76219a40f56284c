// The example agent's two tools, used by every kind of worker: the Node host and worker call
// the functions; the Rust worker (`rekindle-worker --config rekindle.toml`) runs this file as
// a command tool (`node tools.mjs NAME`, arguments as JSON on stdin, identity in
// REKINDLE_RUN_ID / REKINDLE_CALL_ID / REKINDLE_EPOCH).
//
// Every call appends a line to the side-effect ledger ($EXAMPLE_LEDGER, default
// ledger.jsonl), keyed by the call's idempotency key, so you can see what ran where and how
// often.
import fs from 'node:fs'
import { fileURLToPath } from 'node:url'

const FORECASTS = { oslo: 'snow, -4 C', lisbon: 'sun, 19 C', tokyo: 'rain, 11 C' }

function ledger(tool, key, epoch, executor) {
  const fd = fs.openSync(process.env.EXAMPLE_LEDGER || 'ledger.jsonl', 'a')
  fs.writeSync(fd, JSON.stringify({ tool, key, epoch, executor }) + '\n')
  fs.fsyncSync(fd)
  fs.closeSync(fd)
}

export function weather({ city }, key, epoch, executor) {
  ledger('weather', key, epoch, executor)
  return FORECASTS[city.toLowerCase()] || 'unknown'
}

export function note({ text }, key, epoch, executor) {
  ledger('note', key, epoch, executor)
  if (executor === 'node-host' && process.env.EXAMPLE_CRASH === '1') {
    // The host dies in the middle of this call, after its side effect: kill -9.
    process.kill(process.pid, 'SIGKILL')
  }
  return 'noted'
}

export const SCHEMAS = {
  weather: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  note: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  // The command-tool form, for the Rust worker.
  const args = JSON.parse(fs.readFileSync(0, 'utf8'))
  const key = `${process.env.REKINDLE_RUN_ID}:${process.env.REKINDLE_CALL_ID}`
  const epoch = Number(process.env.REKINDLE_EPOCH)
  process.stdout.write(String({ weather, note }[process.argv[2]](args, key, epoch, 'rust-worker')))
}
