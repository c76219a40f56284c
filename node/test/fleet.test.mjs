// The Node package end to end: Node hosts killed -9 in the middle of a tool call and finished
// by a Node worker, or by the Rust rekindle-worker, under the real rekindle-coordinator;
// idempotent recovery IDs; parked confirmations answered from JavaScript; workflows resumed
// after their driver dies; zombie hosts fenced; a journaling host resumed by another.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import http from 'node:http'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { FencedError, Host, RefusedError, InvalidInputError, Store, Tool, Worker } from '../index.mjs'
import { MODEL_NAME, STEP_SCHEMA, SYSTEM_PROMPT, config, makeTools, model, stepsOf } from './agent.mjs'
import { Fleet, audit, binPath, finished, recordedFinished, storeUrls, tempDir, waitFor } from './helpers.mjs'

const HERE = path.dirname(fileURLToPath(import.meta.url))

async function withFleet(url, tmp, body) {
  const fleet = new Fleet(url, tmp)
  try {
    await body(fleet)
  } finally {
    fleet.stop()
  }
}

for (const [where, url] of storeUrls(tempDir())) {
  test(`a host killed mid tool call is finished by a Node worker (${where})`, async () => {
    const tmp = tempDir()
    await withFleet(url, tmp, async (fleet) => {
      const store = await Store.open(url)
      fleet.coordinator()
      const worker = await fleet.worker()
      const host = fleet.agent('host', 'run-1', 5, 3)
      assert.equal(await host.exited, 'SIGKILL', fleet.log(host))
      const terminal = await waitFor('the recovery to finish', () => finished(store, 'recovery-of-run-1'))
      assert.equal(terminal.outcome, 'completed')
      const counts = audit(fleet.ledgerLines(), 'run-1', 5, 1)
      // The call in flight when the host died ran twice; every other call ran once.
      assert.equal(counts.call_3_1, 2, JSON.stringify(counts))
      assert.equal(Object.values(counts).reduce((a, b) => a + b), 6)
      const epochs = new Set(fleet.ledgerLines().filter((l) => l.call === 'call_3_1').map((l) => l.epoch))
      assert.equal(epochs.size, 2, 'the repeat runs at a new epoch, so downstream can tell')
      const record = await waitFor("the recovery's record", () => recordedFinished(store, 'recovery-of-run-1'))
      assert.equal(record.source_run, 'run-1')
      // A graceful stop: SIGTERM reaches the worker's handler, which calls stop().
      worker.kill('SIGTERM')
      assert.equal(await worker.exited, 0, fleet.log(worker))
      const stats = JSON.parse(worker.lines.at(-1))
      assert.equal(stats.finished, 1, JSON.stringify(stats))
      assert.equal(stats.failed + stats.fenced, 0, JSON.stringify(stats))
    })
  })
}

/** An OpenAI-compatible endpoint answering as `model` does, for the Rust worker. */
function fakeOpenAi() {
  const server = http.createServer((req, res) => {
    let body = ''
    req.on('data', (chunk) => (body += chunk))
    req.on('end', () => {
      const request = JSON.parse(body)
      const messages = request.messages.filter((m) => m.role !== 'system')
      const done = messages.filter((m) => m.role === 'assistant').length
      const message = done < stepsOf(messages)
        ? { role: 'assistant', content: null, tool_calls: [{ id: `call_${done + 1}_1`, type: 'function', function: { name: 'step', arguments: JSON.stringify({ n: done + 1 }) } }] }
        : { role: 'assistant', content: `finished after ${done} steps` }
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify({ id: 'x', object: 'chat.completion', model: request.model, choices: [{ index: 0, message, finish_reason: 'stop' }], usage: { prompt_tokens: 5, completion_tokens: 3 } }))
    })
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)))
}

test('a Node host killed mid tool call is finished by the Rust rekindle-worker (same fingerprint)', async () => {
  const tmp = tempDir()
  const url = path.join(tmp, 'bucket')
  const server = await fakeOpenAi()
  await withFleet(url, tmp, async (fleet) => {
    const toml = path.join(tmp, 'rekindle.toml')
    fs.writeFileSync(toml, [
      `system_prompt = ${JSON.stringify(SYSTEM_PROMPT)}`,
      '[model]',
      'kind = "openai"',
      `name = ${JSON.stringify(MODEL_NAME)}`,
      `base_url = "http://127.0.0.1:${server.address().port}/v1"`,
      '[[tools]]',
      'name = "step"',
      `schema = { type = "object", properties = { n = { type = "integer" } } }`,
      `command = [${JSON.stringify(process.execPath)}, ${JSON.stringify(path.join(HERE, 'step_tool.cjs'))}, ${JSON.stringify(fleet.ledger)}]`,
      '',
    ].join('\n'))
    const store = await Store.open(url)
    const tools = [new Tool(() => 'unused', { name: 'step', schema: STEP_SCHEMA })]
    const host = await Host.open(store, config(), { model, tools, stateDir: path.join(tmp, 'probe') })
    const rustConfig = (await import('../index.mjs')).Config.load(toml)
    assert.equal(rustConfig.fingerprint(), host.fingerprint, 'the Rust worker serves the Node host\'s runs')
    await host.close()
    fleet.coordinator()
    fleet.spawn(binPath('rekindle-worker'), ['--store', url, '--config', toml, '--id', 'rust-worker-1',
      '--lease-ttl-ms', '3000', '--poll-interval-ms', '200', '--state-dir', path.join(tmp, 'rust-state')])
    const victim = fleet.agent('host', 'run-r', 4, 2)
    assert.equal(await victim.exited, 'SIGKILL', fleet.log(victim))
    const terminal = await waitFor('the Rust worker to finish the run', () => finished(store, 'recovery-of-run-r'))
    assert.equal(terminal.outcome, 'completed')
    const counts = audit(fleet.ledgerLines(), 'run-r', 4, 1)
    assert.equal(counts.call_2_1, 2, JSON.stringify(counts))
    const pids = new Set(fleet.ledgerLines().map((l) => l.pid))
    assert.equal(pids.size >= 2, true, 'the host and the Rust worker\'s tool processes both ran calls')
  })
  server.close()
})

test('the same recovery ID admitted twice at once executes once', async () => {
  const tmp = tempDir()
  const url = path.join(tmp, 'bucket')
  await withFleet(url, tmp, async (fleet) => {
    const store = await Store.open(url)
    const host = fleet.agent('host', 'run-2', 4, 2)
    assert.equal(await host.exited, 'SIGKILL', fleet.log(host))
    const [a, b] = await Promise.all([
      store.spawnRecoveryWithRunId('run-2', 'my-recovery', { takeover: true }),
      store.spawnRecoveryWithRunId('run-2', 'my-recovery', { takeover: true }),
    ])
    assert.equal(a.recovery_id, 'my-recovery')
    assert.equal(b.recovery_id, 'my-recovery')
    fleet.coordinator()
    await fleet.worker()
    const terminal = await waitFor('the recovery to finish', () => finished(store, 'my-recovery'))
    assert.equal(terminal.outcome, 'completed')
    audit(fleet.ledgerLines(), 'run-2', 4, 1)
    // Admitting it again after it finished answers the same record, and runs nothing.
    const again = await store.spawnRecoveryWithRunId('run-2', 'my-recovery', { takeover: true })
    assert.equal(again.recovery_id, 'my-recovery')
    await assert.rejects(store.spawnRecoveryWithRunId('run-2', 'other-id', { takeover: true }), RefusedError)
  })
})

test('a parked confirmation is answered from JavaScript and finished by a Node worker', async () => {
  const tmp = tempDir()
  const url = path.join(tmp, 'bucket')
  await withFleet(url, tmp, async (fleet) => {
    const store = await Store.open(url)
    const tools = makeTools(fleet.ledger, { confirm: true })
    const host = await Host.open(store, config(), { model, tools, stateDir: path.join(tmp, 'host') })
    const result = await host.run('run-3', 'steps=1')
    await host.close()
    assert.equal(result.status, 'parked')
    assert.equal(result.parked.waiting_for, 'confirmation')
    assert.equal(result.parked.call_id, 'call_1_1')
    assert.deepEqual(fleet.ledgerLines(), [], 'a call waiting for confirmation has not run')
    await assert.rejects(store.answer('run-3', { callId: 'call_9_9', approve: true }), (e) => e instanceof RefusedError && e.message.includes('call_1_1'))
    await assert.rejects(store.answer('run-3', { callId: 'call_1_1' }), InvalidInputError)
    await store.answer('run-3', { callId: 'call_1_1', approve: true })
    fleet.coordinator()
    const worker = new Worker(store, config(), { model, tools, workerId: 'js-confirm-worker', stateDir: path.join(tmp, 'worker'), ttlMs: 3000, pollIntervalMs: 200 })
    const running = worker.run()
    try {
      const terminal = await waitFor('the answered run to finish', () => finished(store, 'recovery-of-run-3'))
      assert.equal(terminal.outcome, 'completed')
    } finally {
      worker.stop()
      await running
    }
    assert.deepEqual(fleet.ledgerLines().map((l) => l.call), ['call_1_1'])
  })
})

test('a workflow whose driver dies is resumed without repeating a step', async () => {
  const tmp = tempDir()
  const url = path.join(tmp, 'bucket')
  await withFleet(url, tmp, async (fleet) => {
    const store = await Store.open(url)
    fleet.coordinator()
    await fleet.worker()
    const specs = ['a', 'b', 'c'].map((step) => ({ step, prompt: 'steps=2' }))
    const driver = fleet.agent('workflow', 'wf', JSON.stringify(specs))
    await waitFor('a step to finish', async () => {
      for (const s of 'abc') if (await finished(store, `recovery-of-wf.${s}`)) return true
      return false
    })
    driver.kill('SIGKILL')
    await driver.exited
    const host = await Host.open(store, config(), { model, tools: makeTools(fleet.ledger), stateDir: path.join(tmp, 'again') })
    const report = await host.parallelResumable(specs, 'wf', { pollMs: 100 })
    assert.deepEqual([...report.skipped, ...report.dispatched].sort(), ['a', 'b', 'c'])
    assert.deepEqual(report.completed.map((c) => c.step).sort(), [...report.dispatched].sort())
    const again = await host.parallelResumable(specs, 'wf', { pollMs: 100 })
    assert.deepEqual(again.skipped.sort(), ['a', 'b', 'c'])
    assert.deepEqual(again.dispatched, [])
    await assert.rejects(host.parallelResumable([{ step: 'a', prompt: 'steps=3' }], 'wf'), (e) => e.message.includes("step 'a'"))
    await host.close()
    for (const step of 'abc') {
      const counts = audit(fleet.ledgerLines(), `wf.${step}`, 2, 0)
      assert.equal(Object.values(counts).reduce((x, y) => x + y), 2)
    }
  })
})

test('a zombie host is fenced, on the driven and the journal path', async () => {
  const tmp = tempDir()
  const store = await Store.open(path.join(tmp, 'bucket'))
  let entered
  const inside = new Promise((resolve) => (entered = resolve))
  let release
  const released = new Promise((resolve) => (release = resolve))
  const slow = new Tool(async () => {
    entered()
    await released
    return 'slow done'
  }, { name: 'step', schema: STEP_SCHEMA })
  const host = await Host.open(store, config(), { model, tools: [slow], stateDir: path.join(tmp, 'zombie') })
  const driving = host.run('run-z', 'steps=2')
  await inside
  // The host is alive but judged stuck: an operator takes the run over.
  const record = await store.spawnRecoveryWithRunId('run-z', 'run-z-takeover', { takeover: true })
  assert.equal(record.source_run, 'run-z')
  release()
  await assert.rejects(driving, (e) => e instanceof FencedError && e.kind === 'fenced' && e.message.includes('run-z'))
  await host.close()
  const journaling = await Host.open(store, config(), { stateDir: path.join(tmp, 'journal') })
  const run = await journaling.start('run-j', 'steps=1')
  await run.recordModelTurn(null, [{ id: 'x', name: 'step', arguments: { n: 1 } }])
  await store.spawnRecoveryWithRunId('run-j', 'run-j-takeover', { takeover: true })
  await assert.rejects(run.recordToolResult('x', 'too late'), FencedError)
  await journaling.close()
  assert.equal((await store.load('run-j')).pending_tool_calls[0].call.id, 'x')
})

test('a journaling host killed mid loop is resumed by another', async () => {
  const tmp = tempDir()
  const url = path.join(tmp, 'bucket')
  await withFleet(url, tmp, async (fleet) => {
    const store = await Store.open(url)
    const proc = fleet.agent('journal', 'run-k')
    assert.equal(await proc.exited, 'SIGKILL', fleet.log(proc))
    assert.deepEqual(proc.lines, ['journaled'])
    const state = await store.load('run-k')
    assert.deepEqual(state.pending_tool_calls.map((p) => p.call.id), ['b'])
    assert.equal(state.terminal, null)
    const host = await Host.open(store, config(), { stateDir: path.join(tmp, 'second') })
    const run = await host.resume('run-k')
    assert.equal(await run.epoch(), 2)
    await run.recordToolResult('b', 'step 2 done')
    const after = await run.recordModelTurn('finished after 2 steps')
    assert.equal(after.next_step.step, 'finish')
    const ended = await run.finish('completed', 'done')
    assert.equal(ended.terminal.outcome, 'completed')
    await assert.rejects(run.recordUserMessage('after the end'), RefusedError)
    await host.close()
    assert.deepEqual(await store.runs(), [], 'a finished run leaves the index')
  })
})

test('Ctrl-C during a journal commit exits only after the commit landed', async () => {
  const tmp = tempDir()
  const url = path.join(tmp, 'bucket')
  await withFleet(url, tmp, async (fleet) => {
    const proc = fleet.agent('ctrlc', 'ctl-c')
    assert.equal(await proc.exited, 130, fleet.log(proc))
    assert.ok(proc.lines.includes('recording'), fleet.log(proc))
    const store = await Store.open(url)
    // The interrupt came while the commit was retried; the process waited for it.
    assert.equal((await store.load('ctl-c')).last_seq, 3)
  })
})
