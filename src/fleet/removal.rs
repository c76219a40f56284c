//! Retiring a run now, on an operator's word (`rekindle runs rm`): whether it may go, then
//! the retirement.
//!
//! This module owns the decision, as a pure function of what the store holds ([`decide`]): a
//! run that never existed is refused (a tombstone would reserve a typo), and so, unless forced,
//! are a run whose lease a holder still has and a run whose recovery has not ended (retiring
//! removes the index entry through which the coordinator finds that recovery, stranding it).
//! The retirement itself is the one gc applies after the retention period (`gc::retire`), so
//! the run keeps its lease, claim, epochs' first generations and a tombstone and can never be
//! resumed, recreated or recovered again.

use crate::core::epoch::Epoch;
use crate::core::fact::{RecoveryId, RunId};
use crate::core::record::RecoveryState;
use std::time::Duration;

use crate::core::liveness::Sighting;
use crate::fleet::liveness;
use crate::store::ETag;
use crate::store::Store;
use crate::store::gc;
use crate::store::gc::GcError;
use crate::store::index;
use crate::store::lease::{self, Lease, LeaseError};
use crate::store::recovery;
use crate::store::tombstone::RetiredBy;

/// Why a run may not be retired now. Store, lease, recovery and gc failures on the way are
/// the public [`crate::Error`] of their own module.
#[derive(Debug, thiserror::Error)]
pub enum RemovalError {
    /// The ID names the coordinators' leadership lease, not a run.
    #[error("\"{run}\" is the coordinators' leadership lease, not a run; it is never retired")]
    NotARun {
        /// The ID asked to be retired.
        run: RunId,
    },
    /// The run never took a lease, so it never existed (retiring it would reserve a typo).
    #[error("run \"{run}\" does not exist (it has no lease); nothing to retire")]
    NoSuchRun {
        /// The run asked to be retired.
        run: RunId,
    },
    #[error(
        "run \"{run}\" is leased by '{holder}' at epoch {epoch}; stop it first (or --force if that holder is gone)"
    )]
    /// A holder still has the run's lease, and the removal was not forced.
    Leased {
        /// The run asked to be retired.
        run: RunId,
        /// The holder ID on its lease.
        holder: String,
        /// The epoch the holder writes at.
        epoch: Epoch,
    },
    #[error(
        "run \"{run}\" is leased by '{holder}', whose heartbeat changed within its {ttl_ms} ms TTL: it is alive, and --force retires only a run whose holder is gone; stop it first"
    )]
    /// A forced removal watched the lease's holder and saw its heartbeat change within its
    /// TTL: the holder is alive, not gone.
    HolderAlive {
        /// The run asked to be retired.
        run: RunId,
        /// The holder ID on its lease.
        holder: String,
        /// The TTL the holder declared, which it beat within.
        ttl_ms: u64,
    },
    #[error(
        "run \"{run}\" is being recovered as '{recovery}' ({state}); let the recovery end first (or --force to strand it)"
    )]
    /// A recovery claimed the run and has not ended, and the removal was not forced.
    BeingRecovered {
        /// The run asked to be retired.
        run: RunId,
        /// The recovery that claimed it.
        recovery: RecoveryId,
        /// The recovery's state in words, or that its admission has not finished.
        state: &'static str,
    },
}

/// What the store holds about a run, as far as removing it is concerned.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The run's lease: every run that ever started took one, and retirement keeps it.
    pub lease: Option<Lease>,
    /// The version of `lease` as read: the retirement reserves the lease only while it is
    /// still this version, so the decision holds when it acts.
    pub lease_version: Option<ETag>,
    /// The recovery that claimed the run, and that recovery's state (`None` while its
    /// admission has not written the record yet).
    pub recovery: Option<(RecoveryId, Option<RecoveryState>)>,
}

/// Whether `run` may be retired now. Pure.
pub fn decide(run: &RunId, facts: &Facts, force: bool) -> Result<(), RemovalError> {
    // The coordinators' leadership lease lives where a run's would; retiring it would end
    // leadership for good.
    if crate::core::layout::is_coordinator_lease(run.as_str()) {
        return Err(RemovalError::NotARun { run: run.clone() });
    }
    let Some(lease) = &facts.lease else {
        return Err(RemovalError::NoSuchRun { run: run.clone() });
    };
    // A retirement reserved the lease and did not finish (it crashed): finishing it is
    // always right, and nothing can hold the run any more.
    if lease.retired {
        return Ok(());
    }
    if !lease.released && !force {
        return Err(RemovalError::Leased {
            run: run.clone(),
            holder: lease.holder.clone(),
            epoch: lease.epoch,
        });
    }
    if let Some((recovery, state)) = &facts.recovery
        && !force
        && !state.is_some_and(RecoveryState::is_terminal)
    {
        return Err(RemovalError::BeingRecovered {
            run: run.clone(),
            recovery: recovery.clone(),
            state: state.map_or("admission not finished", RecoveryState::describe),
        });
    }
    Ok(())
}

/// Reads what [`decide`] needs about `run`. `force` skips the recovery, which a forced
/// removal ignores: a damaged claim or record must not stand in the way of `--force`.
pub async fn facts(store: &Store, run: &RunId, force: bool) -> crate::Result<Facts> {
    let (lease, lease_version) = match lease::read_lease(store, run).await? {
        Some(view) => (Some(view.lease), Some(view.etag)),
        None => (None, None),
    };
    if force {
        return Ok(Facts {
            lease,
            lease_version,
            recovery: None,
        });
    }
    let recovery = match recovery::claimed_by(store, run).await? {
        None => None,
        Some(id) => {
            let state = recovery::read(store, &id)
                .await?
                .map(|(record, _)| record.state);
            Some((id, state))
        }
    };
    Ok(Facts {
        lease,
        lease_version,
        recovery,
    })
}

/// Retires `run` now if [`decide`] allows it: its tombstone, then its generations (but each
/// epoch's first) and loop checkpoints, then its index entry. Returns how many objects were
/// deleted. Forced past a held lease, it first watches the holder's heartbeat for the holder's
/// TTL (as `recover` does) and refuses if it changes: `--force` is the operator's word that
/// the holder is gone, and a heartbeat that beats says otherwise.
///
/// The retirement reserves the lease only at the version decided on: a holder that took the
/// lease meanwhile (an answer racing the removal) makes it decide again on what is there now,
/// at most [`DECIDE_ATTEMPTS`] times.
pub async fn remove(store: &Store, run: &RunId, force: bool) -> crate::Result<u64> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let facts = facts(store, run, force).await?;
        decide(run, &facts, force)?;
        if let Some(lease) = &facts.lease
            && !lease.released
            && !lease.retired
        {
            refuse_if_beating(store, run, lease).await?;
        }
        match gc::retire(store, run, RetiredBy::Removal, facts.lease_version.as_ref()).await {
            Ok(deleted) => {
                index::remove(store, run).await?;
                return Ok(deleted);
            }
            Err(GcError::Lease(LeaseError::ChangedSinceJudged { .. }))
                if attempt < DECIDE_ATTEMPTS =>
            {
                tracing::info!(run_id = %run, "the lease changed while retiring; deciding again");
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// How often `remove` decides again when the lease changes under it.
const DECIDE_ATTEMPTS: usize = 3;

/// Watches the heartbeat of a held lease's holder for its TTL; a change means it is alive.
async fn refuse_if_beating(store: &Store, run: &RunId, lease: &Lease) -> crate::Result<()> {
    let ttl = Duration::from_millis(lease.ttl_ms);
    let first = liveness::look_at(store, &lease.heartbeat, ttl).await?;
    // Absent or beating, the heartbeat is watched for its TTL: one removed under a process
    // that came back is written again within a third of it.
    let ttl = match &first {
        Sighting::Beating { ttl, .. } | Sighting::Gone { ttl } => *ttl,
        Sighting::NoHolder => return Ok(()),
    };
    crate::clock::sleep(ttl).await;
    let second = liveness::look_at(store, &lease.heartbeat, ttl).await?;
    if second == first {
        return Ok(());
    }
    Err(RemovalError::HolderAlive {
        run: run.clone(),
        holder: lease.holder.clone(),
        ttl_ms: ttl.as_millis() as u64,
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(released: bool) -> Lease {
        Lease {
            format: 1,
            kind: "run.lease".into(),
            run_id: RunId::new("r"),
            holder: "host-a".into(),
            holder_nonce: "n".into(),
            heartbeat: "heartbeats/x/host-a".into(),
            epoch: Epoch(3),
            ttl_ms: 1000,
            released,
            at_ms: 0,
            retired: false,
        }
    }

    // Proves the refusals and what --force overrides: a run without a lease never existed
    // (even forced), a held lease and an unfinished recovery are refused unless forced, and
    // a released run whose recovery ended may go.
    #[test]
    fn refusals_and_force() {
        let run = RunId::new("r");
        let missing = Facts {
            lease: None,
            lease_version: None,
            recovery: None,
        };
        assert!(matches!(
            decide(&run, &missing, true),
            Err(RemovalError::NoSuchRun { .. })
        ));
        let held = Facts {
            lease: Some(lease(false)),
            lease_version: None,
            recovery: None,
        };
        let refused = decide(&run, &held, false).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "run \"r\" is leased by 'host-a' at epoch 3; stop it first (or --force if that holder is gone)"
        );
        assert!(decide(&run, &held, true).is_ok());
        let recovering = |state| Facts {
            lease: Some(lease(true)),
            lease_version: None,
            recovery: Some((RecoveryId::new("rec"), state)),
        };
        let admitting = decide(&run, &recovering(None), false).unwrap_err();
        assert!(
            admitting.to_string().contains("(admission not finished)"),
            "{admitting}"
        );
        assert!(decide(&run, &recovering(Some(RecoveryState::Running)), false).is_err());
        assert!(decide(&run, &recovering(Some(RecoveryState::Running)), true).is_ok());
        assert!(decide(&run, &recovering(Some(RecoveryState::Finished)), false).is_ok());
        // The leadership lease is refused even forced; a retired lease is finished unforced.
        let leadership = RunId::new(crate::core::layout::COORDINATOR_LEASE_RUN);
        assert!(matches!(
            decide(&leadership, &recovering(None), true),
            Err(RemovalError::NotARun { .. })
        ));
        let mut reserved = lease(false);
        reserved.retired = true;
        let interrupted = Facts {
            lease: Some(reserved),
            lease_version: None,
            recovery: Some((RecoveryId::new("rec"), Some(RecoveryState::Running))),
        };
        assert!(decide(&run, &interrupted, false).is_ok());
    }
}
