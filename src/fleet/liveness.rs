//! Whether a running run is interrupted: the one judgement `rekindle status`, `runs ls` and
//! `recover --all` share.
//!
//! This module owns looking at the heartbeat of a run's holder (a [`Sighting`]) and judging
//! sightings ([`Judge`], pure: the caller supplies the sightings and the time). A run the index
//! calls running is *interrupted* when its entry names no holder, when its holder's heartbeat
//! is gone (a stopped process removes it), or when the heartbeat stayed unchanged for the
//! holder's whole declared TTL on this process's monotonic clock (never another machine's
//! clock, as `core::liveness::ExpiryWatch` judges leases). One look cannot show the last case: a
//! caller that looks once (`status`, `runs ls`) sees a beating holder as running; one that
//! must be sure (`recover --all`) watches for a TTL with [`Watch`]. It never writes: admitting
//! a recovery of an interrupted run is `admission`'s.
//!
//! The coordinator judges the same way (`coordinator::judge_liveness`, with its own TTL as a
//! floor and one watch kept across ticks); it could hold a [`Judge`] and feed it one
//! [`Sighting::Beating`] per listed heartbeat.

use std::time::Duration;

use crate::core::liveness::{ExpiryWatch, Verdict};
use crate::core::record::{IndexEntry, Phase};
use crate::store::lease::{self, LeaseError};
use crate::store::{ETag, Store};

/// One look at the heartbeat of a run's holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// The index entry names no holder.
    NoHolder,
    /// The holder's heartbeat object does not exist.
    Gone,
    /// The heartbeat exists at this version; its holder declared this TTL.
    Beating { etag: ETag, ttl: Duration },
}

/// The judgement of a running run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Its holder beats (or has not yet been watched for a whole TTL).
    Running,
    /// Nobody drives it: the fleet may recover it.
    Interrupted,
}

/// Judges sightings of holders over time. Pure: no I/O, no clock of its own.
#[derive(Debug, Default)]
pub struct Judge {
    watch: ExpiryWatch,
}

impl Judge {
    /// Judges `sighting` of what `key` names (a run, or a heartbeat key shared by a holder's
    /// runs), seen at `now` on this process's monotonic clock. A beating holder is interrupted
    /// only once this judge has seen its heartbeat at the same version for its whole TTL.
    pub fn judge(&mut self, key: &str, sighting: &Sighting, now: Duration) -> Liveness {
        match sighting {
            Sighting::NoHolder | Sighting::Gone => Liveness::Interrupted,
            Sighting::Beating { etag, ttl } => {
                // The heartbeat is the one object watched here, so it stands in the lease slot.
                match self.watch.observe(key, etag, None, *ttl, now) {
                    Verdict::Alive => Liveness::Running,
                    Verdict::Expired => Liveness::Interrupted,
                }
            }
        }
    }
}

/// Looks once at the heartbeat under `key`; `declared_ttl` is a floor on the TTL the heartbeat
/// itself declares (a holder is never judged on a shorter TTL than it announced anywhere).
pub async fn look_at(
    store: &Store,
    key: &str,
    declared_ttl: Duration,
) -> Result<Sighting, LeaseError> {
    Ok(match lease::read_heartbeat(store, key).await? {
        None => Sighting::Gone,
        Some((beat, etag)) => Sighting::Beating {
            etag,
            ttl: declared_ttl.max(Duration::from_millis(beat.ttl_ms)),
        },
    })
}

/// Looks once at the holder of `entry`.
pub async fn look(store: &Store, entry: &IndexEntry) -> Result<Sighting, LeaseError> {
    match &entry.holder {
        None => Ok(Sighting::NoHolder),
        Some(key) => {
            let declared = Duration::from_millis(entry.holder_ttl_ms.unwrap_or(0));
            look_at(store, key, declared).await
        }
    }
}

/// Whether a running `entry` is interrupted, on one look: what `status` and `runs ls` show.
/// A holder that died without removing its heartbeat still counts as running here; only a
/// [`Watch`] (or the coordinator) can tell it is silent.
pub async fn judge_now(store: &Store, entry: &IndexEntry) -> Result<Liveness, LeaseError> {
    let sighting = look(store, entry).await?;
    let now = store.clock().monotonic();
    Ok(Judge::default().judge(entry.run_id.as_str(), &sighting, now))
}

/// Watching the running runs of the index for one TTL, to be sure which are interrupted:
/// one look at every holder now ([`Watch::begin`]), another after the longest TTL any of them
/// declared ([`Watch::finish`]).
#[derive(Debug)]
pub struct Watch {
    looked: Vec<(IndexEntry, Sighting)>,
    judge: Judge,
}

impl Watch {
    /// Takes the first look at the holder of every running entry among `entries` (the others
    /// are not this judgement's: parked, recovering and dead runs are not interrupted).
    pub async fn begin(
        store: &Store,
        entries: impl IntoIterator<Item = IndexEntry>,
    ) -> Result<Watch, LeaseError> {
        let mut judge = Judge::default();
        let mut looked = Vec::new();
        for entry in entries.into_iter().filter(|e| e.phase == Phase::Running) {
            let sighting = look(store, &entry).await?;
            judge.judge(entry.run_id.as_str(), &sighting, store.clock().monotonic());
            looked.push((entry, sighting));
        }
        Ok(Watch { looked, judge })
    }

    /// The running runs watched.
    pub fn runs(&self) -> usize {
        self.looked.len()
    }

    /// How long [`Watch::finish`] waits: the longest TTL a beating holder declared (zero when
    /// none beats: every run is already judged).
    pub fn duration(&self) -> Duration {
        self.looked
            .iter()
            .filter_map(|(_, sighting)| match sighting {
                Sighting::Beating { ttl, .. } => Some(*ttl),
                _ => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// Waits [`Watch::duration`], looks at every holder again and judges: a heartbeat that
    /// did not change meanwhile (or disappeared) means the run is interrupted.
    pub async fn finish(
        mut self,
        store: &Store,
    ) -> Result<Vec<(IndexEntry, Liveness)>, LeaseError> {
        let wait = self.duration();
        if !wait.is_zero() {
            crate::clock::sleep(wait).await;
        }
        let mut judged = Vec::with_capacity(self.looked.len());
        for (entry, first) in self.looked {
            let sighting = match first {
                Sighting::Beating { .. } => look(store, &entry).await?,
                // No holder or no heartbeat: already judged, nothing to look at again.
                other => other,
            };
            let now = store.clock().monotonic();
            let liveness = self.judge.judge(entry.run_id.as_str(), &sighting, now);
            judged.push((entry, liveness));
        }
        Ok(judged)
    }

    /// Every watched run as interrupted, without waiting: the operator's word that their
    /// holders are gone (`recover --all --takeover`; fencing keeps the runs safe, but a live
    /// holder's in-flight tool call may run twice).
    pub fn take_over(self) -> Vec<(IndexEntry, Liveness)> {
        self.looked
            .into_iter()
            .map(|(entry, _)| (entry, Liveness::Interrupted))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beating(version: &str) -> Sighting {
        Sighting::Beating {
            etag: ETag(version.into()),
            ttl: Duration::from_secs(10),
        }
    }

    // Proves the judgement: no holder or no heartbeat is interrupted at once; a heartbeat is
    // running on one look and while it changes, and interrupted only after it stayed the
    // same for a whole TTL on the judge's clock.
    #[test]
    fn interrupted_only_when_silent_for_a_ttl() {
        let at = Duration::from_secs;
        let mut judge = Judge::default();
        assert_eq!(
            judge.judge("a", &Sighting::NoHolder, at(0)),
            Liveness::Interrupted
        );
        assert_eq!(
            judge.judge("b", &Sighting::Gone, at(0)),
            Liveness::Interrupted
        );
        assert_eq!(judge.judge("c", &beating("1"), at(0)), Liveness::Running);
        assert_eq!(judge.judge("c", &beating("2"), at(9)), Liveness::Running);
        assert_eq!(judge.judge("c", &beating("2"), at(18)), Liveness::Running);
        assert_eq!(
            judge.judge("c", &beating("2"), at(19)),
            Liveness::Interrupted
        );
        // A fresh judge (one look) never calls a beating holder silent.
        assert_eq!(
            Judge::default().judge("c", &beating("2"), at(1000)),
            Liveness::Running
        );
    }
}
