//! The assignment wire types shared by the coordinator, the worker, the fleet and workflows:
//! a worker's registration, its inbox, and the deterministic recovery ID of a source run.
//!
//! Architecture invariant: a coordinator restart never admits a run twice — recovery IDs are
//! derived from the source run ([`recovery_id_for`]) and admission is idempotent.

use serde::{Deserialize, Serialize};

use crate::core::fact::{RecoveryId, RunId};
use crate::core::layout::FORMAT_VERSION;
use crate::core::record::RecoveryRecord;

/// The prefix of the coordinator's recovery IDs; no host run may use it.
pub const RECOVERY_ID_PREFIX: &str = "recovery-of-";

/// The deterministic recovery ID of a source run.
pub fn recovery_id_for(source: &RunId) -> RecoveryId {
    RecoveryId::new(format!("{RECOVERY_ID_PREFIX}{source}"))
}

/// The envelope kind of a worker registration.
pub const REGISTRATION_KIND: &str = "worker";

/// A worker's registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The object format version the registration was written with.
    pub format: u32,
    /// The envelope kind, always `"worker"`.
    pub kind: String,
    /// The worker's ID.
    pub worker: String,
    /// The key of the heartbeat object that says whether the worker is alive.
    pub heartbeat: String,
    /// How many recoveries the worker runs at once.
    pub capacity: u32,
    /// How many recoveries may wait assigned to the worker beyond `capacity`: when a slot
    /// frees, the worker starts the next of them at once instead of waiting for the
    /// coordinator's next tick. Absent (as from older workers): none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
    /// The SHA-256 of the worker's configuration fingerprint; it is assigned only runs with it.
    pub fingerprint_sha256: String,
    /// The lease TTL the worker declared: it is judged dead only after this long silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The longer TTL the worker declares while it runs no recovery (it beats less often
    /// then); while it runs one, `ttl_ms` holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ttl_ms: Option<u64>,
    /// The worker is stopping: it is offered nothing more, and what waits for it moves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// Where the worker takes wake-ups (`http://host:port`), so an assignment reaches it at
    /// once instead of at its next inbox poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<String>,
}

impl Registration {
    /// A registration in the current format, with no declared lease TTL.
    pub fn new(worker: &str, heartbeat: String, capacity: u32, fingerprint_sha256: String) -> Self {
        Registration {
            format: FORMAT_VERSION,
            kind: REGISTRATION_KIND.into(),
            worker: worker.to_owned(),
            heartbeat,
            capacity,
            queue: None,
            fingerprint_sha256,
            ttl_ms: None,
            idle_ttl_ms: None,
            draining: false,
            wake: None,
        }
    }
}

/// The recoveries assigned to one worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbox {
    /// The object format version the inbox was written with.
    pub format: u32,
    /// The envelope kind, always `"inbox"`.
    pub kind: String,
    /// The worker the recoveries are assigned to.
    pub worker: String,
    /// The recoveries assigned to the worker, by ID.
    pub recoveries: Vec<RecoveryId>,
    /// Where the leading coordinator takes wake-ups, so the worker can tell it at once when
    /// a slot frees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_wake: Option<String>,
    /// The records of the recoveries offered by the tick that wrote this inbox, each at the
    /// version the offer left it: the worker starts one by compare-and-swap on that version
    /// without reading it first. A hint, never the truth: a record changed since fails the
    /// swap and is read as usual.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offers: Vec<Offer>,
}

/// A recovery record as an assignment left it, carried in the worker's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The record right after the assignment.
    pub record: RecoveryRecord,
    /// Its version (the ETag the assignment's compare-and-swap returned).
    pub etag: String,
}
