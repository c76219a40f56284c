//! Run generations: the immutable objects that commit a run's facts to the bucket.
//!
//! This module owns the generation object format, the chain of numbered generations
//! (`runs/<shard>/<run>/gen/<n>`), committing (exactly one create-if-absent PUT per commit),
//! fencing, the snapshot policy, finding the newest generation without a LIST, and loading a
//! run back with every continuity check. It never holds or judges leases: the epoch it writes
//! with is handed to it.
//!
//! Architecture invariant: a committed generation is never modified (brief, invariant 1).
//! Generations are created with create-if-absent and never overwritten; gc deletes only
//! superseded ones (or, once a run is retired behind its tombstone, all but the epochs'
//! first), and never the first generation of an epoch (see `gc.rs`). A retired run loads as
//! [`GenerationError::Retired`], never from what is left.
//!
//! Architecture invariant: a zombie writer cannot commit after its successor's first commit
//! (brief, invariant 2). Generation numbers are slots: a writer creates slot `n + 1` only after
//! it wrote or read slot `n`. A new lease holder's first act is a fence generation in the next
//! free slot carrying its higher epoch. The old writer's next create hits an occupied slot,
//! reads it, sees the higher epoch and stops with [`GenerationError::Fenced`]. Slots written by
//! the old writer before the fence are simply part of the chain: the fence comes after them.
//!
//! Architecture invariant: nothing acknowledged is lost (brief, invariant 8): `commit` returns
//! only after the generation holding the facts exists in the store, or after reading back the
//! occupied slot and finding our own writer nonce there (a lost response).
//!
//! The module is split by responsibility: `format` (the object, its error, the snapshot policy,
//! decoding with every per-object check, and `check_link`, the chain rule between two
//! neighbours; no I/O), `chain` (numbered slots and the hint: finding the newest without a
//! LIST), `load` (reading a run back) and `writer` (committing and fencing).

mod chain;
mod format;
mod load;
mod writer;

pub use chain::{Chain, HintState, HintView, Located, SlotWrite};
pub use format::{Generation, GenerationError, SnapshotPolicy, decode, decode_with};
pub use load::{Loaded, load, load_pinned};
pub use writer::RunWriter;
