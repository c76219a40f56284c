// ES module entry: the same objects as the CommonJS entry (index.cjs), so `import` and
// `require` consumers share one native module and one set of error classes.
import rekindle from './index.cjs'

export const {
  CallContext,
  Config,
  ConflictError,
  CorruptError,
  FencedError,
  Host,
  InternalError,
  InvalidInputError,
  Journal,
  NotFoundError,
  RefusedError,
  RekindleError,
  Store,
  Tool,
  UnavailableError,
  Worker,
  tool,
} = rekindle
export default rekindle
