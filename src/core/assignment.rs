//! The assignment wire types shared by the coordinator, the worker, the fleet and workflows:
//! a worker's registration, its inbox, and the deterministic recovery ID of a source run.
//!
//! Architecture invariant: a coordinator restart never admits a run twice — recovery IDs are
//! derived from the source run ([`recovery_id_for`]) and admission is idempotent.

use serde::{Deserialize, Serialize};

use crate::core::fact::{RecoveryId, RunId};
use crate::core::layout::FORMAT_VERSION;

/// The prefix of the coordinator's recovery IDs; no host run may use it.
pub const RECOVERY_ID_PREFIX: &str = "recovery-of-";

/// The deterministic recovery ID of a source run.
pub fn recovery_id_for(source: &RunId) -> RecoveryId {
    RecoveryId::new(format!("{RECOVERY_ID_PREFIX}{source}"))
}

/// A worker's registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub format: u32,
    pub kind: String,
    pub worker: String,
    pub heartbeat: String,
    pub capacity: u32,
    pub fingerprint_sha256: String,
    /// The lease TTL the worker declared: it is judged dead only after this long silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl Registration {
    pub fn new(worker: &str, heartbeat: String, capacity: u32, fingerprint_sha256: String) -> Self {
        Registration {
            format: FORMAT_VERSION,
            kind: "worker".into(),
            worker: worker.to_owned(),
            heartbeat,
            capacity,
            fingerprint_sha256,
            ttl_ms: None,
        }
    }
}

/// The recoveries assigned to one worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inbox {
    pub format: u32,
    pub kind: String,
    pub worker: String,
    pub recoveries: Vec<RecoveryId>,
}
