// The Node package in one process: models and tools in every accepted form, many runs at
// once with one cancelled by its AbortSignal, sessions with compare-and-swap, a worker's
// endpoint, and the mistakes a new user makes, each named by the error of its kind.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import path from 'node:path'
import { createRequire } from 'node:module'
import {
  Config, ConflictError, Host, InvalidInputError, NotFoundError, RefusedError, RekindleError,
  Store, Tool, UnavailableError, Worker, tool,
} from '../index.mjs'
import { STEP_SCHEMA, config, model } from './agent.mjs'
import { storeUrls, tempDir } from './helpers.mjs'

const step = (fn) => [new Tool(fn, { name: 'step', schema: STEP_SCHEMA })]

for (const [where, url] of storeUrls(tempDir())) {
  test(`models in every form, sync and async tools, a failing tool (${where})`, async () => {
    const tmp = tempDir()
    const store = await Store.open(url)
    const seen = []
    // An OpenAI-compatible client: `chat.completions.create` answers a chat completion.
    const client = {
      chat: {
        completions: {
          async create(body) {
            seen.push(body.model)
            const done = body.messages.filter((m) => m.role === 'assistant').length
            const message = done === 0
              ? { role: 'assistant', content: null, tool_calls: [{ id: 'c-1', type: 'function', function: { name: 'step', arguments: '{"n":1}' } }] }
              : { role: 'assistant', content: 'client done' }
            return { choices: [{ message }], usage: { prompt_tokens: 7, completion_tokens: 2 } }
          },
        },
      },
    }
    const forms = [
      ['client', client],
      ['object', { complete: async (messages, tools) => model(messages, tools) }],
      ['sync function', model],
    ]
    for (const [name, m] of forms) {
      const host = await Host.open(store, config(), { model: m, tools: step(async ({ n }, ctx) => `ok ${n} ${ctx.idempotencyKey}`), stateDir: path.join(tmp, name) })
      const result = await host.run(`form-${name}`, 'steps=1')
      assert.equal(result.status, 'finished', name)
      const state = await store.load(`form-${name}`)
      assert.equal(state.terminal.outcome, 'completed')
      const toolMessage = state.messages.find((m) => m.role === 'tool')
      assert.match(toolMessage.content, new RegExp(`^ok 1 form-${name}:`))
      await host.close()
    }
    assert.deepEqual(seen, ['js-test-model', 'js-test-model'], 'the client is asked with the configured model name')
    // A tool that throws is a failed call the model sees, not a failed run.
    const host = await Host.open(store, config(), { model, tools: step(() => { throw new Error('disk full') }), stateDir: path.join(tmp, 'boom') })
    assert.equal((await host.run('boom-1', 'steps=1')).status, 'finished')
    const failed = (await store.load('boom-1')).messages.find((m) => m.role === 'tool')
    assert.match(failed.content, /Error: disk full/)
    await host.close()
    const used = store.requests()
    assert.ok(used.requests > 0 && used.conditional_put > 0, JSON.stringify(used))
  })
}

test('many runs at once in one process; aborting one stops only that one', async () => {
  const tmp = tempDir()
  const store = await Store.open(path.join(tmp, 'bucket'))
  let started
  const victimStarted = new Promise((resolve) => (started = resolve))
  const slow = step(async (_args, ctx) => {
    if (ctx.runId === 'victim') started()
    await new Promise((resolve) => setTimeout(resolve, 100))
    return 'ok'
  })
  const host = await Host.open(store, config(), { model, tools: slow, stateDir: path.join(tmp, 's') })
  const controller = new AbortController()
  const victim = host.run('victim', 'steps=6', { signal: controller.signal })
  const others = Array.from({ length: 8 }, (_, i) => host.run(`bystander-${i}`, 'steps=3'))
  await victimStarted
  controller.abort()
  assert.equal((await victim).status, 'stopped')
  for (const result of await Promise.all(others)) assert.equal(result.status, 'finished', JSON.stringify(result))
  const state = await store.load('victim')
  assert.equal(state.terminal, null)
  assert.ok(state.counters.tool_results < 6, JSON.stringify(state.counters))
  // Resumed later under its own ID, it finishes.
  assert.equal((await host.resumeRun('victim')).status, 'finished')
  await host.close()
  await assert.rejects(host.run('too-late', 'steps=1'), (e) => e instanceof InvalidInputError && e.message.includes('closed'))
})

test('sessions save and load with compare-and-swap', async () => {
  const store = await Store.open(path.join(tempDir(), 'bucket'))
  assert.equal(await store.loadSession('s-1'), null)
  const first = await store.saveSession('s-1', { turn: 1 })
  assert.equal(first.generation, 1)
  const second = await store.saveSession('s-1', { turn: 2 }, { expected: first.digest })
  await assert.rejects(store.saveSession('s-1', { turn: 3 }, { expected: first.digest }), ConflictError)
  const loaded = await store.loadSession('s-1')
  assert.deepEqual(loaded.data, { turn: 2 })
  assert.equal(loaded.digest, second.digest)
  await assert.rejects(store.saveSession('s-1', undefined), InvalidInputError)
})

test('a worker given a listen address serves health, readiness and metrics, and stops', async () => {
  const tmp = tempDir()
  const store = await Store.open(path.join(tmp, 'bucket'))
  const port = 20000 + (process.pid % 20000)
  const worker = new Worker(store, config(), { model, tools: step(() => 'ok'), stateDir: path.join(tmp, 'w'), listen: `127.0.0.1:${port}` })
  assert.match(worker.workerId, /^js-worker-/)
  const running = worker.run()
  const get = async (p) => {
    for (let i = 0; i < 100; i++) {
      try {
        const res = await fetch(`http://127.0.0.1:${port}${p}`)
        return [res.status, await res.text()]
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    }
    throw new Error(`nothing answers on ${port}`)
  }
  assert.deepEqual(await get('/healthz'), [200, 'ok\n'])
  let ready
  for (let i = 0; i < 100 && !(ready && ready[0] === 200); i++) {
    ready = await get('/readyz')
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  assert.equal(ready[0], 200, ready[1])
  const [status, metrics] = await get('/metrics')
  assert.equal(status, 200)
  assert.match(metrics, /rekindle_/)
  worker.stop()
  await running
  assert.deepEqual(worker.stats(), { started: 0, finished: 0, failed: 0, fenced: 0 })
  assert.throws(() => new Worker(store, config(), { model, listen: 'not an address' }), (e) => e instanceof InvalidInputError && e.message.includes('not an address'))
})

test('mistakes a new user makes name the problem', async () => {
  const tmp = tempDir()
  const store = await Store.open(path.join(tmp, 'bucket'))
  await assert.rejects(store.answer('ghost', { callId: 'c1', approve: true }), (e) => e instanceof NotFoundError && e.kind === 'not_found' && e.message.includes('ghost'))
  assert.throws(() => new Config(''), (e) => e instanceof InvalidInputError && e.message.includes('modelName'))
  assert.throws(() => new Config('m', { maxIterations: -1 }), (e) => e instanceof InvalidInputError && e.message.includes('maxIterations'))
  await assert.rejects(Host.open(store, config(), { model: 42 }), InvalidInputError)
  await assert.rejects(Host.open({}, config()), (e) => e instanceof InvalidInputError && e.message.includes('Store'))
  assert.throws(() => new Host(), InvalidInputError)
  const wrong = await Host.open(store, config(), { model: () => 42, stateDir: path.join(tmp, 'w') })
  await assert.rejects(wrong.run('shape-1', 'go'), (e) => e instanceof InvalidInputError && e.message.includes('js-test-model') && e.message.includes('number'))
  await assert.rejects(wrong.run('', 'go'), InvalidInputError)
  await wrong.close()
  const noModel = await Host.open(store, config(), { stateDir: path.join(tmp, 'j') })
  await assert.rejects(noModel.run('no-model', 'go'), (e) => e instanceof RekindleError && e.message.includes('has no model'))
  const run = await noModel.start('twice', 'go')
  await run.recordModelTurn('done')
  await run.finish()
  await assert.rejects(run.finish(), (e) => e instanceof RefusedError && e.message.includes('handed the run back (it finished)'))
  await assert.rejects(run.recordModelTurn(null, 'not a list'), InvalidInputError)
  const left = await noModel.start('left', 'go')
  await left.recordModelTurn(null, [{ id: 'x', name: 'step', arguments: {} }])
  await left.close()
  await assert.rejects(left.recordToolResult('x', 'late'), (e) => e instanceof RefusedError && e.message.includes('it was closed'))
  await assert.rejects(left.finish('exploded'), InvalidInputError)
  await noModel.close()
  await assert.rejects(Store.open(''), InvalidInputError)
  // Arguments of the wrong type are the caller's mistake, named as such.
  await assert.rejects(Store.open(path.join(tmp, 'b2'), { timeoutMs: 'soon' }), (e) => e instanceof InvalidInputError && e.message.includes('wrong type'))
  await assert.rejects(store.answer('ghost', null), InvalidInputError)
  await assert.rejects(store.spawnRecoveryWithRunId('ghost', ''), (e) => e instanceof InvalidInputError && e.message.includes('recovery ID'))
  const typed = await Host.open(store, config(), { model, stateDir: path.join(tmp, 't') })
  await assert.rejects(typed.run('r-typed', 'go', { signal: 'nope' }), (e) => e instanceof InvalidInputError && e.message.includes('AbortSignal'))
  await assert.rejects(typed.run('r-typed'), (e) => e instanceof InvalidInputError && e.message.includes('prompt'))
  const journal = await typed.start('r-journal', 'go')
  await journal.recordModelTurn(null, [{ id: 'k', name: 'step', arguments: {} }])
  const after = await journal.recordToolResult('k', { a: 1 })
  assert.equal(after.messages.at(-1).content, '{"a":1}', 'a non-string result is recorded as JSON')
  await assert.rejects(journal.recordModelTurn(5), (e) => e instanceof InvalidInputError && e.message.includes('wrong type'))
  await typed.close()
  assert.throws(() => new Worker(store, config(), { model, concurrency: -1 }), (e) => e instanceof InvalidInputError && e.message.includes('concurrency'))
  assert.throws(() => new Worker(store, config(), { tools: step(() => 'x') }), (e) => e instanceof InvalidInputError && e.message.includes('needs a model'))
  assert.throws(() => tool('not a function'), InvalidInputError)
  assert.throws(() => new Config('m').fingerprint([tool(() => 1, { name: 'a' }), tool(() => 2, { name: 'a' })]), (e) => e.message.includes("'a' is given twice"))
})

test('an unreachable store is named', async () => {
  process.env.AWS_ACCESS_KEY_ID ??= 'x'
  process.env.AWS_SECRET_ACCESS_KEY ??= 'y'
  await assert.rejects(
    Store.open('s3://nowhere/prefix', { endpoint: 'http://127.0.0.1:1', allowHttp: true, region: 'us-east-1', timeoutMs: 500, retries: 1 }),
    (e) => e instanceof UnavailableError && e.message.includes("cannot open store 's3://nowhere/prefix'"),
  )
})

test('CommonJS and ES module consumers share one package', () => {
  const require = createRequire(import.meta.url)
  const cjs = require('../index.cjs')
  assert.equal(cjs.Store, Store)
  assert.equal(cjs.RekindleError, RekindleError)
  assert.ok(new cjs.InvalidInputError('x') instanceof RekindleError)
  assert.equal(new cjs.Config('m').fingerprint(), new Config('m').fingerprint())
})

test('a process exits by itself once its work is done, even if it forgets close()', async () => {
  const { spawnSync } = await import('node:child_process')
  const tmp = tempDir()
  const script = `
    import { Store, Host, Config } from ${JSON.stringify(new URL('../index.mjs', import.meta.url).href)}
    const store = await Store.open(${JSON.stringify(path.join(tmp, 'bucket'))})
    const host = await Host.open(store, new Config('m'), { model: () => 'done', stateDir: ${JSON.stringify(path.join(tmp, 's'))} })
    console.log((await host.run('r-1', 'go')).status)
  `
  // A process the heartbeat kept alive would be killed at the timeout: no exit status.
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 })
  assert.equal(child.status, 0, `${child.error ?? ''} ${child.stderr}`)
  assert.equal(child.stdout.trim(), 'finished')
})

test('journal records called without awaiting each land in call order', async () => {
  const tmp = tempDir()
  const store = await Store.open(path.join(tmp, 'bucket'))
  const host = await Host.open(store, config(), { stateDir: path.join(tmp, 's') })
  const run = await host.start('unawaited', 'steps=2')
  const calls = []
  for (let n = 1; n <= 5; n++) {
    calls.push(run.recordModelTurn(null, [{ id: `c${n}`, name: 'step', arguments: { n } }]))
    calls.push(run.recordToolResult(`c${n}`, `step ${n} done`))
  }
  calls.push(run.recordModelTurn('done'))
  calls.push(run.finish())
  const states = await Promise.all(calls)
  assert.equal(states.at(-1).terminal.outcome, 'completed')
  const seqs = states.map((s) => s.last_seq)
  assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b), 'each record saw the ones called before it')
  await host.close()
})

test('a second worker with a live worker\'s ID waits for it instead of taking over; the first is never fenced', async () => {
  const tmp = tempDir()
  const store = await Store.open(path.join(tmp, 'bucket'))
  const first = new Worker(store, config(), { model, workerId: 'same-id', stateDir: path.join(tmp, 'a') })
  const running = first.run()
  await new Promise((resolve) => setTimeout(resolve, 300))
  const second = new Worker(store, config(), { model, workerId: 'same-id', stateDir: path.join(tmp, 'b') })
  const controller = new AbortController()
  const timer = setTimeout(() => controller.abort(), 5000)
  const outcome = await second.run({ signal: controller.signal }).then(() => 'stopped', (error) => error)
  clearTimeout(timer)
  first.stop()
  await running
  assert.equal(outcome, 'stopped', 'it waited for the live ID until its signal stopped it')
  assert.equal(first.stats().fenced, 0)
})
