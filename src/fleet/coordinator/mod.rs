//! The coordinator: finds interrupted runs and assigns their recoveries to live workers.
//!
//! This module owns leadership (one active coordinator, by a lease; a standby takes over when
//! the leader stops beating), observing the fleet through the bucket (the index, worker
//! registrations, heartbeats, recovery records) and the pure [`crate::core::placement::decide`]
//! that turns an observation into actions. Polling stays cheap: per tick, one LIST each of the
//! index and the heartbeats (liveness comes from the listed ETags; the registrations live
//! beside the heartbeats, so the same listing says which changed), and GETs only for
//! registrations and index entries that changed and for runs being recovered. It never
//! executes a run.
//!
//! The faces, by what each owns:
//!
//! | face | owns | never does |
//! | --- | --- | --- |
//! | `run` | leadership and standby, the loop, pacing, waiting, shutdown | decide what a tick does |
//! | `memory` | what is remembered between turns, and the judgements over it | await, take the store |
//! | `observe` | one look at the bucket; the heartbeat watch between ticks | decide |
//! | `tick` | observe → judge → decide → execute → inboxes → clean up | hold state of its own |
//! | `named` | placing recoveries a wake-up named, on the last full tick's view | write a record except through the executor |
//! | `execute` | actions → lifecycle events | observe or remember |
//! | `inbox` | the inbox object's only reader and writer | decide assignments |
//! | `cleanup` | removing dead hosts' heartbeats | touch leases or records |
//! | `gauges` | the leader's view as metrics | decide anything |
//!
//! Architecture invariant: a coordinator restart never admits a run twice — recovery IDs are
//! derived from the source run ([`recovery_id_for`]) and admission is idempotent.

mod cleanup;
mod execute;
mod gauges;
mod inbox;
mod memory;
mod named;
mod observe;
mod run;
mod share;
#[cfg(test)]
mod tests;
mod tick;

use crate::core::assignment::{Inbox, InboxPart, Offer, Registration, recovery_id_for};
use crate::core::epoch::Epoch;
use crate::core::fact::{RecoveryId, RunId};
use crate::core::layout::{self, FORMAT_VERSION};
use crate::core::lifecycle::Event;
use crate::core::liveness::{self, ExpiryWatch, Judge, Seen};
use crate::core::placement::{self, Action, RunView, WorkerView};
use crate::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryState};
use crate::error::Error;
use crate::fleet::admission;
use crate::fleet::admission::Takeover;
use crate::fleet::lifecycle;
use crate::fleet::lifecycle::LifecycleError;
use crate::fleet::wake::Wakeup;
use crate::store::index::{Holding, IndexError, IndexWatch};
use crate::store::lease::{Attempt, Held, Holder, LeaseError};
use crate::store::recovery::{self, RecoveryError};
use crate::store::{ETag, Store, StoreError};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// The faces share one namespace: each reaches the others through this module.
use self::{
    cleanup::*, execute::*, gauges::*, inbox::*, memory::*, named::*, observe::*, share::*, tick::*,
};

pub use self::cleanup::DEAD_AFTER_TTLS;
pub use self::inbox::read_inbox;
pub use self::run::run;
pub use self::tick::tick_once;

/// How a coordinator identifies itself, judges liveness and paces its ticks.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// This coordinator's holder ID, on its heartbeat and on the leadership lease.
    pub id: String,
    /// The TTL of its own lease and heartbeat, and the shortest silence after which it judges
    /// any holder gone.
    pub ttl: Duration,
    /// How long it waits between ticks (scans of the index and heartbeats).
    pub scan_interval: Duration,
    /// Failed attempts (errors, or workers that died mid-attempt) before a recovery is
    /// dead-lettered. Yields, parks and graceful hand-backs do not count.
    pub max_attempts: u32,
    /// How long it waits between ticks while the last one found no run to watch (an idle
    /// fleet); a wake-up (a new run, an admission) cuts the wait short.
    pub idle_scan_interval: Duration,
    /// Between ticks, while some live process holds runs, how often it lists only the
    /// heartbeats to see one fall silent (and exactly when a silent one's TTL runs out), so
    /// a dead holder's runs are admitted within its TTL plus this interval. At least the
    /// scan interval turns the watch off.
    pub watch_interval: Duration,
    /// Wake-ups that cut a wait between ticks short (see `fleet::wake`), and the address
    /// that reaches them, advertised in its heartbeat and in the workers' inboxes.
    pub wake: Option<(Wakeup, Option<String>)>,
    /// What the process's `/readyz` answers, kept up to date by the loop.
    pub readiness: Option<Arc<crate::fleet::readiness::Readiness>>,
    /// The partition count to split the bucket into if it is not split yet (`None`: the
    /// bucket's own count, one if it names none). A bucket split into another count refuses
    /// to start the coordinator.
    pub partitions: Option<u32>,
}

impl CoordinatorOptions {
    /// Options with the defaults of `rekindle-coordinator`, no wake-ups.
    pub fn new(id: impl Into<String>, ttl: Duration) -> Self {
        CoordinatorOptions {
            id: id.into(),
            ttl,
            scan_interval: Duration::from_secs(10),
            max_attempts: placement::DEFAULT_MAX_ATTEMPTS,
            idle_scan_interval: Duration::from_secs(60),
            watch_interval: Duration::from_secs(1),
            wake: None,
            readiness: None,
            partitions: None,
        }
    }

    fn wake_url(&self) -> Option<String> {
        self.wake.as_ref().and_then(|(_, url)| url.clone())
    }
}

/// What one tick saw and did, for the loop's pacing.
#[derive(Debug, Default)]
pub struct TickReport {
    /// The actions decided.
    pub actions: Vec<Action>,
    /// Whether any run is being watched or recovered (the fleet is not idle).
    pub busy: bool,
    /// Whether some live process holds runs whose silence the coordinator must notice.
    pub watching: bool,
    /// Something changed that another tick should act on now (an admission to assign, a
    /// hand-back to re-offer, a worker that did not answer its wake-up).
    pub again: bool,
    /// When the freshest record of a running recovery this tick took from its cache (rather
    /// than reading it) is due to be read again: a worker that hands a recovery back changes
    /// only its record, so a wake-up it sent is acted on once that record is read.
    pub recheck: Option<Duration>,
}
