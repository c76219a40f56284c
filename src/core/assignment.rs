//! The assignment wire types shared by the coordinator, the worker, the fleet and workflows:
//! a worker's registration, its inbox, and the deterministic recovery ID of a source run.
//!
//! Architecture invariant: a coordinator restart never admits a run twice — recovery IDs are
//! derived from the source run ([`recovery_id_for`]) and admission is idempotent.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Where every coordinator that wrote a part takes wake-ups (a bucket split into
    /// partitions: a slot that frees may serve any of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coordinator_wakes: Vec<String>,
    /// In a bucket split into partitions, each partition's part, written by its owner by
    /// compare-and-swap on the inbox; the fields above are their union, so a worker reads the
    /// inbox the same way whoever wrote it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parts: BTreeMap<u32, InboxPart>,
}

/// What one partition's owner assigned a worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxPart {
    /// The recoveries, each with when it was admitted (the union lists oldest first).
    pub queued: Vec<(RecoveryId, u64)>,
    /// Where the partition's owner takes wake-ups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_wake: Option<String>,
    /// The records of the recoveries its last write offered (see [`Inbox::offers`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offers: Vec<Offer>,
}

impl Inbox {
    /// Where the worker wakes its coordinators: every part's writer, or the one coordinator
    /// of a bucket of one partition.
    pub fn wakes(&self) -> Vec<String> {
        if self.coordinator_wakes.is_empty() {
            self.coordinator_wake.iter().cloned().collect()
        } else {
            self.coordinator_wakes.clone()
        }
    }

    /// Replaces the parts of the partitions `owned` with `mine` (an empty part goes, but for
    /// one that keeps the writer's address when all of `mine` are empty) and
    /// recomputes the union the worker reads: every part's recoveries, oldest admission
    /// first, their offers, and their writers' wake-up addresses.
    pub fn merge(
        &mut self,
        owned: &std::collections::BTreeSet<u32>,
        mine: BTreeMap<u32, InboxPart>,
    ) {
        self.parts.retain(|partition, _| !owned.contains(partition));
        let (full, empty): (Vec<_>, Vec<_>) = mine
            .into_iter()
            .filter(|(partition, _)| owned.contains(partition))
            .partition(|(_, part)| !part.queued.is_empty());
        // A writer that assigns the worker nothing now keeps one empty part with its address:
        // a slot that frees may serve what it has waiting, so the worker still wakes it.
        let marker = empty
            .into_iter()
            .find(|(_, part)| part.coordinator_wake.is_some())
            .filter(|_| full.is_empty());
        self.parts.extend(full.into_iter().chain(marker));
        let mut queued: Vec<&(RecoveryId, u64)> =
            self.parts.values().flat_map(|part| &part.queued).collect();
        queued.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        queued.dedup_by(|a, b| a.0 == b.0);
        self.recoveries = queued.into_iter().map(|(id, _)| id.clone()).collect();
        self.offers = self
            .parts
            .values()
            .flat_map(|part| part.offers.iter().cloned())
            .collect();
        let mut wakes: Vec<String> = self
            .parts
            .values()
            .filter_map(|part| part.coordinator_wake.clone())
            .collect();
        wakes.sort();
        wakes.dedup();
        self.coordinator_wake = wakes.first().cloned();
        self.coordinator_wakes = wakes;
    }

    /// How many recoveries the parts of partitions not in `owned` list.
    pub fn elsewhere(&self, owned: &std::collections::BTreeSet<u32>) -> u32 {
        self.parts
            .iter()
            .filter(|(partition, _)| !owned.contains(partition))
            .map(|(_, part)| part.queued.len() as u32)
            .sum()
    }
}

/// A recovery record as an assignment left it, carried in the worker's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The record right after the assignment.
    pub record: RecoveryRecord,
    /// Its version (the ETag the assignment's compare-and-swap returned).
    pub etag: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(ids: &[(&str, u64)], wake: &str) -> InboxPart {
        InboxPart {
            queued: ids
                .iter()
                .map(|(id, at)| (RecoveryId::new(*id), *at))
                .collect(),
            coordinator_wake: Some(wake.into()),
            offers: Vec::new(),
        }
    }

    // Two owners write their own parts of one inbox: each keeps the other's, the union lists
    // every recovery once, oldest first, and both owners are woken; an emptied part goes, but
    // an owner left with nothing there is still woken when a slot frees.
    #[test]
    fn owners_merge_their_parts() {
        let mut inbox = Inbox::default();
        let a: std::collections::BTreeSet<u32> = [0, 2].into();
        let b: std::collections::BTreeSet<u32> = [1].into();
        inbox.merge(
            &a,
            [
                (0, part(&[("r3", 30)], "http://a")),
                (2, part(&[("r1", 10)], "http://a")),
            ]
            .into(),
        );
        inbox.merge(&b, [(1, part(&[("r2", 20)], "http://b"))].into());
        assert_eq!(
            inbox.recoveries,
            ["r1", "r2", "r3"].map(RecoveryId::new).to_vec()
        );
        assert_eq!(
            inbox.wakes(),
            vec!["http://a".to_owned(), "http://b".to_owned()]
        );
        assert_eq!(inbox.elsewhere(&a), 1);
        assert_eq!(inbox.elsewhere(&b), 2);
        // A part for a partition not owned is not written; an emptied one keeps its writer's
        // address only.
        inbox.merge(
            &b,
            [
                (1, part(&[], "http://b")),
                (0, part(&[("x", 1)], "http://b")),
            ]
            .into(),
        );
        assert_eq!(inbox.recoveries, ["r1", "r3"].map(RecoveryId::new).to_vec());
        assert_eq!(
            inbox.wakes(),
            vec!["http://a".to_owned(), "http://b".to_owned()]
        );
        assert_eq!(inbox.elsewhere(&a), 0);
        // Of an owner with an empty part and a full one, the empty one goes.
        inbox.merge(
            &a,
            [
                (0, part(&[("r3", 30)], "http://a")),
                (2, part(&[], "http://a")),
            ]
            .into(),
        );
        assert_eq!(inbox.parts.keys().copied().collect::<Vec<_>>(), [0, 1]);
        // An inbox of one partition's bucket wakes its one coordinator.
        let single = Inbox {
            coordinator_wake: Some("http://c".into()),
            ..Inbox::default()
        };
        assert_eq!(single.wakes(), vec!["http://c".to_owned()]);
    }
}
