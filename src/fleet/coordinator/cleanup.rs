//! Removing what dead hosts left: their heartbeats, once silent for three TTLs and named by
//! nothing (a dead worker's heartbeat, registration and inbox are gc's).
//!
//! It never touches leases or records.

use super::*;

/// A heartbeat unchanged for this many TTLs (on the coordinator's own clock, the larger of
/// the TTL it judges the holder by and the one the heartbeat declares) is removed once no
/// index entry names its holder.
pub const DEAD_AFTER_TTLS: u32 = 3;

/// Removes the heartbeats of hosts and coordinators that are gone: judged silent for
/// [`DEAD_AFTER_TTLS`] TTLs, and named by no index entry (their runs were finished, or fenced
/// and handed to recoveries), so the heartbeat listing stays bounded by live processes, not by
/// every host that ever crashed. Up to [`ACTION_CONCURRENCY`] per tick.
///
/// A workers' heartbeat, registration and inbox are gc's (`gc::sweep_dead_processes`, after
/// its grace period): a registration deleted just as its worker came back under the same ID
/// would be missed for one idle TTL, and its worker offered nothing.
///
/// Safe against a process that was only paused, or a new one under the same ID: removing a
/// heartbeat fences nothing (leases carry the epochs), every judge watches an absent heartbeat
/// for a TTL like any version (`core::liveness::Sighting::Gone`), and a process writes its
/// heartbeat again within a third of its TTL. Each heartbeat is read (for its role and
/// declared TTL) and the heartbeats listed once more just before the deletions: one that
/// changed since it was judged is left alone.
pub(super) async fn remove_the_dead(
    store: &Store,
    holder: &Arc<Holder>,
    observer: &mut Observer,
    versions: &BTreeMap<String, ETag>,
    alive: &HashMap<String, bool>,
    named: &std::collections::BTreeSet<String>,
) {
    let now = store.clock().monotonic();
    let own = holder.heartbeat_key();
    let registered: std::collections::BTreeSet<&str> = observer
        .registrations
        .values()
        .map(|(_, registration)| registration.heartbeat.as_str())
        .collect();
    let due: Vec<Due> = versions
        .iter()
        .filter(|(key, _)| {
            **key != own
                && !named.contains(*key)
                && !registered.contains(key.as_str())
                && alive.get(*key) == Some(&false)
        })
        .filter_map(|(key, etag)| {
            let (silent, ttl) = observer.liveness.silence(key, now)?;
            (silent >= ttl * DEAD_AFTER_TTLS).then(|| Due {
                key: key.clone(),
                judged: etag.clone(),
                silent,
            })
        })
        .take(ACTION_CONCURRENCY)
        .collect();
    if due.is_empty() {
        return;
    }
    match remove_dead(store, due).await {
        Ok(removed) => {
            for key in removed {
                observer.liveness.forget(&key);
                observer.gone.remove(&key);
            }
        }
        Err(error) => tracing::warn!(%error, "cannot remove dead processes' heartbeats"),
    }
}

/// A heartbeat due for removal: its key, the version judged, and how long it was silent.
pub(super) struct Due {
    pub(super) key: String,
    pub(super) judged: ETag,
    pub(super) silent: Duration,
}

/// Removes the heartbeats in `due` that are still at the version judged, are no worker's, and
/// declare no TTL that their silence falls short of. A heartbeat that does not read (a newer
/// format, a foreign object) is skipped, not allowed to stop the others. Returns the keys
/// removed.
pub(super) async fn remove_dead(store: &Store, due: Vec<Due>) -> Result<Vec<String>, StoreError> {
    use crate::store::lease::{LeaseError, read_heartbeat};
    let mut beats = Vec::new();
    for due in due {
        match read_heartbeat(store, &due.key).await {
            Ok(Some((beat, _))) => {
                let declared = Duration::from_millis(beat.ttl_ms);
                if beat.role != "worker" && due.silent >= declared * DEAD_AFTER_TTLS {
                    beats.push((due, beat));
                }
            }
            Ok(None) => {}
            Err(LeaseError::Store(error)) => return Err(error),
            Err(error) => {
                tracing::warn!(heartbeat = %due.key, %error, "not removing a heartbeat that does not read");
            }
        }
    }
    if beats.is_empty() {
        return Ok(Vec::new());
    }
    // Versions as listed now, comparable with those judged (a read's version need not be:
    // a local directory's are content hashes).
    let listed: BTreeMap<String, ETag> = list_heartbeats(store).await?.into_iter().collect();
    let mut removed = Vec::new();
    for (due, beat) in beats {
        if listed.get(&due.key) != Some(&due.judged) {
            continue;
        }
        store.delete(&due.key).await?;
        tracing::info!(
            heartbeat = %due.key,
            role = %beat.role,
            silent_s = due.silent.as_secs(),
            "removed the heartbeat of a process that is gone"
        );
        crate::metrics::count(crate::metrics::DEAD_PROCESSES_REMOVED);
        removed.push(due.key);
    }
    Ok(removed)
}
