'use strict'
// Rekindle for Node.js: journal, resume and recover interrupted AI-agent runs.
//
// The Rust library does the durability: every fact is journaled to a local log and committed
// to the store with one conditional PUT before a promise resolves; leases with fencing epochs
// decide who may write a run; a coordinator hands interrupted runs to workers. This module is
// the JavaScript half of the package: it adapts models and tools to the native half's one
// JSON string in, one out, and turns native failures into RekindleError subclasses.

const native = require('./native.cjs')

// ---------------------------------------------------------------------------------------------
// Errors

/** Base of every Rekindle error; `kind` says what to do next. */
class RekindleError extends Error {
  constructor(message, options) {
    super(message, options)
    this.name = new.target.name
  }
}
RekindleError.prototype.kind = 'error'

const KINDS = {
  conflict: ['ConflictError', 'Someone else changed the state first: reread and retry.'],
  unavailable: ['UnavailableError', 'The store, the disk or the model is unavailable: back off and retry.'],
  fenced: ['FencedError', 'Another writer owns the run now: stop, do not retry.'],
  not_found: ['NotFoundError', 'The named run, recovery or object does not exist.'],
  refused: ['RefusedError', 'The current state forbids the request: change the request or accept the state.'],
  invalid_input: ['InvalidInputError', 'The request or the configuration is wrong: fix the input.'],
  corrupt: ['CorruptError', 'Stored data is damaged or from a newer build: a human must look.'],
  internal: ['InternalError', 'A bug in Rekindle.'],
}
const classes = {}
for (const [kind, [name]] of Object.entries(KINDS)) {
  const cls = { [name]: class extends RekindleError {} }[name]
  cls.prototype.kind = kind
  classes[kind] = cls
}

/** A native failure (its message is the JSON {kind, message}) as its RekindleError. */
function lift(error) {
  if (error instanceof RekindleError) return error
  const text = error && typeof error.message === 'string' ? error.message : String(error)
  if (text.startsWith('{')) {
    try {
      const { kind, message } = JSON.parse(text)
      const cls = classes[kind] || classes.internal
      return new cls(message)
    } catch {
      // not one of ours: fall through
    }
  }
  // A value the native half could not convert (a wrong type) is the caller's mistake.
  if (/^Failed to convert|Expected$/.test(text) || (error && /Expected$|^InvalidArg$/.test(String(error.code)))) {
    return new classes.invalid_input(`an argument has the wrong type: ${text}`)
  }
  return new classes.internal(text, { cause: error })
}

/** Calls a native function, throwing its failure as a RekindleError. */
function sync(fn) {
  try {
    return fn()
  } catch (error) {
    throw lift(error)
  }
}

/**
 * Calls a native method and awaits its promise: its value, or its failure (a NativeFailure,
 * or a conversion error thrown by the call itself) as a RekindleError.
 */
async function settle(call) {
  let value
  try {
    value = await call()
  } catch (error) {
    throw lift(error)
  }
  if (value instanceof native.NativeFailure) {
    const cls = classes[value.kind] || classes.internal
    throw new cls(value.message)
  }
  return value
}

async function json(call) {
  return JSON.parse(await settle(call))
}

function invalid(message) {
  return new classes.invalid_input(message)
}

// Ctrl-C while a commit is in flight: the process exits once the commit landed, not in the
// middle of it. Installed only while commits are in flight, and only if the program has no
// SIGINT handler of its own (which then decides).
const inFlight = new Set()
let interrupted = false
function onSigint() {
  interrupted = true
  Promise.allSettled([...inFlight]).then(() => process.exit(130))
}
function committing(promise) {
  if (inFlight.size === 0 && process.listenerCount('SIGINT') === 0) process.once('SIGINT', onSigint)
  inFlight.add(promise)
  const done = () => {
    inFlight.delete(promise)
    if (inFlight.size === 0 && !interrupted) process.removeListener('SIGINT', onSigint)
  }
  promise.then(done, done)
  return promise
}

// ---------------------------------------------------------------------------------------------
// Store and Config

class Store {
  /** Use `await Store.open(url, options)`. */
  constructor(handle) {
    if (!(handle instanceof native.NativeStore)) {
      throw invalid('open a store with `await Store.open(url)`')
    }
    this._native = handle
  }

  /**
   * Opens the store at `url`: a local directory, `s3://bucket/prefix` or `memory://`.
   * A failure names the store.
   */
  static async open(url, options = {}) {
    if (typeof url !== 'string' || url.trim() === '') throw invalid('Store.open: the URL must be a non-empty string')
    const handle = await settle(() => native.openStore(url, {
      endpoint: options.endpoint,
      allowHttp: options.allowHttp,
      region: options.region,
      virtualHostedStyle: options.virtualHostedStyle,
      timeoutMs: options.timeoutMs,
      retries: options.retries,
      create: options.create,
    }))
    return new Store(handle)
  }

  get url() {
    return this._native.url
  }

  /** Requests this process sent to the store so far, by kind, with `requests` their total. */
  requests() {
    return JSON.parse(this._native.requests())
  }

  /**
   * Spawns the recovery of `sourceRunId` under the host-chosen, idempotent `recoveryId`:
   * admitting the same ID again answers the same record. Resolves to the record.
   */
  spawnRecoveryWithRunId(sourceRunId, recoveryId, { force = false, takeover = false } = {}) {
    return json(() => this._native.spawnRecovery(String(sourceRunId), String(recoveryId), !!force, !!takeover))
  }

  /** Answers a parked run: `{callId, approve}` or `{questionId, text}`. */
  async answer(runId, answer = {}) {
    if (answer === null || typeof answer !== 'object') {
      throw invalid(`answer to run "${runId}": give {callId, approve} or {questionId, text}`)
    }
    await json(() => this._native.answer(String(runId), answer.callId, answer.approve, answer.questionId, answer.text))
  }

  /** One look at the fleet: the leader, workers, runs not yet done, stuck work. */
  status() {
    return json(() => this._native.status())
  }

  /** The runs not yet done, each with its state and recovery. */
  async runs() {
    return (await this.status()).runs
  }

  /** A run's committed state, folded: messages, pending tool calls, park, end. */
  load(runId) {
    return json(() => this._native.load(String(runId)))
  }

  /** The recovery record of `recoveryId`, or null. */
  recovery(recoveryId) {
    return json(() => this._native.recovery(String(recoveryId)))
  }

  /**
   * Saves a session snapshot if the newest still has digest `expected` (null: none yet);
   * rejects with ConflictError otherwise. Resolves to `{generation, digest}`.
   */
  saveSession(sessionId, data, { expected = null } = {}) {
    let text
    try {
      text = JSON.stringify(data)
    } catch (error) {
      return Promise.reject(invalid(`session '${sessionId}': the data is not JSON: ${error.message}`))
    }
    if (text === undefined) return Promise.reject(invalid(`session '${sessionId}': the data is not JSON`))
    return json(() => this._native.saveSession(String(sessionId), text, expected ?? undefined))
  }

  /** The newest session snapshot (`{data, generation, digest}`), or null. */
  loadSession(sessionId) {
    return json(() => this._native.loadSession(String(sessionId)))
  }
}

/** A run's configuration: model name, system prompt, budgets, thinking mode. */
class Config {
  constructor(modelName, options = {}) {
    if (modelName instanceof native.NativeConfig) {
      this._native = modelName
      return
    }
    if (typeof modelName !== 'string') throw invalid('Config: modelName must be a string')
    this._native = sync(() => native.NativeConfig.create({
      modelName,
      systemPrompt: options.systemPrompt,
      maxIterations: options.maxIterations,
      maxTokens: options.maxTokens,
      maxToolRounds: options.maxToolRounds,
      stepsPerResume: options.stepsPerResume,
      thinking: options.thinking,
    }))
  }

  /** Reads a rekindle.toml: its model and command tools are used unless others are given. */
  static load(path) {
    return new Config(sync(() => native.NativeConfig.load(String(path))))
  }

  get modelName() {
    return this._native.modelName
  }

  get systemPrompt() {
    return this._native.systemPrompt
  }

  /** The SHA-256 of the fingerprint with these tools (`Tool`s or functions) in its own's place. */
  fingerprint(tools) {
    return sync(() => this._native.fingerprint(tools === undefined ? undefined : toolbox(tools).declarations))
  }
}

// ---------------------------------------------------------------------------------------------
// Tools

/** What a tool call receives besides its arguments. */
class CallContext {
  constructor(runId, callId, epoch, signal) {
    this.runId = runId
    this.callId = callId
    this.epoch = epoch
    Object.freeze(this)
  }

  /** The same every time the same logical call runs (after a crash, at most once more). */
  get idempotencyKey() {
    return `${this.runId}:${this.callId}`
  }
}

/**
 * A function the model may call: `fn(args, ctx)`, sync or async; its result is shown to the
 * model (a string as is, anything else as JSON); a throw is a failed call the model sees.
 */
class Tool {
  constructor(fn, { name, description = '', schema, confirm = false } = {}) {
    if (typeof fn !== 'function') throw invalid(`tool ${name || String(fn)} is not a function`)
    this.fn = fn
    this.name = name || fn.name
    if (!this.name) throw invalid('a tool needs a name')
    this.description = description
    this.schema = schema || { type: 'object', properties: {} }
    this.confirm = !!confirm
  }
}

/** Shorthand for `new Tool(fn, options)`. */
function tool(fn, options) {
  return new Tool(fn, options)
}

function toolbox(tools) {
  const items = []
  if (Array.isArray(tools)) {
    for (const t of tools) items.push(t instanceof Tool ? t : new Tool(t))
  } else if (tools && typeof tools === 'object') {
    for (const [name, t] of Object.entries(tools)) items.push(t instanceof Tool ? t : new Tool(t, { name }))
  } else {
    throw invalid('tools are a list of Tools (or functions), or an object of name: function')
  }
  const byName = new Map()
  for (const t of items) {
    if (byName.has(t.name)) throw invalid(`tool '${t.name}' is given twice`)
    byName.set(t.name, t)
  }
  const declarations = items.map((t) => ({
    name: t.name,
    description: t.description,
    schema: JSON.stringify(t.schema),
    confirm: t.confirm,
  }))
  async function call(requestJson) {
    const request = JSON.parse(requestJson)
    const t = byName.get(request.name)
    const answer = (output, isError) => JSON.stringify({ output, isError })
    if (!t) return answer(`no tool named '${request.name}'`, true)
    let args
    try {
      args = request.arguments.trim() ? JSON.parse(request.arguments) : {}
    } catch (error) {
      return answer(`tool '${t.name}': the arguments are not JSON: ${error.message}`, true)
    }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) {
      return answer(`tool '${t.name}': the arguments are not a JSON object`, true)
    }
    try {
      const result = await t.fn(args, new CallContext(request.runId, request.callId, request.epoch))
      return answer(typeof result === 'string' ? result : JSON.stringify(result ?? null), false)
    } catch (error) {
      return answer(`${error && error.name ? error.name : 'Error'}: ${error && error.message ? error.message : String(error)}`, true)
    }
  }
  return { declarations, call }
}

// ---------------------------------------------------------------------------------------------
// Models

function plain(value) {
  if (value && typeof value === 'object') {
    for (const method of ['toJSON', 'model_dump', 'toObject']) {
      if (typeof value[method] === 'function') return value[method]()
    }
  }
  return value
}

/** One assistant turn from what a model returned: a string, a chat-completions response, or a message. */
function assistantTurn(result, turn, modelName) {
  result = plain(result)
  if (typeof result === 'string') return { content: result }
  const shape = result === null ? 'null' : Array.isArray(result) ? 'an array' : typeof result
  if (!result || typeof result !== 'object' || Array.isArray(result)) {
    throw new TypeError(`model '${modelName}' returned ${shape}; expected a string or an object`)
  }
  const usage = plain(result.usage) || {}
  let message = result
  if (Array.isArray(result.choices)) {
    const choice = plain(result.choices[0]) || {}
    message = plain(choice.message || choice)
  }
  if (!message || typeof message !== 'object' || !('content' in message || 'tool_calls' in message || 'toolCalls' in message)) {
    throw new TypeError(`model '${modelName}' returned ${JSON.stringify(result)}; expected a message with 'content' and/or 'tool_calls' (or a chat-completions response)`)
  }
  const calls = (message.tool_calls || message.toolCalls || []).map((call, i) => {
    call = plain(call)
    const fn = plain(call.function) || {}
    const name = call.name || fn.name
    if (typeof name !== 'string' || !name) throw new TypeError(`tool call ${i + 1} of model '${modelName}''s turn has no name: ${JSON.stringify(call)}`)
    let args = call.arguments !== undefined ? call.arguments : fn.arguments !== undefined ? fn.arguments : {}
    if (typeof args !== 'string') args = JSON.stringify(args)
    return { id: call.id || `call_${turn + 1}_${i + 1}`, name, arguments: args }
  })
  const out = {
    content: message.content ?? null,
    tool_calls: calls,
    usage: {
      input_tokens: Number(usage.input_tokens ?? usage.prompt_tokens ?? usage.inputTokens ?? 0) || 0,
      output_tokens: Number(usage.output_tokens ?? usage.completion_tokens ?? usage.outputTokens ?? 0) || 0,
    },
  }
  const reasoning = message.reasoning || message.reasoning_content
  if (reasoning) out.reasoning = reasoning
  return out
}

/**
 * The adapter the native drive loop calls for each turn. A model is an OpenAI-compatible
 * client (`client.chat.completions.create`), an object with `complete(messages, tools)`, or a
 * function `(messages, tools) => turn`; sync or async.
 */
function modelAdapter(model, modelName) {
  const create = model && model.chat && model.chat.completions && model.chat.completions.create
  if (!(typeof model === 'function' || (model && typeof model.complete === 'function') || typeof create === 'function')) {
    throw invalid(`the model is not a function and has neither complete() nor chat.completions.create()`)
  }
  return async function complete(requestJson) {
    const { messages, tools, turn } = JSON.parse(requestJson)
    let result
    try {
      if (typeof create === 'function') {
        const body = { model: modelName, messages }
        if (tools.length) body.tools = tools
        result = await create.call(model.chat.completions, body)
      } else if (typeof model === 'function') {
        result = await model(messages, tools)
      } else {
        result = await model.complete(messages, tools)
      }
    } catch (error) {
      // A bug in the model's code is not retried away; anything else (a network error, an
      // HTTP status) leaves the run interrupted where it was.
      const bug = error instanceof TypeError || error instanceof ReferenceError || error instanceof SyntaxError || error instanceof RangeError
      const text = `${error && error.name ? error.name : 'Error'}: ${error && error.message ? error.message : String(error)}`
      return JSON.stringify(bug ? { bug: text } : { failed: text })
    }
    try {
      return JSON.stringify({ turn: assistantTurn(result, turn, modelName) })
    } catch (error) {
      return JSON.stringify({ bug: error.message })
    }
  }
}

function adapters(config, model, tools) {
  if (!(config instanceof Config)) throw invalid('the second argument must be a Config')
  const box = tools === undefined || tools === null ? null : toolbox(tools)
  return {
    model: model === undefined || model === null ? undefined : modelAdapter(model, config.modelName),
    tools: box ? box.call : undefined,
    declarations: box ? box.declarations : undefined,
  }
}

function checkStore(store) {
  if (!(store instanceof Store)) throw invalid('the first argument must be a Store (await Store.open(url))')
}

/** A stop flag that an AbortSignal sets; detached once the call ends. */
function stopFor(signal) {
  const stop = new native.NativeStop()
  if (!signal) return { stop, done() {} }
  if (typeof signal.addEventListener !== 'function' || typeof signal.aborted !== 'boolean') {
    throw invalid('signal must be an AbortSignal (new AbortController().signal)')
  }
  if (signal.aborted) stop.set()
  const onAbort = () => stop.set()
  signal.addEventListener('abort', onAbort, { once: true })
  return { stop, done: () => signal.removeEventListener('abort', onAbort) }
}

// ---------------------------------------------------------------------------------------------
// Host, Journal, Worker

/**
 * Starts and drives runs with a model and tools (`run`), continues its own runs
 * (`resumeRun`), runs workflows (`parallelResumable`), and journals runs whose loop it
 * drives itself (`start`, `resume`). It beats a heartbeat from `Host.open` until `close()`:
 * while it beats its runs are its own; once it stops (or the process dies), the fleet
 * recovers what it left unfinished.
 */
class Host {
  constructor() {
    throw invalid('open a host with `await Host.open(store, config, options)`')
  }

  static async open(store, config, { model, tools, stateDir, holderId, leaseTtlMs } = {}) {
    checkStore(store)
    const a = adapters(config, model, tools)
    const handle = sync(() => new native.NativeHost(store._native, config._native, a.model, a.tools, a.declarations, {
      stateDir, holderId, leaseTtlMs,
    }))
    await settle(() => handle.begin())
    const host = Object.create(Host.prototype)
    host.store = store
    host.config = config
    host._native = handle
    return host
  }

  get holderId() {
    return this._native.holderId
  }

  get fingerprint() {
    return this._native.fingerprint
  }

  /**
   * Starts run `runId` with `prompt` and drives it until it ends, parks or is stopped
   * (`signal` aborted, or `stop()`: after the current step). Resolves to `{run_id, status:
   * finished|parked|waiting_for_input|stopped, terminal | parked}`.
   */
  async run(runId, prompt, { sessionId, signal } = {}) {
    if (typeof prompt !== 'string') throw invalid(`run "${runId}": the prompt must be a string`)
    const { stop, done } = stopFor(signal)
    try {
      return await json(() => this._native.run(String(runId), String(prompt), sessionId, stop))
    } finally {
      done()
    }
  }

  /** Continues run `runId` under its own ID (its earlier holder fenced) and drives it. */
  async resumeRun(runId, { signal } = {}) {
    const { stop, done } = stopFor(signal)
    try {
      return await json(() => this._native.resumeRun(String(runId), stop))
    } finally {
      done()
    }
  }

  /** Starts a run whose loop this host drives: record each step on the Journal. */
  async start(runId, prompt, { sessionId } = {}) {
    if (typeof prompt !== 'string') throw invalid(`run "${runId}": the prompt must be a string`)
    return new Journal(await settle(() => committing(this._native.start(String(runId), String(prompt), sessionId))))
  }

  /** Takes a run over (fencing its earlier holder) to journal the rest of its loop. */
  async resume(runId) {
    return new Journal(await settle(() => committing(this._native.resume(String(runId)))))
  }

  /**
   * Runs workflow `workflowId`: each spec (`{step, prompt, sessionId?}`) becomes run
   * `<workflowId>.<step>`, executed by the fleet's workers; resolves when all finished. Run
   * again after a crash, it skips finished steps.
   */
  parallelResumable(specs, workflowId, { pollMs = 500 } = {}) {
    if (!Array.isArray(specs)) return Promise.reject(invalid('parallelResumable: specs must be an array'))
    const steps = specs.map((s) => ({ step: s.step, prompt: s.prompt, session_id: s.sessionId ?? s.session_id }))
    return json(() => this._native.parallelResumable(JSON.stringify(steps), String(workflowId), pollMs))
  }

  /** Asks the runs this host drives now to stop after their current step. */
  stop() {
    this._native.stop()
  }

  /**
   * Stops the runs in flight after their step, then stops the heartbeat and removes it: what
   * this host leaves unfinished is the fleet's to recover at once.
   */
  close() {
    return settle(() => this._native.close())
  }
}

/** A run whose loop the host drives: each record is durable before its promise resolves. */
class Journal {
  constructor(handle) {
    this._native = handle
    // Records land in the order they were called, even when the caller does not await each
    // one before the next (two native calls in flight could otherwise reach the run in
    // either order, and a tool result before its model turn is refused).
    this._tail = Promise.resolve()
  }

  get runId() {
    return this._native.runId
  }

  /** The committed state, or null once handed back. */
  state() {
    return json(() => this._native.state())
  }

  /** The lease epoch this host journals at, or null once handed back. */
  epoch() {
    return json(() => this._native.epoch())
  }

  _record(call) {
    const recorded = this._tail.then(() => json(() => committing(call())))
    this._tail = recorded.catch(() => {})
    return recorded
  }

  /** Records the model's turn: its text and tool calls (`[{id, name, arguments}]`). */
  recordModelTurn(content, toolCalls, { inputTokens = 0, outputTokens = 0, reasoning } = {}) {
    let calls
    if (toolCalls !== undefined && toolCalls !== null) {
      if (!Array.isArray(toolCalls)) return Promise.reject(invalid(`run "${this.runId}": toolCalls must be an array of {id, name, arguments}`))
      calls = JSON.stringify(toolCalls)
    }
    return this._record(() => this._native.recordModelTurn(content ?? undefined, calls, inputTokens, outputTokens, reasoning))
  }

  /** Records a tool call's result. */
  recordToolResult(callId, output, { isError = false, durationMs = 0 } = {}) {
    // As a tool function's result: a string as it is, anything else as JSON.
    const text = typeof output === 'string' ? output : JSON.stringify(output ?? null)
    return this._record(() => this._native.recordToolResult(String(callId), text, !!isError, durationMs))
  }

  /** Records more user input. */
  recordUserMessage(text) {
    return this._record(() => this._native.recordUserMessage(String(text)))
  }

  /** Parks the run until a human approves or denies `callId` (Store.answer); hands it back. */
  askConfirmation(callId, prompt) {
    return this._record(() => this._native.askConfirmation(String(callId), String(prompt)))
  }

  /** Parks the run until a human answers `questionId`; hands it back. */
  askQuestion(questionId, text) {
    return this._record(() => this._native.askQuestion(String(questionId), String(text)))
  }

  /** Ends the run (completed, failed, cancelled, budget, step_cap) and hands it back. */
  finish(outcome = 'completed', message = '') {
    return this._record(() => this._native.finish(String(outcome), String(message)))
  }

  /** Hands the run back unfinished (after the records called before it): its lease is released. */
  close() {
    const closed = this._tail.then(() => settle(() => committing(this._native.close())))
    this._tail = closed.catch(() => {})
    return closed
  }
}

/**
 * Executes the recoveries the coordinator assigns to it, with this process's model and
 * tools: a full fleet member, as rekindle-worker is. Given `listen` (e.g. '0.0.0.0:9090'),
 * it serves /healthz, /readyz, /metrics and POST /wake there.
 */
class Worker {
  constructor(store, config, { model, tools, workerId, concurrency, queue, ttlMs, pollIntervalMs, listen, advertise, stateDir } = {}) {
    checkStore(store)
    for (const [name, value] of Object.entries({ concurrency, queue, ttlMs, pollIntervalMs })) {
      if (value !== undefined && !(Number.isInteger(value) && value >= (name === 'queue' ? 0 : 1))) {
        throw invalid(`Worker: ${name} is ${JSON.stringify(value)}; it must be a whole number of at least ${name === 'queue' ? 0 : 1}`)
      }
    }
    const a = adapters(config, model, tools)
    this.store = store
    this.config = config
    this._native = sync(() => new native.NativeWorker(store._native, config._native, a.model, a.tools, a.declarations, {
      workerId, concurrency, queue, ttlMs, pollIntervalMs, listen, advertise, stateDir,
    }))
  }

  get workerId() {
    return this._native.workerId
  }

  get fingerprint() {
    return this._native.fingerprint
  }

  /** Runs until `stop()` (or `signal` aborts): the running recoveries finish their step and are handed back. */
  async run({ signal } = {}) {
    const onAbort = () => this.stop()
    if (signal) {
      if (signal.aborted) this.stop()
      signal.addEventListener('abort', onAbort, { once: true })
    }
    try {
      await settle(() => this._native.run())
    } finally {
      if (signal) signal.removeEventListener('abort', onAbort)
    }
  }

  /** Asks the worker to stop gracefully. */
  stop() {
    this._native.stop()
  }

  /** Attempts started, recoveries finished, attempts failed and fenced so far. */
  stats() {
    return JSON.parse(this._native.stats())
  }
}

module.exports = {
  CallContext,
  Config,
  Host,
  Journal,
  RekindleError,
  Store,
  Tool,
  Worker,
  tool,
  ConflictError: classes.conflict,
  UnavailableError: classes.unavailable,
  FencedError: classes.fenced,
  NotFoundError: classes.not_found,
  RefusedError: classes.refused,
  InvalidInputError: classes.invalid_input,
  CorruptError: classes.corrupt,
  InternalError: classes.internal,
}
