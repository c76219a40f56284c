//! What `rekindle status` shows: the fleet as one look at the bucket finds it — which
//! coordinator leads, the workers and how they beat, the runs not yet done, and the work that
//! is stuck, each with its reason.
//!
//! One look cannot judge a process dead (that takes a TTL of watching on one monotonic clock,
//! `core::liveness`); it can see that a heartbeat's own timestamp is older than the TTL its
//! writer declared. Such a process is *suspect*: probably gone, and the coordinator will judge
//! it so once it has watched it for its TTL. Suspicion is for people only: nothing is decided
//! on it, since the writer's clock is not this machine's.

use serde::Serialize;

use crate::core::assignment::Registration;
use crate::core::fact::{RecoveryId, RunId};
use crate::core::layout;
use crate::core::record::{IndexEntry, Phase, RecoveryRecord, RecoveryState};
use crate::store::Store;
use crate::store::index::IndexScan;
use crate::store::lease;
use crate::store::recovery;

/// How a process's heartbeat looks from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Beat {
    /// Written within the TTL its writer declared.
    Alive,
    /// Older than the declared TTL by its own timestamp: probably gone.
    Suspect,
    /// No heartbeat object: the process stopped (or was judged gone and removed).
    Gone,
}

impl Beat {
    /// The word `status` prints.
    pub fn describe(self) -> &'static str {
        match self {
            Beat::Alive => "alive",
            Beat::Suspect => "suspect",
            Beat::Gone => "gone",
        }
    }
}

/// A process's heartbeat, as seen now.
#[derive(Clone, Debug, Serialize)]
pub struct Liveliness {
    /// How it looks.
    pub beat: Beat,
    /// Milliseconds since its last beat by its own timestamp, if it has one.
    pub last_beat_ago_ms: Option<u64>,
    /// The TTL it declared.
    pub ttl_ms: Option<u64>,
}

/// The coordinator holding the leadership lease.
#[derive(Clone, Debug, Serialize)]
pub struct Leader {
    /// Its ID.
    pub id: String,
    /// The leadership epoch.
    pub epoch: u64,
    /// Its heartbeat.
    pub liveliness: Liveliness,
}

/// A registered worker.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerInfo {
    /// Its ID.
    pub id: String,
    /// Its heartbeat.
    pub liveliness: Liveliness,
    /// Recoveries it runs at once.
    pub capacity: u32,
    /// Recoveries that may wait assigned to it beyond `capacity`.
    pub queue: u32,
    /// It is stopping: offered nothing more.
    pub draining: bool,
    /// Recoveries its inbox lists (running or waiting).
    pub assigned: usize,
    /// The configuration it runs (runs started with another are not offered to it).
    pub fingerprint_sha256: String,
}

/// Where a run not yet done stands, as one look sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Its holder beats.
    Running,
    /// Its holder's heartbeat is older than its TTL: probably interrupted, not yet judged.
    Suspect,
    /// No holder, or its holder's heartbeat is gone: the fleet recovers it.
    Interrupted,
    /// A recovery was admitted and has not ended.
    Recovering,
    /// Waiting for a human's answer.
    Parked,
    /// Its recovery failed too often and was set aside.
    Dead,
}

impl RunState {
    /// The word `status` and `runs ls` print.
    pub fn describe(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Suspect => "suspect",
            RunState::Interrupted => "interrupted",
            RunState::Recovering => "recovering",
            RunState::Parked => "parked",
            RunState::Dead => "dead",
        }
    }
}

/// A run not yet done.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// The run.
    pub run: RunId,
    /// Where it stands.
    pub state: RunState,
    /// Its holder's heartbeat key, while a process drives it.
    pub holder: Option<String>,
    /// When its index entry last changed (wall-clock milliseconds).
    pub updated_at_ms: u64,
    /// Its recovery's record, once one was admitted.
    pub recovery: Option<RecoveryRecord>,
}

/// Work that does not move, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stuck {
    /// The run.
    pub run: RunId,
    /// Its recovery, if one was admitted.
    pub recovery: Option<RecoveryId>,
    /// Why it does not move, and what would move it.
    pub reason: String,
}

/// The fleet as one look at the bucket finds it.
#[derive(Clone, Debug, Serialize)]
pub struct Overview {
    /// The coordinator holding the leadership lease, if one holds it (in a bucket split into
    /// partitions, partition 0's owner).
    pub leader: Option<Leader>,
    /// In a bucket split into partitions, each partition's owner (`None`: unowned, or its
    /// lease released), by partition; empty for a bucket of one partition.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<Option<String>>,
    /// Registered workers, by ID.
    pub workers: Vec<WorkerInfo>,
    /// Runs not yet done, by ID.
    pub runs: Vec<RunInfo>,
    /// Stuck work with its reasons.
    pub stuck: Vec<Stuck>,
    /// Index entries that could not be read, with the error.
    pub unreadable: Vec<(String, String)>,
}

/// How a heartbeat at `key` looks at wall time `now_ms` (one GET).
async fn liveliness(store: &Store, key: &str, now_ms: u64) -> crate::Result<Liveliness> {
    Ok(match lease::read_heartbeat(store, key).await {
        Ok(Some((beat, _))) => {
            let ago = now_ms.saturating_sub(beat.at_ms);
            Liveliness {
                beat: if ago > beat.ttl_ms {
                    Beat::Suspect
                } else {
                    Beat::Alive
                },
                last_beat_ago_ms: Some(ago),
                ttl_ms: Some(beat.ttl_ms),
            }
        }
        Ok(None) => Liveliness {
            beat: Beat::Gone,
            last_beat_ago_ms: None,
            ttl_ms: None,
        },
        // A heartbeat this build cannot read (a newer format during an upgrade, a foreign
        // object): it exists, so its process is taken as alive; one bad object must not take
        // the whole view down.
        Err(crate::store::lease::LeaseError::Object(error)) => {
            tracing::warn!(key, %error, "cannot read a heartbeat; showing its process as alive");
            Liveliness {
                beat: if store.head(key).await?.is_some() {
                    Beat::Alive
                } else {
                    Beat::Gone
                },
                last_beat_ago_ms: None,
                ttl_ms: None,
            }
        }
        Err(error) => return Err(error.into()),
    })
}

/// Takes one look at the bucket: the leadership lease, the registrations, the index and the
/// records of admitted recoveries.
pub async fn observe(store: &Store) -> crate::Result<Overview> {
    let now = store.clock().wall_ms();
    let leader = match lease::read_lease(store, &RunId::new(layout::COORDINATOR_LEASE_RUN)).await? {
        Some(view) if !view.lease.released => Some(Leader {
            liveliness: liveliness(store, &view.lease.heartbeat, now).await?,
            id: view.lease.holder,
            epoch: view.lease.epoch.0,
        }),
        _ => None,
    };
    let mut workers = Vec::new();
    for listed in store.list_all(layout::workers_prefix()).await? {
        let Some(object) = store.read(&listed.key).await? else {
            continue;
        };
        let Ok(registration) =
            layout::decode_object::<Registration>(&listed.key, "worker", &object.bytes)
        else {
            continue;
        };
        let assigned = crate::fleet::coordinator::read_inbox(store, &registration.worker)
            .await?
            .recoveries
            .len();
        workers.push(WorkerInfo {
            liveliness: liveliness(store, &registration.heartbeat, now).await?,
            id: registration.worker,
            capacity: registration.capacity,
            queue: registration.queue.unwrap_or(0),
            draining: registration.draining,
            assigned,
            fingerprint_sha256: registration.fingerprint_sha256,
        });
    }
    workers.sort_by(|a, b| a.id.cmp(&b.id));
    let (entries, bad) = IndexScan::default().scan(store).await?;
    let mut runs = Vec::new();
    for entry in entries {
        runs.push(run_info(store, entry, now).await?);
    }
    runs.sort_by(|a, b| a.run.as_str().cmp(b.run.as_str()));
    let partitions = partition_owners(store).await?;
    let mut overview = Overview {
        leader,
        partitions,
        workers,
        runs,
        stuck: Vec::new(),
        unreadable: bad
            .into_iter()
            .map(|b| (b.key, b.error.to_string()))
            .collect(),
    };
    overview.stuck = diagnose(&overview);
    Ok(overview)
}

/// Who owns each partition of a bucket split into partitions (one GET of the format marker,
/// and one per partition's lease, side by side); empty for a bucket of one partition.
async fn partition_owners(store: &Store) -> crate::Result<Vec<Option<String>>> {
    use futures::StreamExt;
    let count = crate::store::partitions::read(store).await?;
    if count <= 1 {
        return Ok(Vec::new());
    }
    let owners: Vec<Result<Option<String>, lease::LeaseError>> = futures::stream::iter(0..count)
        .map(|partition| async move {
            let run = RunId::new(layout::partition_lease(partition));
            Ok(lease::read_lease(store, &run)
                .await?
                .filter(|view| !view.lease.released)
                .map(|view| view.lease.holder))
        })
        .buffered(16)
        .collect()
        .await;
    owners
        .into_iter()
        .map(|owner| owner.map_err(Into::into))
        .collect()
}

/// Whether a coordinator leads: the leadership lease is held and its holder's heartbeat is
/// alive (two GETs).
pub async fn coordinator_leading(store: &Store) -> crate::Result<bool> {
    let now = store.clock().wall_ms();
    Ok(
        match lease::read_lease(store, &RunId::new(layout::COORDINATOR_LEASE_RUN)).await? {
            Some(view) if !view.lease.released => {
                liveliness(store, &view.lease.heartbeat, now).await?.beat == Beat::Alive
            }
            _ => false,
        },
    )
}

/// What [`diagnose`] says is stuck among the recoveries `ids`, one line each (one look at
/// the bucket, as `rekindle status` takes).
pub async fn stuck_among(
    store: &Store,
    ids: &[crate::core::fact::RecoveryId],
) -> crate::Result<Vec<String>> {
    Ok(observe(store)
        .await?
        .stuck
        .into_iter()
        .filter(|stuck| stuck.recovery.as_ref().is_some_and(|id| ids.contains(id)))
        .map(|stuck| format!("run {}: {}", stuck.run, stuck.reason))
        .collect())
}

/// One run's state and record.
pub async fn run_info(store: &Store, entry: IndexEntry, now_ms: u64) -> crate::Result<RunInfo> {
    let state = match entry.phase {
        Phase::Parked => RunState::Parked,
        Phase::Recovering => RunState::Recovering,
        Phase::Dead => RunState::Dead,
        Phase::Running => match &entry.holder {
            None => RunState::Interrupted,
            Some(key) => match liveliness(store, key, now_ms).await?.beat {
                Beat::Alive => RunState::Running,
                Beat::Suspect => RunState::Suspect,
                Beat::Gone => RunState::Interrupted,
            },
        },
    };
    let recovery = match &entry.recovery_id {
        Some(id) => recovery::read(store, id).await?.map(|(record, _)| record),
        None => None,
    };
    Ok(RunInfo {
        run: entry.run_id,
        state,
        holder: entry.holder,
        updated_at_ms: entry.updated_at_ms,
        recovery,
    })
}

/// The stuck work in an overview, each with its reason. Pure.
pub fn diagnose(overview: &Overview) -> Vec<Stuck> {
    let mut stuck = Vec::new();
    let leading = overview
        .leader
        .as_ref()
        .is_some_and(|l| l.liveliness.beat == Beat::Alive);
    let worker = |id: &str| overview.workers.iter().find(|w| w.id == id);
    for run in &overview.runs {
        let recovery = run.recovery.as_ref();
        let mut report = |reason: String| {
            stuck.push(Stuck {
                run: run.run.clone(),
                recovery: recovery.map(|r| r.recovery_id.clone()),
                reason,
            })
        };
        match (run.state, recovery) {
            (RunState::Parked, _) => report(format!(
                "parked: waits for a human's answer (see `rekindle runs show {}`, answer with `rekindle answer`)",
                run.run
            )),
            (RunState::Dead, record) => report(format!(
                "dead-lettered after {} failed attempts; last error: {}",
                record.map_or(0, |r| r.failures),
                record
                    .and_then(|r| r.last_error.as_deref())
                    .unwrap_or("(none recorded)")
            )),
            (RunState::Interrupted | RunState::Suspect, _) if !leading => report(
                "interrupted, and no coordinator is running to admit its recovery (start rekindle-coordinator, or `rekindle recover`)".into(),
            ),
            (RunState::Recovering, Some(record)) => {
                let Some(reason) = stuck_recovery(record, leading, overview, &worker) else {
                    continue;
                };
                report(reason);
            }
            _ => {}
        }
    }
    stuck
}

/// Why an admitted recovery does not move, if it does not.
fn stuck_recovery<'a>(
    record: &RecoveryRecord,
    leading: bool,
    overview: &'a Overview,
    worker: &impl Fn(&str) -> Option<&'a WorkerInfo>,
) -> Option<String> {
    let silent = |id: &str| match worker(id) {
        None => Some("which is not registered".to_owned()),
        Some(w) if w.liveliness.beat == Beat::Alive => None,
        Some(w) => Some(format!(
            "whose heartbeat is {}",
            w.liveliness.beat.describe()
        )),
    };
    match (record.state, record.assigned_to.as_deref()) {
        (RecoveryState::Admitted, None) => {
            let matching: Vec<&WorkerInfo> = overview
                .workers
                .iter()
                .filter(|w| w.liveliness.beat == Beat::Alive)
                .filter(|w| w.fingerprint_sha256 == record.fingerprint_sha256)
                .collect();
            if !leading {
                Some("admitted, and no coordinator is running to assign it".into())
            } else if overview
                .workers
                .iter()
                .all(|w| w.liveliness.beat != Beat::Alive)
            {
                Some("admitted, and no worker is alive to run it".into())
            } else if matching.is_empty() && !record.force {
                Some(format!(
                    "admitted, and no live worker runs its configuration (fingerprint {}); start a worker with the rekindle.toml the run started with",
                    short(&record.fingerprint_sha256)
                ))
            } else {
                None
            }
        }
        (RecoveryState::Admitted, Some(id)) => silent(id).map(|why| {
            format!("offered to {id}, {why}; the coordinator offers it elsewhere after that worker's TTL")
        }),
        (RecoveryState::Running, Some(id)) => silent(id).map(|why| {
            format!("running on {id}, {why}; the coordinator hands it back once it judges the worker gone")
        }),
        (RecoveryState::Running, None) => {
            Some("running with no worker named in its record".into())
        }
        _ => None,
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive() -> Liveliness {
        Liveliness {
            beat: Beat::Alive,
            last_beat_ago_ms: Some(10),
            ttl_ms: Some(30_000),
        }
    }

    fn record(state: RecoveryState, assigned: Option<&str>, fingerprint: &str) -> RecoveryRecord {
        let mut record: RecoveryRecord = serde_json::from_value(serde_json::json!({
            "format": 1, "kind": "recovery", "recovery_id": "rec", "source_run": "src",
            "source_generation": 3, "source_digest": "d", "source_epoch": 1, "state": "admitted",
            "fingerprint_sha256": fingerprint, "admitted_at_ms": 0, "updated_at_ms": 0,
        }))
        .unwrap();
        record.state = state;
        record.assigned_to = assigned.map(str::to_owned);
        record
    }

    fn overview(leader: bool, workers: Vec<WorkerInfo>, runs: Vec<RunInfo>) -> Overview {
        Overview {
            leader: leader.then(|| Leader {
                id: "c".into(),
                epoch: 1,
                liveliness: alive(),
            }),
            partitions: Vec::new(),
            workers,
            runs,
            stuck: Vec::new(),
            unreadable: Vec::new(),
        }
    }

    fn worker(id: &str, beat: Beat, fingerprint: &str) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            liveliness: Liveliness { beat, ..alive() },
            capacity: 4,
            queue: 0,
            draining: false,
            assigned: 0,
            fingerprint_sha256: fingerprint.into(),
        }
    }

    fn recovering(record: RecoveryRecord) -> RunInfo {
        RunInfo {
            run: RunId::new("src"),
            state: RunState::Recovering,
            holder: None,
            updated_at_ms: 0,
            recovery: Some(record),
        }
    }

    #[test]
    fn each_kind_of_stuck_work_gets_its_reason() {
        let reasons =
            |o: Overview| -> Vec<String> { diagnose(&o).into_iter().map(|s| s.reason).collect() };
        // No live worker runs the recovery's configuration.
        let o = overview(
            true,
            vec![worker("w1", Beat::Alive, "other")],
            vec![recovering(record(RecoveryState::Admitted, None, "abc"))],
        );
        assert!(reasons(o)[0].contains("no live worker runs its configuration"));
        // A matching live worker: not stuck, the coordinator assigns it.
        let o = overview(
            true,
            vec![worker("w1", Beat::Alive, "abc")],
            vec![recovering(record(RecoveryState::Admitted, None, "abc"))],
        );
        assert!(reasons(o).is_empty());
        // Running on a worker whose heartbeat is old.
        let o = overview(
            true,
            vec![worker("w1", Beat::Suspect, "abc")],
            vec![recovering(record(
                RecoveryState::Running,
                Some("w1"),
                "abc",
            ))],
        );
        assert!(reasons(o)[0].contains("running on w1, whose heartbeat is suspect"));
        // Offered to a worker that is gone from the registrations.
        let o = overview(
            true,
            vec![],
            vec![recovering(record(
                RecoveryState::Admitted,
                Some("w9"),
                "abc",
            ))],
        );
        assert!(reasons(o)[0].contains("offered to w9, which is not registered"));
        // Interrupted with no coordinator.
        let mut run = recovering(record(RecoveryState::Admitted, None, "abc"));
        run.state = RunState::Interrupted;
        run.recovery = None;
        assert!(
            reasons(overview(false, vec![], vec![run.clone()]))[0]
                .contains("no coordinator is running")
        );
        assert!(reasons(overview(true, vec![], vec![run])).is_empty());
        // Parked and dead.
        let mut parked = recovering(record(RecoveryState::Parked, None, "abc"));
        parked.state = RunState::Parked;
        assert!(reasons(overview(true, vec![], vec![parked]))[0].starts_with("parked"));
        let mut dead_record = record(RecoveryState::DeadLettered, None, "abc");
        dead_record.failures = 3;
        dead_record.last_error = Some("tool exploded".into());
        let mut dead = recovering(dead_record);
        dead.state = RunState::Dead;
        assert_eq!(
            reasons(overview(true, vec![], vec![dead])),
            vec!["dead-lettered after 3 failed attempts; last error: tool exploded".to_owned()]
        );
    }
}
