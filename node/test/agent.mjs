// The processes the tests start and kill: a host, a worker, a workflow driver, a journaling
// host. They share one configuration, one scripted model and one tool that appends every call
// to a side-effect ledger (fsynced), so a test can audit what ran.
//
//   node agent.mjs host     STORE LEDGER STATE RUN_ID STEPS CRASH_AT
//   node agent.mjs worker   STORE LEDGER STATE WORKER_ID
//   node agent.mjs workflow STORE LEDGER STATE WORKFLOW_ID STEPS_JSON
//   node agent.mjs journal  STORE LEDGER STATE RUN_ID
import fs from 'node:fs'
import path from 'node:path'
import { Config, Host, Store, Tool, Worker } from '../index.mjs'

export const MODEL_NAME = 'js-test-model'
export const SYSTEM_PROMPT = 'Call step until done.'
export const STEP_SCHEMA = { type: 'object', properties: { n: { type: 'integer' } } }
const DEFAULT_STEPS = 4

export function config() {
  return new Config(MODEL_NAME, { systemPrompt: SYSTEM_PROMPT })
}

export function stepsOf(messages) {
  for (const m of messages) {
    if (m.role === 'user' && typeof m.content === 'string' && m.content.startsWith('steps=')) {
      return Number(m.content.split('=')[1].split(' ')[0])
    }
  }
  return DEFAULT_STEPS
}

/** Turn n calls `step` with n (n = 1..steps), then answers. */
export function model(messages, tools) {
  const done = messages.filter((m) => m.role === 'assistant').length
  if (done < stepsOf(messages) && tools.length) {
    return { content: null, tool_calls: [{ name: 'step', arguments: { n: done + 1 } }] }
  }
  return { content: `finished after ${done} steps`, usage: { prompt_tokens: 5, completion_tokens: 3 } }
}

/** Appends the call to the ledger; a host told to crash dies (kill -9) right after the side
 * effect of call `crashAt`, before its result is committed. */
export function makeTools(ledger, { crashAt = 0, confirm = false } = {}) {
  const step = async ({ n }, ctx) => {
    const line = JSON.stringify({ run: ctx.runId, call: ctx.callId, epoch: ctx.epoch, pid: process.pid })
    const fd = fs.openSync(ledger, 'a')
    fs.writeSync(fd, line + '\n')
    fs.fsyncSync(fd)
    fs.closeSync(fd)
    if (crashAt && n === crashAt) process.kill(process.pid, 'SIGKILL')
    return `step ${n} done`
  }
  return [new Tool(step, { name: 'step', schema: STEP_SCHEMA, confirm })]
}

async function main() {
  const [role, url, ledger, state, ...rest] = process.argv.slice(2)
  const store = await Store.open(url)
  if (role === 'host') {
    const [runId, steps, crashAt] = [rest[0], Number(rest[1]), Number(rest[2])]
    const host = await Host.open(store, config(), { model, tools: makeTools(ledger, { crashAt }), stateDir: state, leaseTtlMs: 2000 })
    console.log(JSON.stringify(await host.run(runId, `steps=${steps}`)))
    await host.close()
  } else if (role === 'worker') {
    const worker = new Worker(store, config(), { model, tools: makeTools(ledger), workerId: rest[0], stateDir: state, ttlMs: 3000, pollIntervalMs: 200 })
    process.on('SIGTERM', () => worker.stop())
    console.log('worker ready')
    await worker.run()
    console.log(JSON.stringify(worker.stats()))
  } else if (role === 'workflow') {
    const [workflowId, specs] = [rest[0], JSON.parse(rest[1])]
    const host = await Host.open(store, config(), { model, tools: makeTools(ledger), stateDir: state })
    console.log(JSON.stringify(await host.parallelResumable(specs, workflowId, { pollMs: 100 })))
    await host.close()
  } else if (role === 'journal') {
    const host = await Host.open(store, config(), { stateDir: state, leaseTtlMs: 1000 })
    const run = await host.start(rest[0], 'steps=2')
    await run.recordModelTurn(null, [
      { id: 'a', name: 'step', arguments: { n: 1 } },
      { id: 'b', name: 'step', arguments: { n: 2 } },
    ])
    await run.recordToolResult('a', 'step 1 done')
    console.log('journaled')
    process.kill(process.pid, 'SIGKILL')
  } else if (role === 'ctrlc') {
    // A commit held up by a blocked slot (its write fails and is retried) while Ctrl-C
    // arrives: the process must exit only after the commit landed.
    const host = await Host.open(store, config(), { stateDir: state })
    const run = await host.start(rest[0], 'steps=1')
    const gens = fs.readdirSync(path.join(url, 'runs')).map((p) => path.join(url, 'runs', p, rest[0], 'gen')).find((d) => fs.existsSync(d))
    const last = fs.readdirSync(gens).sort().at(-1)
    const blocker = path.join(gens, String(Number(last) + 1).padStart(last.length, '0'), 'blocker')
    fs.mkdirSync(blocker, { recursive: true })
    setTimeout(() => process.kill(process.pid, 'SIGINT'), 300)
    setTimeout(() => fs.rmSync(path.dirname(blocker), { recursive: true }), 800)
    console.log('recording')
    await run.recordModelTurn(null, [{ id: 'a', name: 'step', arguments: { n: 1 } }])
    console.log('recorded')
  } else {
    throw new Error(`unknown role ${role}`)
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((error) => {
    console.error(error)
    process.exit(1)
  })
}
