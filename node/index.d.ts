// Types of Rekindle's Node.js package (index.cjs / index.mjs). Checked by `npm run typecheck`
// against test/types.ts.

/** What to do next, for every error the package raises. */
export type ErrorKind =
  | 'fenced' | 'conflict' | 'unavailable' | 'not_found' | 'refused' | 'invalid_input' | 'corrupt' | 'internal'

/** Base of every Rekindle error; `kind` says what to do next. */
export class RekindleError extends Error {
  readonly kind: ErrorKind | 'error'
}
/** Someone else changed the state first: reread and retry. */
export class ConflictError extends RekindleError { readonly kind: 'conflict' }
/** The store, the disk or the model is unavailable: back off and retry. */
export class UnavailableError extends RekindleError { readonly kind: 'unavailable' }
/** Another writer owns the run now: stop, do not retry. */
export class FencedError extends RekindleError { readonly kind: 'fenced' }
/** The named run, recovery or object does not exist. */
export class NotFoundError extends RekindleError { readonly kind: 'not_found' }
/** The current state forbids the request: change the request or accept the state. */
export class RefusedError extends RekindleError { readonly kind: 'refused' }
/** The request or the configuration is wrong: fix the input. */
export class InvalidInputError extends RekindleError { readonly kind: 'invalid_input' }
/** Stored data is damaged or from a newer build: a human must look. */
export class CorruptError extends RekindleError { readonly kind: 'corrupt' }
/** A bug in Rekindle. */
export class InternalError extends RekindleError { readonly kind: 'internal' }

/** A JSON value, as runs, records and sessions hold them. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json }

export interface StoreOptions {
  /** An S3-compatible endpoint (MinIO, a test server); else AWS_ENDPOINT_URL or AWS. */
  endpoint?: string
  /** Plain HTTP to the endpoint; else AWS_ALLOW_HTTP. */
  allowHttp?: boolean
  region?: string
  virtualHostedStyle?: boolean
  /** Each request's deadline (default 30 000). */
  timeoutMs?: number
  /** Retries of a request worth retrying (default 8). */
  retries?: number
  /** Create the store if it is empty (default true). */
  create?: boolean
}

/** A chat-completions message, as models receive them and `load()` shows them. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool'
  content: string | null
  tool_calls?: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }>
  tool_call_id?: string
}

/** A run's committed state, folded. */
export interface RunState {
  run_id: string | null
  session_id: string | null
  last_seq: number
  next_step: { step: string; [key: string]: Json }
  pending_tool_calls: Array<{ call: { id: string; name: string; arguments: string }; [key: string]: Json }>
  parked: { waiting_for: 'confirmation' | 'answer'; call_id?: string; question_id?: string; [key: string]: Json | undefined } | null
  terminal: { outcome: Outcome; message: string } | null
  counters: { model_turns: number; tool_results: number; [key: string]: number }
  messages: ChatMessage[]
}

/** How a run ended. */
export type Outcome = 'completed' | 'failed' | 'cancelled' | 'budget' | 'step_cap'

/** How a driven run stopped. */
export interface RunResult {
  run_id: string
  status: 'finished' | 'parked' | 'waiting_for_input' | 'stopped'
  terminal?: { outcome: Outcome; message: string }
  parked?: RunState['parked']
}

/** A recovery's record. */
export interface RecoveryRecord {
  recovery_id: string
  source_run: string
  state: string
  [key: string]: Json
}

export type Answer = { callId: string; approve: boolean } | { questionId: string; text: string }

export class Store {
  private constructor()
  /** Opens the store at `url`: a local directory, `s3://bucket/prefix` or `memory://`. */
  static open(url: string, options?: StoreOptions): Promise<Store>
  readonly url: string
  /** Requests this process sent to the store so far, by kind, with `requests` their total. */
  requests(): { requests: number; get: number; put: number; conditional_put: number; list: number; delete: number; head: number; [kind: string]: number }
  /** Spawns the recovery of `sourceRunId` under the host-chosen, idempotent `recoveryId`. */
  spawnRecoveryWithRunId(sourceRunId: string, recoveryId: string, options?: { force?: boolean; takeover?: boolean }): Promise<RecoveryRecord>
  /** Answers a parked run. */
  answer(runId: string, answer: Answer): Promise<void>
  /** One look at the fleet: the leader, workers, runs not yet done, stuck work. */
  status(): Promise<{ leader: Json; workers: Json[]; runs: Json[]; stuck: Json[]; [key: string]: Json }>
  /** The runs not yet done. */
  runs(): Promise<Json[]>
  /** A run's committed state. */
  load(runId: string): Promise<RunState>
  /** The recovery record of `recoveryId`, or null. */
  recovery(recoveryId: string): Promise<RecoveryRecord | null>
  /** Saves a session snapshot if the newest still has digest `expected`; ConflictError otherwise. */
  saveSession(sessionId: string, data: Json, options?: { expected?: string | null }): Promise<{ generation: number; digest: string }>
  /** The newest session snapshot, or null. */
  loadSession(sessionId: string): Promise<{ data: Json; generation: number; digest: string } | null>
}

export interface ConfigOptions {
  systemPrompt?: string
  maxIterations?: number
  maxTokens?: number
  maxToolRounds?: number
  stepsPerResume?: number
  thinking?: string
}

/** A run's configuration; its fingerprint guards every resume and places work. */
export class Config {
  constructor(modelName: string, options?: ConfigOptions)
  /** Reads a rekindle.toml (its model and command tools are used unless others are given). */
  static load(path: string): Config
  readonly modelName: string
  readonly systemPrompt: string
  /** The SHA-256 of the fingerprint, with these tools in place of the configuration's own. */
  fingerprint(tools?: ToolsLike): string
}

/** Who makes a tool call. */
export class CallContext {
  readonly runId: string
  readonly callId: string
  readonly epoch: number
  /** The same every time the same logical call runs (after a crash, at most once more). */
  readonly idempotencyKey: string
}

export type ToolFunction = (args: any, ctx: CallContext) => unknown | Promise<unknown>

export interface ToolOptions {
  name?: string
  description?: string
  /** The JSON Schema of the arguments (part of the fingerprint). */
  schema?: Json
  /** A human approves each call first: the run parks until `Store.answer`. */
  confirm?: boolean
}

export class Tool {
  constructor(fn: ToolFunction, options?: ToolOptions)
  readonly fn: ToolFunction
  readonly name: string
  readonly description: string
  readonly schema: Json
  readonly confirm: boolean
}

export function tool(fn: ToolFunction, options?: ToolOptions): Tool

export type ToolsLike = Array<Tool | ToolFunction> | Record<string, ToolFunction | Tool>

/** One assistant turn, as a model may return it. */
export type ModelTurn =
  | string
  | { content?: string | null; tool_calls?: Array<{ id?: string; name?: string; arguments?: unknown; function?: { name: string; arguments: unknown } }>; usage?: Record<string, number>; reasoning?: string }
  | { choices: Array<{ message: unknown }>; usage?: Record<string, number> }

export type ModelFunction = (messages: ChatMessage[], tools: Json[]) => ModelTurn | Promise<ModelTurn>

/** A function, an object with `complete()`, or an OpenAI-compatible client. */
export type ModelLike =
  | ModelFunction
  | { complete: ModelFunction }
  | { chat: { completions: { create(body: { model: string; messages: ChatMessage[]; tools?: Json[] }): unknown } } }

export interface HostOptions {
  model?: ModelLike
  tools?: ToolsLike
  /** Where the local fact logs go (default: the state directory). */
  stateDir?: string
  /** The holder ID in this host's leases (default: random per host). */
  holderId?: string
  /** The TTL of its heartbeat and its runs' leases (default 15 000). */
  leaseTtlMs?: number
}

export interface WorkflowStep {
  step: string
  prompt: string
  sessionId?: string
}

export class Host {
  private constructor()
  /** A host that beats from now until `close()`. */
  static open(store: Store, config: Config, options?: HostOptions): Promise<Host>
  readonly store: Store
  readonly config: Config
  readonly holderId: string
  readonly fingerprint: string
  /** Starts run `runId` and drives it until it ends, parks or is stopped (`signal`, `stop()`). */
  run(runId: string, prompt: string, options?: { sessionId?: string; signal?: AbortSignal }): Promise<RunResult>
  /** Continues run `runId` under its own ID and drives it. */
  resumeRun(runId: string, options?: { signal?: AbortSignal }): Promise<RunResult>
  /** Starts a run whose loop this host drives. */
  start(runId: string, prompt: string, options?: { sessionId?: string }): Promise<Journal>
  /** Takes a run over (fencing its earlier holder) to journal the rest of its loop. */
  resume(runId: string): Promise<Journal>
  /** Runs workflow `workflowId`; a rerun after a crash skips finished steps. */
  parallelResumable(specs: WorkflowStep[], workflowId: string, options?: { pollMs?: number }): Promise<{ skipped: string[]; dispatched: string[]; completed: Array<{ step: string; outcome: Outcome; [key: string]: Json }> }>
  /** Asks the runs this host drives now to stop after their current step. */
  stop(): void
  /** Stops the runs in flight after their step, then the heartbeat, and removes it. */
  close(): Promise<void>
}

/** A run whose loop the host drives: each record is durable before its promise resolves. */
export class Journal {
  private constructor()
  readonly runId: string
  state(): Promise<RunState | null>
  epoch(): Promise<number | null>
  recordModelTurn(content: string | null, toolCalls?: Array<{ id: string; name: string; arguments?: unknown }> | null, options?: { inputTokens?: number; outputTokens?: number; reasoning?: string }): Promise<RunState>
  recordToolResult(callId: string, output: string, options?: { isError?: boolean; durationMs?: number }): Promise<RunState>
  recordUserMessage(text: string): Promise<RunState>
  askConfirmation(callId: string, prompt: string): Promise<RunState>
  askQuestion(questionId: string, text: string): Promise<RunState>
  finish(outcome?: Outcome, message?: string): Promise<RunState>
  close(): Promise<void>
}

export interface WorkerOptions {
  model?: ModelLike
  tools?: ToolsLike
  workerId?: string
  /** Recoveries run at once (default 1). */
  concurrency?: number
  /** More that may wait assigned to it (default: as many as run). */
  queue?: number
  /** The TTL of its heartbeat and its recoveries' leases (default 30 000). */
  ttlMs?: number
  /** How often it reads its inbox when nothing wakes it (default 30 000 with a reachable listen address, else 2 000). */
  pollIntervalMs?: number
  /** Serve /healthz, /readyz, /metrics and POST /wake here, e.g. '0.0.0.0:9090'. */
  listen?: string
  /** The address the coordinator reaches /wake at (a URL, or a host such as the pod IP). */
  advertise?: string
  stateDir?: string
}

export class Worker {
  constructor(store: Store, config: Config, options?: WorkerOptions)
  readonly store: Store
  readonly config: Config
  readonly workerId: string
  readonly fingerprint: string
  /** Runs until `stop()` (or `signal` aborts); running recoveries finish their step and are handed back. */
  run(options?: { signal?: AbortSignal }): Promise<void>
  stop(): void
  stats(): { started: number; finished: number; failed: number; fenced: number }
}

declare const rekindle: {
  CallContext: typeof CallContext
  Config: typeof Config
  Host: typeof Host
  Journal: typeof Journal
  RekindleError: typeof RekindleError
  Store: typeof Store
  Tool: typeof Tool
  Worker: typeof Worker
  tool: typeof tool
  ConflictError: typeof ConflictError
  UnavailableError: typeof UnavailableError
  FencedError: typeof FencedError
  NotFoundError: typeof NotFoundError
  RefusedError: typeof RefusedError
  InvalidInputError: typeof InvalidInputError
  CorruptError: typeof CorruptError
  InternalError: typeof InternalError
}
export default rekindle
