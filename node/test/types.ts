// Compiled by `npm run typecheck` (tsc --noEmit): the declarations describe the API as the
// README uses it. A wrong call below fails the check.
import { Config, FencedError, Host, RekindleError, Store, Worker, tool } from 'rekindle'

async function main(): Promise<void> {
  const store = await Store.open('./bucket', { timeoutMs: 5000 })
  const config = new Config('gpt-4o-mini', { systemPrompt: 'Be brief.', maxIterations: 20 })
  const add = tool(({ a, b }: { a: number; b: number }, ctx) => `${a + b} ${ctx.idempotencyKey}`, {
    name: 'add',
    schema: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } } },
  })
  const host = await Host.open(store, config, { model: async (messages) => ({ content: String(messages.length) }), tools: [add] })
  const controller = new AbortController()
  const result = await host.run('run-1', 'add 1 and 2', { signal: controller.signal })
  const status: 'finished' | 'parked' | 'waiting_for_input' | 'stopped' = result.status
  const journal = await host.start('run-2', 'hello')
  const state = await journal.recordModelTurn('hi', null, { inputTokens: 1 })
  const outcome: string | undefined = state.terminal?.outcome
  await journal.finish('completed')
  const record = await store.spawnRecoveryWithRunId('run-1', 'recovery-1', { takeover: true })
  const source: string = record.source_run
  await store.answer('run-3', { callId: 'call_1_1', approve: true })
  const worker = new Worker(store, config, { model: { complete: () => 'done' }, listen: '0.0.0.0:9090' })
  const stats: number = worker.stats().finished
  try {
    await host.close()
  } catch (error) {
    if (error instanceof FencedError || error instanceof RekindleError) console.log(error.kind)
  }
  void [status, outcome, source, stats, worker.run({ signal: controller.signal })]
}

void main
