//! Whether a running run is interrupted: the one judgement `rekindle status`, `runs ls` and
//! `recover --all` share.
//!
//! This module owns looking at the heartbeat of a run's holder (a [`Sighting`]) and handing
//! the sightings to the pure [`Judge`]. A run the index
//! calls running is *interrupted* when its entry names no holder, or when its holder's
//! heartbeat stayed unchanged (or absent: a stopped process removes it, and so does the
//! removal of a dead process's, which a process coming back must survive) for the holder's
//! whole declared TTL on this process's monotonic clock (never another machine's clock, as
//! `core::liveness::ExpiryWatch` judges leases). One look cannot show the last case: a caller
//! that looks once (`status`, `runs ls`) sees a beating holder as running and an absent one
//! as interrupted; one that must be sure (`recover --all`) watches for a TTL with [`Watch`]. It never writes: admitting
//! a recovery of an interrupted run is `admission`'s.
//!
//! The rule itself is `core::liveness::Judge`; the coordinator applies the same judge to every
//! listed heartbeat (`core::liveness::judge_heartbeats`), keeping it across ticks.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use crate::core::liveness::{Judge, Liveness, Seen, Sighting};
use crate::core::record::{IndexEntry, Phase};
use crate::store::Store;
use crate::store::index;
use crate::store::lease::{self, LeaseError};

/// How long an unreadable heartbeat whose holder declared no TTL anywhere is watched: longer
/// than any TTL the binaries default to, so it is never judged on too short a watch.
const UNDECLARED_TTL: Duration = Duration::from_secs(30);

/// Looks once at the heartbeat under `key`; `declared_ttl` is a floor on the TTL the heartbeat
/// itself declares (a holder is never judged on a shorter TTL than it announced anywhere).
/// Liveness is judged on the object's version alone, as the coordinator judges it: a
/// heartbeat this build cannot decode (a newer format mid-upgrade, a foreign object) still
/// counts by its version, under the declared TTL, instead of failing the whole look.
pub async fn look_at(
    store: &Store,
    key: &str,
    declared_ttl: Duration,
) -> Result<Sighting, LeaseError> {
    Ok(match lease::read_heartbeat(store, key).await {
        Ok(None) => Sighting::Gone {
            ttl: declared_or_undeclared(declared_ttl),
        },
        Ok(Some((beat, etag))) => Sighting::Beating {
            etag,
            ttl: declared_ttl.max(Duration::from_millis(beat.ttl_ms)),
        },
        Err(LeaseError::Object(error)) => match store.head(key).await? {
            None => Sighting::Gone {
                ttl: declared_or_undeclared(declared_ttl),
            },
            Some(etag) => {
                tracing::warn!(key, %error, "cannot read a heartbeat; judging it by its version");
                Sighting::Beating {
                    etag,
                    ttl: declared_ttl.max(UNDECLARED_TTL),
                }
            }
        },
        Err(other) => return Err(other),
    })
}

/// The TTL an absent heartbeat is watched for: the one declared where it was named, else
/// [`UNDECLARED_TTL`].
fn declared_or_undeclared(declared_ttl: Duration) -> Duration {
    if declared_ttl.is_zero() {
        UNDECLARED_TTL
    } else {
        declared_ttl
    }
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
/// A holder that died without removing its heartbeat still counts as running here, and one
/// whose heartbeat is absent as interrupted; only a [`Watch`] (or the coordinator) can be sure.
pub async fn judge_now(store: &Store, entry: &IndexEntry) -> Result<Liveness, LeaseError> {
    let issued = store.clock().monotonic();
    let sighting = look(store, entry).await?;
    if matches!(sighting, Sighting::Gone { .. }) {
        return Ok(Liveness::Interrupted);
    }
    let seen = Seen {
        issued,
        returned: store.clock().monotonic(),
    };
    Ok(Judge::default().judge(entry.run_id.as_str(), &sighting, seen))
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
    /// are not this judgement's: parked, recovering and dead runs are not interrupted). The
    /// looks go out side by side, [`LOOKS_AT_ONCE`] at a time (one heartbeat read after
    /// another would take a round trip per run: 20 s for a thousand runs on S3); each
    /// sighting is judged by when its own look was issued and returned (`Seen`).
    pub async fn begin(
        store: &Store,
        entries: impl IntoIterator<Item = IndexEntry>,
    ) -> Result<Watch, LeaseError> {
        let looked: Vec<_> = futures::stream::iter(entries.into_iter().filter(watched))
            .map(|entry| async move {
                let issued = store.clock().monotonic();
                let sighting = look(store, &entry).await?;
                let seen = Seen {
                    issued,
                    returned: store.clock().monotonic(),
                };
                Ok::<_, LeaseError>((entry, sighting, seen))
            })
            .buffered(LOOKS_AT_ONCE)
            .try_collect()
            .await?;
        let mut judge = Judge::default();
        let looked = looked
            .into_iter()
            .map(|(entry, sighting, at)| {
                judge.judge(entry.run_id.as_str(), &sighting, at);
                (entry, sighting)
            })
            .collect();
        Ok(Watch { looked, judge })
    }

    /// Every running entry among `entries` as interrupted, without looking at its holder:
    /// the operator's word that the holders are gone (`recover --all --takeover`; fencing
    /// keeps the runs safe, but a live holder's in-flight tool call may run twice).
    pub fn take_over(entries: impl IntoIterator<Item = IndexEntry>) -> Vec<(IndexEntry, Watched)> {
        entries
            .into_iter()
            .filter(watched)
            .map(|entry| (entry, Watched::Interrupted))
            .collect()
    }

    /// The running runs watched.
    pub fn runs(&self) -> usize {
        self.looked.len()
    }

    /// How long [`Watch::finish`] waits: the longest TTL a holder declared, beating or absent
    /// (zero when no entry names one: every run is already judged).
    pub fn duration(&self) -> Duration {
        self.looked
            .iter()
            .filter_map(|(_, sighting)| match sighting {
                Sighting::Beating { ttl, .. } | Sighting::Gone { ttl } => Some(*ttl),
                Sighting::NoHolder => None,
            })
            .max()
            .unwrap_or_default()
    }

    /// Waits [`Watch::duration`], looks at every holder again and judges: a heartbeat that
    /// did not change meanwhile (or disappeared) means the run is interrupted — unless the
    /// run's index entry changed meanwhile (it parked, ended, or moved to another holder): the
    /// run moved on, so it is left alone, as the coordinator re-checks an entry before it
    /// admits.
    pub async fn finish(mut self, store: &Store) -> crate::Result<Vec<(IndexEntry, Watched)>> {
        let wait = self.duration();
        if !wait.is_zero() {
            crate::clock::sleep(wait).await;
        }
        // The second looks go out side by side too; each is judged as seen when it was issued.
        let looked: Vec<_> = futures::stream::iter(self.looked)
            .map(|(entry, first)| async move {
                // An entry that no longer decodes (rewritten by a newer build mid-upgrade)
                // changed too: left alone, named in the log, and the others still judged.
                let now = match index::read(store, &entry.run_id).await {
                    Ok(now) => now,
                    Err(index::IndexError::Object(error)) => {
                        tracing::warn!(run_id = %entry.run_id, %error, "its index entry changed into one this build cannot read; left alone");
                        return Ok((entry, None));
                    }
                    Err(other) => return Err(crate::Error::from(other)),
                };
                if now.as_ref() != Some(&entry) {
                    return Ok::<_, crate::Error>((entry, None));
                }
                let issued = store.clock().monotonic();
                let sighting = match first {
                    // No holder: already judged, nothing to look at again.
                    Sighting::NoHolder => Sighting::NoHolder,
                    _ => look(store, &entry).await?,
                };
                let seen = Seen {
                    issued,
                    returned: store.clock().monotonic(),
                };
                Ok((entry, Some((sighting, seen))))
            })
            .buffered(LOOKS_AT_ONCE)
            .try_collect()
            .await?;
        Ok(looked
            .into_iter()
            .map(|(entry, looked)| match looked {
                // The run moved on while it was watched: left alone.
                None => (entry, Watched::MovedOn),
                Some((sighting, at)) => {
                    let watched = match self.judge.judge(entry.run_id.as_str(), &sighting, at) {
                        Liveness::Running => Watched::Alive,
                        Liveness::Interrupted => Watched::Interrupted,
                    };
                    (entry, watched)
                }
            })
            .collect())
    }
}

/// Whether `entry` is a watch's to judge: only a running run can be interrupted (parked,
/// recovering and dead runs are not).
fn watched(entry: &IndexEntry) -> bool {
    entry.phase == Phase::Running
}

/// What a [`Watch`] found of a running run after its TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// Its holder stayed silent (or its heartbeat absent) for a TTL: the run may be recovered.
    Interrupted,
    /// Its holder beat while it was watched.
    Alive,
    /// Its index entry changed while it was watched (the coordinator admitted its recovery,
    /// or its host parked or ended it): left alone, it is not this watch's any more.
    MovedOn,
}

/// How many holders a [`Watch`] looks at side by side.
const LOOKS_AT_ONCE: usize = 64;
