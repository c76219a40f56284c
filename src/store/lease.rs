//! Leases: who may write a run now, with an epoch (fencing token) that only grows.
//!
//! This module owns the lease object (`runs/<shard>/<run>/lease`), per-process heartbeats
//! (`heartbeats/<shard>/<holder>`), and judging expiry. Every lease change is a conditional
//! write. Liveness is renewed per process, not per run: a lease names its holder's heartbeat
//! object, and the holder rewrites that one object every interval, however many runs it holds.
//!
//! Architecture invariant: lease expiry never compares two machines' clocks (brief, hard
//! case "clock skew"). A contender declares a lease expired only after it saw both the lease
//! object and the holder's heartbeat object keep the same ETag for a whole TTL on its *own*
//! monotonic clock ([`ExpiryWatch`]); then it takes over with a compare-and-swap on the lease
//! ETag it observed, bumping the epoch. Safety never rests on this timer: a holder that was
//! merely slow is fenced by the epoch at its next commit (see `generation.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::core::epoch::Epoch;
use crate::core::fact::RunId;
use crate::core::layout::{self, FORMAT_VERSION};
use crate::core::liveness::{ExpiryWatch, Seen, Verdict};
use crate::store::{ETag, Store, StoreError};

/// The envelope kind of a run's lease object.
pub const LEASE_KIND: &str = "run.lease";
const HEARTBEAT_KIND: &str = "heartbeat";
/// Bound on compare-and-swap retries when the lease changes under us.
const CAS_ATTEMPTS: usize = 8;

/// The stored lease of one run: who may write it now, and at which epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Layout format the lease was written with; newer ones are refused on read.
    pub format: u32,
    /// Object kind tag, always `run.lease`.
    pub kind: String,
    /// The run this lease is for; a lease naming another run is treated as corrupt.
    pub run_id: RunId,
    /// ID of the process holding the lease.
    pub holder: String,
    /// Process incarnation of the holder, so a restarted holder with the same ID is told
    /// apart from the one that took the lease.
    pub holder_nonce: String,
    /// Key of the holder's heartbeat object.
    pub heartbeat: String,
    /// The holder's fencing token: bumped by every takeover, and carried by each generation
    /// the holder commits.
    pub epoch: Epoch,
    /// How long a contender must see the lease and heartbeat unchanged, on its own clock,
    /// before it may take over.
    pub ttl_ms: u64,
    /// Released by its holder (graceful stop or run finished); the next acquirer bumps the
    /// epoch without waiting.
    pub released: bool,
    /// Wall-clock time of the last lease change, in milliseconds since the Unix epoch; for
    /// people, never compared across machines.
    pub at_ms: u64,
    /// The run was retired (`gc::retire`): its retirement took this epoch for the fence that
    /// ends the run, and no holder may ever take the lease again. Set once, never cleared.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
}

/// The holder named on a retired run's lease.
pub const RETIRED_HOLDER: &str = "(retired)";

/// The stored heartbeat of one process, rewritten every third of its TTL while it lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Layout format the heartbeat was written with; newer ones are refused on read.
    pub format: u32,
    /// Object kind tag, always `heartbeat`.
    pub kind: String,
    /// ID of the process beating.
    pub holder: String,
    /// Incarnation of the process, so a restart under the same ID is told apart.
    pub holder_nonce: String,
    /// Grows with every beat, so every beat changes the object's ETag.
    pub beat: u64,
    /// What the process is: "host", "worker" or "coordinator".
    #[serde(default)]
    pub role: String,
    /// The TTL the process declared, which a newcomer claiming the same ID watches for. A
    /// process that holds no lease may declare a longer one (see [`Holder::set_idle_ttl`]).
    pub ttl_ms: u64,
    /// Wall-clock time of the beat, in milliseconds since the Unix epoch; for people, never
    /// compared across machines.
    pub at_ms: u64,
    /// Where the process takes wake-ups (`http://host:port`, see `fleet::wake`), if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake: Option<String>,
}

/// A lease as read, with its version.
#[derive(Clone, Debug)]
pub struct LeaseView {
    /// The lease as stored.
    pub lease: Lease,
    /// Its version, for a compare-and-swap takeover or release.
    pub etag: ETag,
}

/// A lease this process holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The run whose lease is held.
    pub run: RunId,
    /// The epoch this process holds the run at; its commits carry it.
    pub epoch: Epoch,
    /// The lease object's version after this process last wrote it.
    pub etag: ETag,
}

/// Why taking, checking or releasing a lease failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The store failed underneath; see [`StoreError`] for whether retrying can help.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another live process holds the run's lease; wait for it to release or expire
    /// (`acquire_or_wait`) rather than write.
    #[error("run \"{run}\" is leased by '{holder}' at epoch {epoch}")]
    HeldByOther {
        /// The run asked for.
        run: RunId,
        /// ID of the process holding it.
        holder: String,
        /// The epoch it holds the run at.
        epoch: Epoch,
    },
    /// This process no longer holds the lease it thought it held (taken over, released or
    /// removed); stop working on the run, since its commits would be fenced.
    #[error(
        "lease of run \"{run}\" was lost: '{holder}' holds it at epoch {epoch} (ours was {ours})"
    )]
    Lost {
        /// The run whose lease was lost.
        run: RunId,
        /// The epoch this process held.
        ours: Epoch,
        /// Who holds the lease now (`(nobody)` if it is gone).
        holder: String,
        /// The epoch the lease is at now.
        epoch: Epoch,
    },
    /// The lease or heartbeat object is corrupt, foreign or from a newer format; leave it
    /// alone and report it.
    #[error(transparent)]
    Object(#[from] layout::ObjectError),
    /// A new run's lease already exists: the run ID is taken; choose another, or continue
    /// an interrupted run with `rekindle recover`.
    #[error(
        "run \"{run}\" already exists (its lease is there); choose another run ID (an interrupted run is continued by resuming or recovering it)"
    )]
    Exists {
        /// The run ID that is taken.
        run: RunId,
    },
    /// Another live process beats under this holder ID; this process must not start until
    /// it is given another ID.
    #[error(
        "holder ID '{holder}' is in use by another live process (its heartbeat '{key}' changed within its {ttl_ms} ms TTL); give this process another ID"
    )]
    IdentityInUse {
        /// The holder ID that is in use.
        holder: String,
        /// Key of the heartbeat that kept changing.
        key: String,
        /// The TTL the other process declared, watched for on this process's clock.
        ttl_ms: u64,
    },
    /// The lease kept changing under this process's compare-and-swaps; another contender is
    /// racing for it, so back off and try again later.
    #[error("lease of run \"{run}\" kept changing; gave up after {CAS_ATTEMPTS} attempts")]
    Contended {
        /// The run whose lease kept changing.
        run: RunId,
    },
    /// The run was retired: its lease is reserved at its retirement's epoch, and no holder
    /// may take it again.
    #[error(
        "run \"{run}\" was retired (its lease is reserved at epoch {epoch}); it can never be written again"
    )]
    Retired {
        /// The retired run.
        run: RunId,
        /// The epoch its retirement reserved.
        epoch: Epoch,
    },
    /// A retirement found the lease changed since the caller judged it (taken, released or
    /// taken over meanwhile): the judgement no longer holds, so decide again.
    #[error(
        "the lease of run \"{run}\" changed since it was judged ('{holder}' at epoch {epoch} now); decide again"
    )]
    ChangedSinceJudged {
        /// The run whose lease changed.
        run: RunId,
        /// Who holds the lease now.
        holder: String,
        /// The epoch the lease is at now.
        epoch: Epoch,
    },
    /// The holder stayed alive for the whole wait; the run is not interrupted, so leave it to
    /// its holder or wait longer.
    #[error(
        "run \"{run}\" is still held by '{holder}': its heartbeat kept changing for {waited_ms} ms"
    )]
    StillAlive {
        /// The run waited for.
        run: RunId,
        /// ID of the process still holding it.
        holder: String,
        /// How long this process waited, in milliseconds.
        waited_ms: u64,
    },
}

/// Reads a run's lease.
pub async fn read_lease(store: &Store, run: &RunId) -> Result<Option<LeaseView>, LeaseError> {
    let key = layout::lease(run.as_str());
    match store.read(&key).await? {
        None => Ok(None),
        Some(object) => {
            let lease: Lease = layout::decode_object(&key, LEASE_KIND, &object.bytes)?;
            if lease.run_id != *run {
                return Err(layout::ObjectError::Corrupt {
                    key,
                    reason: format!("it belongs to run \"{}\"", lease.run_id),
                }
                .into());
            }
            Ok(Some(LeaseView {
                lease,
                etag: object.etag,
            }))
        }
    }
}

/// Reads a holder's heartbeat: its version, or `None` if it has none.
pub async fn read_heartbeat(
    store: &Store,
    key: &str,
) -> Result<Option<(Heartbeat, ETag)>, LeaseError> {
    match store.read(key).await? {
        None => Ok(None),
        Some(object) => {
            let beat: Heartbeat = layout::decode_object(key, HEARTBEAT_KIND, &object.bytes)?;
            Ok(Some((beat, object.etag)))
        }
    }
}

/// Reserves a run's lease for its retirement, in one conditional write: the epoch after the
/// lease's, or `floor` if higher (the caller passes one above every epoch in the chain; it is
/// the epoch for a run that has no lease), marked retired, so no later acquisition or takeover
/// succeeds and the retirement's fence at that epoch is the only holding there ever is.
///
/// `judged` is the lease version the caller decided to retire on (`None`: it found no
/// lease); a lease that moved since is [`LeaseError::ChangedSinceJudged`] and nothing is
/// written, so a holder that took the lease after the judgement is never retired from under.
/// A lease already retired returns its epoch whatever `judged` says: an earlier retirement
/// (perhaps crashed before its tombstone) reserved it, and finishing it is always right. A
/// failed read fails the reservation.
pub async fn reserve_for_retirement(
    store: &Store,
    run: &RunId,
    judged: Option<&ETag>,
    floor: Epoch,
) -> Result<Epoch, LeaseError> {
    let key = layout::lease(run.as_str());
    let retired = |epoch: Epoch, ttl_ms: u64| {
        layout::encode_object(&Lease {
            format: FORMAT_VERSION,
            kind: LEASE_KIND.into(),
            run_id: run.clone(),
            holder: RETIRED_HOLDER.into(),
            holder_nonce: store.clock().nonce(),
            heartbeat: layout::heartbeat(RETIRED_HOLDER),
            epoch,
            ttl_ms,
            released: false,
            at_ms: store.clock().wall_ms(),
            retired: true,
        })
    };
    // Two turns: a write of ours whose response was lost reads back as retired on the second.
    for _ in 0..2 {
        let written = match read_lease(store, run).await? {
            Some(view) if view.lease.retired => return Ok(view.lease.epoch),
            Some(view) if judged != Some(&view.etag) => {
                return Err(LeaseError::ChangedSinceJudged {
                    run: run.clone(),
                    holder: view.lease.holder,
                    epoch: view.lease.epoch,
                });
            }
            Some(view) => {
                let epoch = view.lease.epoch.next().max(floor);
                store
                    .swap(&key, retired(epoch, view.lease.ttl_ms), &view.etag)
                    .await
                    .map(|_| epoch)
            }
            None if judged.is_some() => {
                return Err(LeaseError::ChangedSinceJudged {
                    run: run.clone(),
                    holder: "(nobody)".into(),
                    epoch: Epoch::ZERO,
                });
            }
            None => {
                let epoch = floor.max(Epoch(1));
                store.create(&key, retired(epoch, 0)).await.map(|_| epoch)
            }
        };
        match written {
            Ok(epoch) => {
                tracing::info!(run_id = %run, epoch = %epoch, "lease reserved for retirement");
                return Ok(epoch);
            }
            Err(StoreError::Changed { .. } | StoreError::AlreadyExists { .. }) => continue,
            Err(other) => return Err(other.into()),
        }
    }
    match read_lease(store, run).await? {
        Some(view) if view.lease.retired => Ok(view.lease.epoch),
        Some(view) => Err(LeaseError::ChangedSinceJudged {
            run: run.clone(),
            holder: view.lease.holder,
            epoch: view.lease.epoch,
        }),
        None => Err(LeaseError::Contended { run: run.clone() }),
    }
}

/// One process's identity as a lease holder, with its heartbeat.
#[derive(Debug)]
pub struct Holder {
    store: Store,
    id: String,
    nonce: String,
    ttl: Duration,
    beats: AtomicU64,
    role: String,
    /// Beat pacing while no work is held, if longer than `ttl` (see [`Holder::set_idle_ttl`]).
    idle_ttl: std::sync::Mutex<Option<Duration>>,
    /// Work in hand that makes the holder beat at its full rate (see [`Holder::busy`]).
    busy: AtomicU64,
    /// Told when the holder becomes busy, so the heartbeat loop beats at once.
    pace: tokio::sync::Notify,
    wake: std::sync::Mutex<Option<String>>,
    /// The error of the last heartbeat, while heartbeats fail (see [`Holder::heartbeat_error`]).
    failing: std::sync::Mutex<Option<String>>,
    /// When the last heartbeat was written, on this process's monotonic clock.
    last_beat: std::sync::Mutex<Option<Duration>>,
}

/// Work in hand on a [`Holder`]: while any guard lives, the holder beats every third of its
/// TTL; dropped, it may fall back to its idle pace.
#[derive(Debug)]
pub struct Busy(Arc<Holder>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Holder {
    /// This process's identity under `id`, as a `host`, declaring `ttl` in its heartbeats.
    pub fn new(store: &Store, id: impl Into<String>, ttl: Duration) -> Arc<Holder> {
        Self::with_role(store, id, ttl, "host")
    }

    /// This process's identity under `id`, with its role (`host`, `worker` or `coordinator`).
    pub fn with_role(
        store: &Store,
        id: impl Into<String>,
        ttl: Duration,
        role: &str,
    ) -> Arc<Holder> {
        Arc::new(Holder {
            store: store.clone(),
            id: id.into(),
            nonce: store.clock().nonce(),
            ttl,
            beats: AtomicU64::new(0),
            role: role.to_owned(),
            idle_ttl: std::sync::Mutex::new(None),
            busy: AtomicU64::new(0),
            pace: tokio::sync::Notify::new(),
            wake: std::sync::Mutex::new(None),
            failing: std::sync::Mutex::new(None),
            last_beat: std::sync::Mutex::new(None),
        })
    }

    /// Lets this process prove liveness less often while it holds no work: with no [`Busy`]
    /// guard alive, it beats every third of `idle_ttl` and declares `idle_ttl` in its
    /// heartbeat. Only for a process whose leases are all taken under a guard (a worker): its
    /// leases always carry the full-rate `ttl`, and whoever judges it idle must use
    /// `idle_ttl` (a worker's registration declares both).
    pub fn set_idle_ttl(&self, idle_ttl: Duration) {
        let mut slot = self.idle_ttl.lock().unwrap_or_else(|e| e.into_inner());
        *slot = (idle_ttl > self.ttl).then_some(idle_ttl);
    }

    /// Marks work in hand until the guard drops: the heartbeat returns to its full rate at
    /// once (one beat now if it was idle), before any lease is taken under the guard.
    pub fn busy(self: &Arc<Self>) -> Busy {
        if self.busy.fetch_add(1, Ordering::SeqCst) == 0 {
            self.pace.notify_one();
        }
        Busy(Arc::clone(self))
    }

    /// The TTL this holder declares now: its full TTL while busy or without an idle pace.
    pub fn declared_ttl(&self) -> Duration {
        let idle = *self.idle_ttl.lock().unwrap_or_else(|e| e.into_inner());
        match idle {
            Some(idle) if self.busy.load(Ordering::SeqCst) == 0 => idle,
            _ => self.ttl,
        }
    }

    /// Advertises where this process takes wake-ups; written into every later heartbeat.
    pub fn set_wake(&self, url: Option<String>) {
        *self.wake.lock().unwrap_or_else(|e| e.into_inner()) = url;
    }

    /// Beats every third of the TTL until `stop` is set; the task ends with the process.
    pub fn spawn_heartbeat(
        self: &Arc<Self>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let holder = Arc::clone(self);
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let failed = holder.beat().await.is_err_and(|error| {
                    tracing::warn!(holder_id = %holder.id, %error, "heartbeat failed");
                    true
                });
                // Every third of the TTL declared in that beat (sooner after a failure, which
                // an idle worker's long pace would otherwise leave standing for minutes);
                // becoming busy cuts an idle wait short, and a stop ends it at once.
                let interval = if failed {
                    (holder.ttl / 3).min(Duration::from_secs(5))
                } else {
                    holder.declared_ttl() / 3
                };
                crate::clock::sleep_unless(interval, &stop, Some(&holder.pace)).await;
            }
        })
    }

    /// Runs `work` while this holder beats: one beat first (its error is returned and `work`
    /// never starts), then every third of the TTL until `work` ends, and then the heartbeat is
    /// removed, so whoever looks next sees this process gone at once rather than after a TTL.
    /// For a short-lived process (a CLI command) that holds leases only inside `work`.
    pub async fn while_beating<T>(
        self: &Arc<Self>,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, LeaseError> {
        self.beat().await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let beating = self.spawn_heartbeat(Arc::clone(&stop));
        let output = work.await;
        stop.store(true, Ordering::SeqCst);
        let _ = beating.await;
        // Best effort: a heartbeat left behind only makes the next observer wait one TTL.
        if let Err(error) = self.retire().await {
            tracing::warn!(holder = %self.id, %error, "cannot remove the heartbeat");
        }
        Ok(output)
    }

    /// The holder ID this process writes into leases and heartbeats.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The TTL this holder declares in its leases and heartbeats.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Key of this holder's heartbeat object.
    pub fn heartbeat_key(&self) -> String {
        layout::heartbeat(&self.id)
    }

    /// Renews liveness for every lease this process holds: one PUT.
    pub async fn beat(&self) -> Result<(), LeaseError> {
        let beat = Heartbeat {
            format: FORMAT_VERSION,
            kind: HEARTBEAT_KIND.into(),
            holder: self.id.clone(),
            holder_nonce: self.nonce.clone(),
            beat: self.beats.fetch_add(1, Ordering::SeqCst) + 1,
            role: self.role.clone(),
            ttl_ms: self.declared_ttl().as_millis() as u64,
            at_ms: self.store.clock().wall_ms(),
            wake: self.wake.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        let bytes = layout::encode_object(&beat);
        let result = self.store.put(&self.heartbeat_key(), bytes).await;
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(_) => {
                *failing = None;
                *self.last_beat.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(self.store.clock().monotonic());
                Ok(())
            }
            Err(error) => {
                crate::metrics::count(crate::metrics::HEARTBEAT_FAILURES);
                *failing = Some(error.to_string());
                Err(error.into())
            }
        }
    }

    /// Why heartbeats are not landing, while they are not: the last one failed, or none was
    /// written for a whole declared TTL (one stalled in retries) — the fleet judges this
    /// process gone once its TTL passes without one.
    pub fn heartbeat_error(&self) -> Option<String> {
        if let Some(error) = self
            .failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Some(error);
        }
        let last = (*self.last_beat.lock().unwrap_or_else(|e| e.into_inner()))?;
        let silent = self.store.clock().monotonic().saturating_sub(last);
        let ttl = self.declared_ttl();
        (silent > ttl).then(|| {
            format!(
                "no heartbeat written for {} ms (TTL {} ms)",
                silent.as_millis(),
                ttl.as_millis()
            )
        })
    }

    /// Makes sure no other live process uses this holder ID before this one beats under it:
    /// a heartbeat left by another incarnation is watched for its declared TTL on this
    /// process's monotonic clock; if it changes, the ID is taken and this process must not
    /// start. A heartbeat that stays unchanged for its TTL belongs to a process that is gone.
    pub async fn claim_identity(&self) -> Result<(), LeaseError> {
        let key = self.heartbeat_key();
        let Some((first, first_etag)) = read_heartbeat(&self.store, &key).await? else {
            return Ok(());
        };
        if first.holder_nonce == self.nonce {
            return Ok(());
        }
        let ttl = Duration::from_millis(first.ttl_ms);
        let clock = Arc::clone(self.store.clock());
        let start = clock.monotonic();
        let poll = (ttl / 6).clamp(Duration::from_millis(10), Duration::from_millis(1000));
        tracing::info!(
            holder_id = %self.id,
            ttl_ms = first.ttl_ms,
            "another process beat under this ID: watching its heartbeat for its TTL before taking the ID over (a restart under a new ID does not wait)"
        );
        while clock.monotonic().saturating_sub(start) < ttl {
            crate::clock::sleep(poll).await;
            match read_heartbeat(&self.store, &key).await? {
                None => return Ok(()),
                Some((_, etag)) if etag == first_etag => {}
                Some(_) => {
                    return Err(LeaseError::IdentityInUse {
                        holder: self.id.clone(),
                        key,
                        ttl_ms: first.ttl_ms,
                    });
                }
            }
        }
        tracing::info!(holder_id = %self.id, "the previous process with this ID is gone; taking the ID over");
        Ok(())
    }

    /// Removes the heartbeat on a graceful stop (after releasing leases), unless another
    /// process beats under the same key now (then it is not ours to remove).
    pub async fn retire(&self) -> Result<(), LeaseError> {
        let key = self.heartbeat_key();
        if let Some((beat, _)) = read_heartbeat(&self.store, &key).await?
            && beat.holder_nonce != self.nonce
        {
            return Ok(());
        }
        self.store.delete(&key).await?;
        Ok(())
    }

    /// Whether the heartbeat under this holder's key is this process's own.
    pub async fn owns_heartbeat(&self) -> Result<bool, LeaseError> {
        Ok(read_heartbeat(&self.store, &self.heartbeat_key())
            .await?
            .is_some_and(|(beat, _)| beat.holder_nonce == self.nonce))
    }

    fn lease(&self, run: &RunId, epoch: Epoch, released: bool) -> Bytes {
        let lease = Lease {
            format: FORMAT_VERSION,
            kind: LEASE_KIND.into(),
            run_id: run.clone(),
            holder: self.id.clone(),
            holder_nonce: self.nonce.clone(),
            heartbeat: self.heartbeat_key(),
            epoch,
            ttl_ms: self.ttl.as_millis() as u64,
            released,
            at_ms: self.store.clock().wall_ms(),
            retired: false,
        };
        layout::encode_object(&lease)
    }

    /// Takes the lease of a run that never had one (create-if-absent): the gate for starting
    /// a new run. Leases are never deleted, so a run ID that was ever used is refused here,
    /// without changing anything, and epochs never restart.
    pub async fn acquire_new(&self, run: &RunId) -> Result<Held, LeaseError> {
        let key = layout::lease(run.as_str());
        match self
            .store
            .create(&key, self.lease(run, Epoch(1), false))
            .await
        {
            Ok(etag) => {
                tracing::info!(run_id = %run, epoch = 1, holder_id = %self.id, "lease acquired");
                Ok(Held {
                    run: run.clone(),
                    epoch: Epoch(1),
                    etag,
                })
            }
            Err(StoreError::AlreadyExists { .. }) => Err(LeaseError::Exists { run: run.clone() }),
            Err(other) => Err(other.into()),
        }
    }

    /// Takes the lease if nobody holds it: absent, released, held by an earlier
    /// incarnation of this same holder ID (which is gone: IDs are unique per live process),
    /// or by an earlier holding of this process (a failed attempt that never released it).
    /// The epoch always grows: every holding gets its own.
    pub async fn acquire(&self, run: &RunId) -> Result<Held, LeaseError> {
        self.acquire_from(run, Epoch::ZERO).await
    }

    /// [`Self::acquire`] with an epoch of at least `floor`. A recovery run starts above its
    /// source's epoch, so epochs keep growing along a run's whole lineage and a downstream
    /// system can tell every incarnation apart by (run, epoch).
    pub async fn acquire_from(&self, run: &RunId, floor: Epoch) -> Result<Held, LeaseError> {
        let key = layout::lease(run.as_str());
        // Only a write of this call that landed unseen makes a lease held by this very
        // holder ours to keep at its epoch. Found held on the first read, it is an earlier
        // holding of this process (a failed attempt whose writes may still land): a new
        // holding takes a new epoch, so its fence stops them.
        let mut wrote = false;
        for _ in 0..CAS_ATTEMPTS {
            let result = match read_lease(&self.store, run).await? {
                None => {
                    let epoch = floor.max(Epoch(1));
                    wrote = true;
                    self.store
                        .create(&key, self.lease(run, epoch, false))
                        .await
                        .map(|etag| (epoch, etag))
                }
                Some(view) => {
                    let lease = &view.lease;
                    if lease.retired {
                        return Err(LeaseError::Retired {
                            run: run.clone(),
                            epoch: lease.epoch,
                        });
                    }
                    let mine_already = lease.holder == self.id && lease.holder_nonce == self.nonce;
                    if mine_already && !lease.released && wrote {
                        return Ok(Held {
                            run: run.clone(),
                            epoch: lease.epoch,
                            etag: view.etag,
                        });
                    }
                    if !lease.released && lease.holder != self.id {
                        return Err(LeaseError::HeldByOther {
                            run: run.clone(),
                            holder: lease.holder.clone(),
                            epoch: lease.epoch,
                        });
                    }
                    let epoch = lease.epoch.next().max(floor);
                    wrote = true;
                    self.store
                        .swap(&key, self.lease(run, epoch, false), &view.etag)
                        .await
                        .map(|etag| (epoch, etag))
                }
            };
            match result {
                Ok((epoch, etag)) => {
                    tracing::info!(run_id = %run, epoch = %epoch, holder_id = %self.id, "lease acquired");
                    return Ok(Held {
                        run: run.clone(),
                        epoch,
                        etag,
                    });
                }
                Err(StoreError::AlreadyExists { .. } | StoreError::Changed { .. }) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(LeaseError::Contended { run: run.clone() })
    }

    /// Takes the lease from its current holder by compare-and-swap on the version the caller
    /// observed, bumping the epoch. Used after [`ExpiryWatch`] judged it expired, or by an
    /// operator's explicit takeover (then the old holder's in-flight tool call may run twice;
    /// fencing still stops its commits).
    pub async fn take_over(&self, observed: &LeaseView) -> Result<Held, LeaseError> {
        self.take_over_from(observed, Epoch::ZERO).await
    }

    async fn take_over_from(&self, observed: &LeaseView, floor: Epoch) -> Result<Held, LeaseError> {
        let run = &observed.lease.run_id;
        if observed.lease.retired {
            return Err(LeaseError::Retired {
                run: run.clone(),
                epoch: observed.lease.epoch,
            });
        }
        let key = layout::lease(run.as_str());
        let epoch = observed.lease.epoch.next().max(floor);
        match self
            .store
            .swap(&key, self.lease(run, epoch, false), &observed.etag)
            .await
        {
            Ok(etag) => {
                tracing::info!(run_id = %run, epoch = %epoch, holder_id = %self.id, from = %observed.lease.holder, "lease taken over");
                crate::metrics::count(crate::metrics::TAKEOVERS);
                Ok(Held {
                    run: run.clone(),
                    epoch,
                    etag,
                })
            }
            Err(StoreError::Changed { .. }) => {
                let now = read_lease(&self.store, run).await?;
                Err(match now {
                    Some(view) => LeaseError::HeldByOther {
                        run: run.clone(),
                        holder: view.lease.holder,
                        epoch: view.lease.epoch,
                    },
                    None => LeaseError::Contended { run: run.clone() },
                })
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Releases a held lease so the next acquirer need not wait a TTL. If the lease moved on,
    /// there is nothing to release.
    pub async fn release(&self, held: &Held) -> Result<(), LeaseError> {
        let key = layout::lease(held.run.as_str());
        match self
            .store
            .swap(&key, self.lease(&held.run, held.epoch, true), &held.etag)
            .await
        {
            Ok(_) => {
                tracing::info!(run_id = %held.run, epoch = %held.epoch, "lease released");
                Ok(())
            }
            Err(StoreError::Changed { .. }) => Ok(()),
            Err(other) => Err(other.into()),
        }
    }

    /// Checks that this holder still holds `held` (a cheap GET, for stopping early; commits
    /// are fenced regardless).
    pub async fn check(&self, held: &Held) -> Result<(), LeaseError> {
        match read_lease(&self.store, &held.run).await? {
            Some(view)
                if view.lease.epoch == held.epoch
                    && view.lease.holder == self.id
                    && !view.lease.released =>
            {
                Ok(())
            }
            Some(view) => Err(LeaseError::Lost {
                run: held.run.clone(),
                ours: held.epoch,
                holder: view.lease.holder,
                epoch: view.lease.epoch,
            }),
            None => Err(LeaseError::Lost {
                run: held.run.clone(),
                ours: held.epoch,
                holder: "(nobody)".into(),
                epoch: Epoch::ZERO,
            }),
        }
    }

    /// Waits until the run's lease is free or judged expired, then takes it. Gives up after
    /// `max_wait` (on this process's monotonic clock) if the holder stays alive.
    pub async fn acquire_or_wait(
        &self,
        run: &RunId,
        poll: Duration,
        max_wait: Duration,
    ) -> Result<Held, LeaseError> {
        self.acquire_or_wait_from(run, Epoch::ZERO, poll, max_wait)
            .await
    }

    /// [`Self::acquire_or_wait_from`] for a lease that should not exist yet (a recovery's
    /// first attempt): creates it at once, without reading first, and only if one exists
    /// after all takes the reading path. One request fewer on the way to a recovery's first
    /// step; a lease found existing costs one more.
    pub async fn create_or_wait_from(
        &self,
        run: &RunId,
        floor: Epoch,
        poll: Duration,
        max_wait: Duration,
    ) -> Result<Held, LeaseError> {
        match self.create_lease(run, floor).await {
            Ok(held) => Ok(held),
            Err(StoreError::AlreadyExists { .. }) => {
                self.acquire_or_wait_from(run, floor, poll, max_wait).await
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Creates `run`'s lease at an epoch of at least `floor` (and 1), without reading first;
    /// `AlreadyExists` if a lease is there (a lost acknowledgement of this very write is
    /// adopted by `create`).
    async fn create_lease(&self, run: &RunId, floor: Epoch) -> Result<Held, StoreError> {
        let epoch = floor.max(Epoch(1));
        let key = layout::lease(run.as_str());
        let etag = self
            .store
            .create(&key, self.lease(run, epoch, false))
            .await?;
        tracing::info!(run_id = %run, epoch = %epoch, holder_id = %self.id, "lease acquired");
        Ok(Held {
            run: run.clone(),
            epoch,
            etag,
        })
    }

    /// [`Self::acquire_or_wait`] with an epoch of at least `floor`.
    pub async fn acquire_or_wait_from(
        &self,
        run: &RunId,
        floor: Epoch,
        poll: Duration,
        max_wait: Duration,
    ) -> Result<Held, LeaseError> {
        let clock = Arc::clone(self.store.clock());
        let start = clock.monotonic();
        let mut watch = ExpiryWatch::default();
        loop {
            match self.try_acquire(run, floor, &mut watch).await? {
                Attempt::Held(held) => return Ok(held),
                Attempt::Alive { holder } => {
                    if clock.monotonic().saturating_sub(start) >= max_wait {
                        return Err(LeaseError::StillAlive {
                            run: run.clone(),
                            holder,
                            waited_ms: max_wait.as_millis() as u64,
                        });
                    }
                }
            }
            crate::clock::sleep(poll).await;
        }
    }

    /// One step of waiting for a lease: takes it if free, or if `watch` (kept by the caller
    /// across calls) has now seen it and its holder's heartbeat unchanged for a whole TTL.
    pub async fn try_acquire(
        &self,
        run: &RunId,
        floor: Epoch,
        watch: &mut ExpiryWatch,
    ) -> Result<Attempt, LeaseError> {
        // The readings below are judged as seen when their first request went out (and, new,
        // from when the last returned): a slow answer never counts as silence.
        let issued = self.store.clock().monotonic();
        let view = match read_lease(&self.store, run).await? {
            None => {
                // Seen absent just now: create it without reading again (a racer's create
                // wins, and the full path below sorts it out).
                match self.create_lease(run, floor).await {
                    Ok(held) => return Ok(Attempt::Held(held)),
                    Err(StoreError::AlreadyExists { .. }) => {
                        return self.acquire_from(run, floor).await.map(Attempt::Held);
                    }
                    Err(other) => return Err(other.into()),
                }
            }
            Some(view) if view.lease.retired => {
                return Err(LeaseError::Retired {
                    run: run.clone(),
                    epoch: view.lease.epoch,
                });
            }
            Some(view) if view.lease.released || view.lease.holder == self.id => {
                return self.acquire_from(run, floor).await.map(Attempt::Held);
            }
            Some(view) => view,
        };
        let beat = read_heartbeat(&self.store, &view.lease.heartbeat).await?;
        // Another incarnation beats under the holder's key: the one that took this lease is
        // gone (a holder ID belongs to one live process, see `claim_identity`), however
        // lively the key looks.
        let replaced = beat
            .as_ref()
            .is_some_and(|(beat, _)| beat.holder_nonce != view.lease.holder_nonce);
        let heartbeat = beat.map(|(_, etag)| etag);
        let ttl = Duration::from_millis(view.lease.ttl_ms);
        let seen = Seen {
            issued,
            returned: self.store.clock().monotonic(),
        };
        if replaced
            || watch.observe(run.as_str(), &view.etag, heartbeat.as_ref(), ttl, seen)
                == Verdict::Expired
        {
            match self.take_over_from(&view, floor).await {
                Ok(held) => {
                    watch.forget(run.as_str());
                    return Ok(Attempt::Held(held));
                }
                Err(LeaseError::HeldByOther { .. }) => watch.forget(run.as_str()),
                Err(other) => return Err(other),
            }
        }
        Ok(Attempt::Alive {
            holder: view.lease.holder,
        })
    }
}

/// The outcome of one [`Holder::try_acquire`] step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// This process now holds the lease.
    Held(Held),
    /// Someone else holds it and is (still) considered alive.
    Alive {
        /// ID of the process holding it.
        holder: String,
    },
}
