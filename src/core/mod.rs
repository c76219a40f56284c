//! The pure core: facts, the fold, fingerprints, the bucket layout, the recovery lifecycle's
//! rules and the coordinator's placement policy.
//!
//! Architecture invariant: nothing under `core/` does I/O, reads a clock, or awaits. Every
//! decision the fleet makes about a run is a function here of values read elsewhere, so it
//! can be tested (and replayed by the simulation) without a store. `tests/layers.rs` fails if a
//! file here imports the store, the fleet or tokio, or contains `async`/`.await`.

pub mod assignment;
pub mod digest;
pub mod epoch;
pub mod fact;
pub mod fingerprint;
pub mod fold;
pub mod layout;
pub mod lifecycle;
pub mod liveness;
pub mod placement;
pub mod record;
pub mod rng;
pub mod sample;
