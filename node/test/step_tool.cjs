// The `step` tool as a command, for the Rust worker: arguments on stdin, the call's identity
// in REKINDLE_RUN_ID, REKINDLE_CALL_ID and REKINDLE_EPOCH; appends the call to the ledger
// (fsynced) as the JavaScript tool does.
'use strict'
const fs = require('node:fs')
const input = fs.readFileSync(0, 'utf8')
const { n } = JSON.parse(input || '{}')
const line = JSON.stringify({ run: process.env.REKINDLE_RUN_ID, call: process.env.REKINDLE_CALL_ID, epoch: Number(process.env.REKINDLE_EPOCH), pid: process.pid })
const fd = fs.openSync(process.argv[2], 'a')
fs.writeSync(fd, line + '\n')
fs.fsyncSync(fd)
fs.closeSync(fd)
process.stdout.write(`step ${n} done`)
