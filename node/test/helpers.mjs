// Stores (a local directory, and the S3 test server `scripts/test` starts), the fleet
// binaries, and processes started from agent.mjs, all killed after each test.
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomUUID } from 'node:crypto'
import assert from 'node:assert/strict'
import { NotFoundError } from '../index.mjs'

const HERE = path.dirname(fileURLToPath(import.meta.url))
const REPO = path.resolve(HERE, '..', '..')

export function binPath(name) {
  const dir = process.env.REKINDLE_BIN_DIR || path.join(REPO, 'target', 'debug')
  const file = path.join(dir, name)
  if (!fs.existsSync(file)) throw new Error(`${file} is missing: build the binaries (cargo build --bins) or set REKINDLE_BIN_DIR`)
  return file
}

export function tempDir() {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'rekindle-node-'))
}

/** The stores a test runs on: a local directory, and the S3 test server when there is one. */
export function storeUrls(tmp) {
  const urls = [['local', path.join(tmp, 'bucket')]]
  const base = process.env.REKINDLE_TEST_S3_URL
  if (base) urls.push(['s3', `${base.replace(/\/$/, '')}/js-${randomUUID().slice(0, 12)}`])
  else if (process.env.REKINDLE_REQUIRE_S3) throw new Error('REKINDLE_TEST_S3_URL is not set: run the tests through scripts/test')
  return urls
}

/** Processes of one test: started here, killed at the end. */
export class Fleet {
  constructor(url, tmp) {
    this.url = url
    this.tmp = tmp
    this.ledger = path.join(tmp, 'ledger.jsonl')
    this.procs = []
  }

  spawn(cmd, args, options = {}) {
    const logPath = path.join(this.tmp, `proc-${this.procs.length}.log`)
    const log = fs.openSync(logPath, 'w')
    const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', log], ...options })
    proc.logPath = logPath
    proc.lines = []
    proc.stdout.setEncoding('utf8')
    let buffer = ''
    proc.stdout.on('data', (chunk) => {
      buffer += chunk
      let at
      while ((at = buffer.indexOf('\n')) >= 0) {
        proc.lines.push(buffer.slice(0, at))
        buffer = buffer.slice(at + 1)
      }
    })
    proc.exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve(signal || code)))
    this.procs.push(proc)
    return proc
  }

  agent(role, ...rest) {
    const state = path.join(this.tmp, `state-${role}-${this.procs.length}`)
    return this.spawn(process.execPath, [path.join(HERE, 'agent.mjs'), role, this.url, this.ledger, state, ...rest.map(String)])
  }

  coordinator() {
    return this.spawn(binPath('rekindle-coordinator'), ['--store', this.url, '--lease-ttl-ms', '2000',
      '--scan-interval-ms', '200', '--idle-scan-interval-ms', '500', '--watch-interval-ms', '200'])
  }

  async worker(workerId = 'js-worker-1') {
    const proc = this.agent('worker', workerId)
    await waitFor('the worker to be ready', () => proc.lines.includes('worker ready') || proc.exitCode !== null)
    assert.ok(proc.lines.includes('worker ready'), this.log(proc))
    return proc
  }

  log(proc) {
    return fs.readFileSync(proc.logPath, 'utf8')
  }

  ledgerLines() {
    if (!fs.existsSync(this.ledger)) return []
    return fs.readFileSync(this.ledger, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
  }

  stop() {
    for (const proc of this.procs) if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL')
  }
}

export async function waitFor(what, check, { timeoutMs = 60_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, intervalMs))
  }
}

/** The run's terminal fact once it has one (null while it runs or does not exist yet). */
export async function finished(store, runId) {
  try {
    return (await store.load(runId)).terminal
  } catch (error) {
    if (error instanceof NotFoundError) return null
    throw error
  }
}

/** The recovery's record once it says finished. */
export async function recordedFinished(store, recoveryId) {
  const record = await store.recovery(recoveryId)
  return record && record.state === 'finished' ? record : null
}

/** Every call of the run ran, none more often than once plus the interruptions. */
export function audit(lines, runId, steps, interruptions) {
  const counts = {}
  for (const line of lines) if (line.run === runId) counts[line.call] = (counts[line.call] || 0) + 1
  const expected = Array.from({ length: steps }, (_, i) => `call_${i + 1}_1`).sort()
  assert.deepEqual(Object.keys(counts).sort(), expected, JSON.stringify(counts))
  const over = Object.entries(counts).filter(([, n]) => n > 1 + interruptions)
  assert.deepEqual(over, [], `calls ran more often than once plus ${interruptions} interruption(s)`)
  return counts
}
