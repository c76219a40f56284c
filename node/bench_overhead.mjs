// Per-step overhead of the Node path next to the Rust path, through the same drive loop.
//
//   node bench_overhead.mjs [--runs 15] [--calls 10] [--store DIR_OR_S3_URL]
//
// Each run takes 2 * calls + 1 steps (a model turn with one tool call, its result, ..., the
// final answer), on a fresh store prefix per path:
//
//   rust:     the scripted model and a command tool (`true`), both in Rust (as `rekindle run`)
//   js-model: a JavaScript model function and the command tool
//   js-tool:  the Rust scripted model and a JavaScript tool
//   js:       a JavaScript model and a JavaScript tool
//
// Prints, per path, the median milliseconds per step and the store requests per step, then
// what a JavaScript model turn and tool call cost next to their Rust counterparts.
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { randomUUID } from 'node:crypto'
import { Config, Host, Store, Tool } from './index.mjs'

const args = { runs: 15, calls: 10, store: null }
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1]
const runs = Number(args.runs)
const calls = Number(args.calls)
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'rekindle-bench-'))
fs.writeFileSync(path.join(tmp, 'script.json'), JSON.stringify([
  ...Array.from({ length: calls }, (_, i) => ({ content: null, tool_calls: [{ name: 'noop', arguments: { i } }] })),
  { content: 'done' },
]))
fs.writeFileSync(path.join(tmp, 'rekindle.toml'),
  '[model]\nkind = "scripted"\nname = "bench"\nscript = "script.json"\n\n' +
  '[[tools]]\nname = "noop"\nschema = { type = "object" }\ncommand = ["true"]\n')
const config = Config.load(path.join(tmp, 'rekindle.toml'))
const jsModel = (messages) => {
  const done = messages.filter((m) => m.role === 'assistant').length
  return done < calls ? { content: null, tool_calls: [{ name: 'noop', arguments: { i: done } }] } : 'done'
}
const noop = new Tool(() => '', { name: 'noop', schema: { type: 'object' } })
const paths = {
  rust: {},
  'js-model': { model: jsModel },
  'js-tool': { tools: [noop] },
  js: { model: jsModel, tools: [noop] },
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const steps = 2 * calls + 1
const medians = {}
console.log(`${runs} runs of ${steps} steps per path, store: ${args.store || 'a local directory'}`)
for (const [name, agent] of Object.entries(paths)) {
  const url = args.store ? `${args.store.replace(/\/$/, '')}/bench-${name}-${randomUUID().slice(0, 8)}` : path.join(tmp, `bucket-${name}`)
  const store = await Store.open(url)
  const host = await Host.open(store, config, { ...agent, stateDir: path.join(tmp, `state-${name}`) })
  const perStep = []
  const requests = []
  for (let i = 0; i <= runs; i++) {
    const before = store.requests().requests
    const started = performance.now()
    const result = await host.run(`${name}-${i}`, 'go')
    const elapsed = performance.now() - started
    if (result.status !== 'finished') throw new Error(JSON.stringify(result))
    if (i === 0) continue // warm-up
    perStep.push(elapsed / steps)
    requests.push((store.requests().requests - before) / steps)
  }
  await host.close()
  medians[name] = median(perStep)
  console.log(`${name.padStart(8)}: ${medians[name].toFixed(2)} ms/step (median), ${median(requests).toFixed(2)} requests/step`)
}
const modelDelta = ((medians['js-model'] - medians.rust) * steps) / (calls + 1)
const toolDelta = ((medians['js-tool'] - medians.rust) * steps) / calls
console.log(`a JavaScript model turn costs ${modelDelta >= 0 ? '+' : ''}${modelDelta.toFixed(2)} ms next to the Rust scripted model; ` +
  `a JavaScript tool call ${toolDelta >= 0 ? '+' : ''}${toolDelta.toFixed(2)} ms next to a command tool (a process per call)`)
