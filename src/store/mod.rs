//! The narrow storage interface every durable record goes through.
//!
//! This module owns: opening a store from a parsed URL and explicit settings (`settings.rs`:
//! `s3://`, `file://` or a plain path, `memory://`; it never reads the environment), the four conditional primitives the rest of Rekindle is built on
//! (create-if-absent, compare-and-swap, read, bounded list), retries of transient faults with
//! bounded exponential backoff and jitter, recognising our own write when its response was
//! lost, request and byte counters, and the startup capability probe. It never interprets the
//! bytes it stores.
//!
//! Architecture invariant: a real precondition failure (412, or an existing key on create) is
//! never retried as if it were transient. A create or swap that reports a conflict is read
//! back: identical bytes mean the write was ours (its response was lost, or the client retried
//! it internally) and it is adopted; a missing key (409 ConditionalRequestConflict) is retried.
//! A swap refused with a 409 (which object_store reports as "already exists") is judged the same
//! way as a 412: our bytes are adopted, an unchanged version is retried, anything else changed.
//! Every payload written through this module carries a writer nonce, so identical bytes can
//! only come from the same write.
//!
//! Architecture invariant: the local directory backend is as durable as the local fact log.
//! object_store's `LocalFileSystem` runs with `with_fsync(true)`: a create or overwrite syncs the
//! file before publishing it, then its parent directory and every directory it had to create,
//! before the write returns; a delete is followed by an fsync of the parent directory here.
//!
//! Architecture invariant: a local compare-and-swap, overwrite or delete holds the key's lock
//! until its write has finished, even when the caller stops waiting (an attempt deadline): the
//! locked section runs in a task of its own, so a late write can never land after another
//! writer took the lock and read the old version.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};

use crate::clock::Clock;

pub mod aws;
pub mod checkpoint;
pub mod faults;
pub mod gc;
pub mod generation;
pub mod index;
pub mod lease;
mod listing;
pub mod local;
mod lock;
pub mod log;
pub mod measure;
pub mod partitions;
mod probe;
pub mod recovery;
pub mod seal;
pub mod settings;
pub mod tombstone;

pub use settings::{S3Addressing, StoreSettings, StoreUrl};

pub use crate::core::layout::ETag;

/// Keys per listing page: what one S3 LIST request returns.
pub const LIST_PAGE: usize = 1000;

/// An object's bytes and version.
#[derive(Clone, Debug)]
pub struct Object {
    /// The stored payload, exactly as written.
    pub bytes: Bytes,
    /// The version a later `swap` must name to replace these bytes.
    pub etag: ETag,
}

/// One entry of a listing.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Key relative to the store's prefix.
    pub key: String,
    /// The backend's own ETag, good for noticing change between listings; on the local
    /// backend it is not the version `read` and `swap` use.
    pub etag: Option<ETag>,
    /// Size of the object in bytes.
    pub size: u64,
    /// When the store last wrote the object, on the store's own clock (milliseconds since the
    /// Unix epoch), if it reports a plausible one. Compared only with other times the same
    /// store reported (see `gc::StoreClock`), never with a process's clock.
    pub modified_ms: Option<u64>,
}

/// Why a store operation failed, sorted by what the caller should do next.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `create` found the key already present (and the bytes there are not ours); the caller
    /// lost the race and should read what the winner wrote.
    #[error("object '{key}' already exists")]
    AlreadyExists {
        /// Key that already exists, relative to the store's prefix.
        key: String,
    },
    /// A [`Store::create_slot`] whose earlier attempt may have landed finds the key empty,
    /// and something may have collected it since: that attempt did not land, or it did and gc
    /// collected the slot behind a newer generation. A slot is never filled twice, so it is
    /// not created again.
    #[error(
        "object '{key}' is empty after a create of ours whose outcome was unknown, and may have been collected since: it is not created again"
    )]
    Unconfirmed {
        /// The slot's key, relative to the store's prefix.
        key: String,
    },
    /// A `swap` was refused because the object changed since it was read, or is gone; re-read
    /// and decide again rather than retrying blindly.
    #[error(
        "object '{key}' changed since it was read (or is missing), so the conditional write was refused"
    )]
    Changed {
        /// Key whose version no longer matches, relative to the store's prefix.
        key: String,
    },
    /// The store did not answer (timeouts, 5xx, connection errors) after the retry policy gave
    /// up; retrying later may succeed.
    #[error("store unavailable: {op} of '{key}' failed after {attempts} attempts: {message}")]
    Unavailable {
        /// The operation that failed (`create`, `swap`, `read`, `list`, ...).
        op: &'static str,
        /// Key the operation addressed, relative to the store's prefix.
        key: String,
        /// How many attempts were made before giving up.
        attempts: usize,
        /// The last error the backend reported.
        message: String,
    },
    /// The store refused the credentials or the permission for this request; retrying will
    /// not help until the credentials or bucket policy are fixed.
    #[error("store refused {op} of '{key}': access denied ({message})")]
    Denied {
        /// The operation that was refused.
        op: &'static str,
        /// Key the operation addressed, relative to the store's prefix.
        key: String,
        /// The backend's explanation of the refusal.
        message: String,
    },
    /// An object the store layer reads for itself (a chain's hint) is not what Rekindle
    /// wrote: corrupt, foreign or from a newer format. Retrying will not help; the error names
    /// the object.
    #[error(transparent)]
    Object(#[from] crate::core::layout::ObjectError),
    /// Any other failure that retrying will not fix (a malformed response, an unsupported
    /// operation, a bucket with a newer layout); report it and stop.
    #[error("{op} of '{key}' failed: {message}")]
    Failed {
        /// The operation that failed.
        op: &'static str,
        /// Key the operation addressed, relative to the store's prefix.
        key: String,
        /// What went wrong, as the backend or this module described it.
        message: String,
    },
    /// Nothing has written a Rekindle store at this location (a missing directory, or a
    /// bucket or prefix without the format marker): a command that only reads refuses it
    /// rather than report an empty store.
    #[error(
        "no Rekindle store at {url}: {reason} (check the store URL; a store is created by the first run, worker or coordinator that writes to it)"
    )]
    NoStore {
        /// The store URL as opened.
        url: String,
        /// What was missing.
        reason: String,
    },
    /// The store URL could not be parsed or opened; fix the configuration.
    #[error("invalid store URL '{url}': {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The store does not apply conditional writes atomically, so leases and fencing would be
    /// unsafe; Rekindle refuses to run on it.
    #[error(
        "store {url} failed the capability probe ({check}): {detail}; refusing to run on a store that does not apply conditional writes atomically"
    )]
    ProbeFailed {
        /// The store URL that was probed.
        url: String,
        /// Which probe step failed (for example, a second create of the same key succeeding).
        check: &'static str,
        /// What the probe observed instead of the expected refusal.
        detail: String,
    },
}

impl StoreError {
    /// Worth retrying after a pause.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

/// Request counters by kind, and bytes moved. Every attempt counts, retries included.
#[derive(Debug, Default)]
pub struct Metrics {
    /// GET requests (reads and read-backs).
    pub get: AtomicU64,
    /// HEAD requests.
    pub head: AtomicU64,
    /// Unconditional PUT requests (overwrites).
    pub put: AtomicU64,
    /// Conditional PUT requests: creates and compare-and-swaps.
    pub conditional_put: AtomicU64,
    /// LIST requests, one per page.
    pub list: AtomicU64,
    /// DELETE requests.
    pub delete: AtomicU64,
    /// Payload bytes sent in PUT requests.
    pub bytes_written: AtomicU64,
    /// Payload bytes received from GET requests.
    pub bytes_read: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetricsSnapshot {
    /// GET requests (reads and read-backs).
    pub get: u64,
    /// HEAD requests.
    pub head: u64,
    /// Unconditional PUT requests (overwrites).
    pub put: u64,
    /// Conditional PUT requests: creates and compare-and-swaps.
    pub conditional_put: u64,
    /// LIST requests, one per page.
    pub list: u64,
    /// DELETE requests.
    pub delete: u64,
    /// Payload bytes sent in PUT requests.
    pub bytes_written: u64,
    /// Payload bytes received from GET requests.
    pub bytes_read: u64,
}

impl MetricsSnapshot {
    /// Total requests of every kind, the figure a request bill is based on.
    pub fn requests(&self) -> u64 {
        self.get + self.head + self.put + self.conditional_put + self.list + self.delete
    }

    /// Counters accumulated since `earlier`.
    pub fn since(&self, earlier: &MetricsSnapshot) -> MetricsSnapshot {
        MetricsSnapshot {
            get: self.get - earlier.get,
            head: self.head - earlier.head,
            put: self.put - earlier.put,
            conditional_put: self.conditional_put - earlier.conditional_put,
            list: self.list - earlier.list,
            delete: self.delete - earlier.delete,
            bytes_written: self.bytes_written - earlier.bytes_written,
            bytes_read: self.bytes_read - earlier.bytes_read,
        }
    }
}

impl Metrics {
    /// Reads every counter now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MetricsSnapshot {
            get: load(&self.get),
            head: load(&self.head),
            put: load(&self.put),
            conditional_put: load(&self.conditional_put),
            list: load(&self.list),
            delete: load(&self.delete),
            bytes_written: load(&self.bytes_written),
            bytes_read: load(&self.bytes_read),
        }
    }
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// The request kind a store operation is billed as, for the metrics.
fn request_kind(op: &'static str) -> &'static str {
    match op {
        "create" | "swap" => "conditional_put",
        "read" => "get",
        other => other,
    }
}

/// How transient faults are retried: exponential backoff with jitter, bounded in attempts.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Shortest pause before the first retry.
    pub min_delay: Duration,
    /// Longest pause between retries, however many attempts came before.
    pub max_delay: Duration,
    /// Retries after the first attempt.
    pub max_retries: usize,
    /// Deadline for one request attempt; a stalled request counts as a transient fault.
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(5),
            max_retries: 8,
            attempt_timeout: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_retries)
            .with_jitter()
    }
}

/// Which kind of backend a store is; the local directory needs its own compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `memory://`: an in-process store for tests and the demo; nothing survives the process.
    Memory,
    /// A local directory; the path is where per-key lock files live.
    Local {
        /// Directory that holds the objects and the per-key lock files.
        root: PathBuf,
    },
    /// An S3-compatible bucket that applies conditional writes itself.
    S3,
}

/// A store rooted at a prefix. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
    backend: Backend,
    metrics: Arc<Metrics>,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    /// Client-side encryption of generation payloads, when configured.
    sealer: Option<Arc<crate::store::seal::Sealer>>,
    /// Directories fsynced by this store after local deletes (a test seam: object_store syncs
    /// writes itself and cannot be observed).
    local_directory_syncs: Arc<AtomicU64>,
    /// The process writing generations through this handle (see [`Store::writing_as`]).
    writer: Option<Arc<str>>,
}

impl Store {
    /// Opens the store at `url` with `settings` and, unless skipped, runs the capability probe
    /// once per process and URL. Everything it needs arrives in its arguments.
    pub async fn open(
        url: &StoreUrl,
        settings: &StoreSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Store, StoreError> {
        let (inner, backend, prefix): (Arc<dyn ObjectStore>, Backend, String) = match url {
            StoreUrl::Memory => (
                Arc::new(object_store::memory::InMemory::new()),
                Backend::Memory,
                String::new(),
            ),
            StoreUrl::S3 { bucket, prefix } => (
                aws::open_s3(bucket, settings).await?,
                Backend::S3,
                prefix.clone(),
            ),
            StoreUrl::Local { root } => {
                let invalid = |reason: String| StoreError::InvalidUrl {
                    url: url.to_string(),
                    reason,
                };
                if root.exists() && !root.is_dir() {
                    return Err(invalid(format!(
                        "{} is a file; a local store is a directory",
                        root.display()
                    )));
                }
                if !root.is_dir() {
                    if settings.skip_probe {
                        // Read-only: never create a directory for a mistyped path.
                        return Err(StoreError::NoStore {
                            url: url.to_string(),
                            reason: "no such directory".into(),
                        });
                    }
                    std::fs::create_dir_all(root).map_err(|e| {
                        invalid(format!("cannot create directory {}: {e}", root.display()))
                    })?;
                    tracing::info!(store = %root.display(), "created a new local store directory");
                }
                // Without `with_fsync` (off by default) an acknowledged write could vanish in a
                // power loss. With it, object_store syncs the staged file before publishing it,
                // then the parent directory and each directory it created, all inside its
                // blocking write.
                let local = object_store::local::LocalFileSystem::new_with_prefix(root)
                    .map_err(|e| invalid(e.to_string()))?
                    .with_fsync(true);
                (
                    Arc::new(local::LocalDir::new(local)),
                    Backend::Local { root: root.clone() },
                    String::new(),
                )
            }
        };
        // Test-only fault injection, only when the settings ask for it.
        let inner: Arc<dyn ObjectStore> = match &settings.faults {
            Some(faults) => {
                tracing::warn!(
                    plan = ?faults.plan,
                    seed = faults.seed,
                    partition_file = ?faults.partition_file,
                    "store fault injection is on: for tests only"
                );
                faults::FaultyStore::with_settings(inner, faults)
            }
            None => inner,
        };
        let store = Store::from_parts(
            inner,
            backend,
            &url.to_string(),
            &prefix,
            settings.retry,
            clock,
        )
        .with_sealer(settings.sealer.clone());
        if !settings.skip_probe {
            store.probe_once().await?;
            store.check_format().await?;
        }
        Ok(store)
    }

    /// Refuses a location nothing has written a Rekindle store to (no format marker), for
    /// commands that only look: one GET.
    pub async fn check_exists(&self) -> Result<(), StoreError> {
        if matches!(self.backend, Backend::Memory) {
            return Ok(());
        }
        match self.read(crate::core::layout::format_marker()).await? {
            // A bucket laid out by a newer build is refused here too (the marker was just read).
            Some(object) => match serde_json::from_slice::<serde_json::Value>(&object.bytes)
                .ok()
                .and_then(|marker| marker.get("format")?.as_u64())
            {
                Some(found) if found > u64::from(crate::core::layout::FORMAT_VERSION) => {
                    Err(StoreError::Failed {
                        op: "open",
                        key: crate::core::layout::format_marker().to_owned(),
                        message: format!(
                            "the bucket has layout format {found}, this build reads up to {}",
                            crate::core::layout::FORMAT_VERSION
                        ),
                    })
                }
                _ => Ok(()),
            },
            None => Err(StoreError::NoStore {
                url: self.url.clone(),
                reason: format!(
                    "no format marker ({})",
                    crate::core::layout::format_marker()
                ),
            }),
        }
    }

    /// Writes the layout's format marker on first use, and refuses a bucket laid out by a
    /// newer build.
    pub async fn check_format(&self) -> Result<(), StoreError> {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Marker {
            format: u32,
            kind: String,
        }
        let key = crate::core::layout::format_marker();
        let ours = Marker {
            format: crate::core::layout::FORMAT_VERSION,
            kind: "rekindle.format".into(),
        };
        let bytes = crate::core::layout::encode_object(&ours);
        let existing = match self.create(key, bytes).await {
            Ok(_) => return Ok(()),
            Err(StoreError::AlreadyExists { .. }) => self.read(key).await?,
            Err(other) => return Err(other),
        };
        let found = existing
            .and_then(|object| serde_json::from_slice::<Marker>(&object.bytes).ok())
            .map(|marker| marker.format);
        match found {
            Some(found) if found <= crate::core::layout::FORMAT_VERSION => Ok(()),
            Some(found) => Err(StoreError::Failed {
                op: "open",
                key: key.to_owned(),
                message: format!(
                    "the bucket has layout format {found}, this build reads up to {}",
                    crate::core::layout::FORMAT_VERSION
                ),
            }),
            None => Err(StoreError::Failed {
                op: "open",
                key: key.to_owned(),
                message: "the format marker is not a Rekindle object".into(),
            }),
        }
    }

    /// Builds a store over an existing `ObjectStore` (tests wrap one in a fault injector).
    pub fn from_parts(
        inner: Arc<dyn ObjectStore>,
        backend: Backend,
        url: &str,
        prefix: &str,
        retry: RetryPolicy,
        clock: Arc<dyn Clock>,
    ) -> Store {
        Store {
            inner,
            prefix: prefix.trim_matches('/').to_owned(),
            url: url.to_owned(),
            backend,
            metrics: Arc::new(Metrics::default()),
            retry,
            clock,
            sealer: None,
            local_directory_syncs: Arc::new(AtomicU64::new(0)),
            writer: None,
        }
    }

    /// An empty in-memory store (`memory://`): for tests, examples and the demo.
    pub fn memory(clock: Arc<dyn Clock>) -> Store {
        Store::from_parts(
            Arc::new(object_store::memory::InMemory::new()),
            Backend::Memory,
            "memory://",
            "",
            RetryPolicy::default(),
            clock,
        )
    }

    /// The same store sealing new generations with `sealer` (and able to open them).
    pub fn with_sealer(mut self, sealer: Option<Arc<crate::store::seal::Sealer>>) -> Store {
        self.sealer = sealer;
        self
    }

    /// The sealer that encrypts new generations, if client-side sealing is configured.
    pub fn sealer(&self) -> Option<&crate::store::seal::Sealer> {
        self.sealer.as_deref()
    }

    /// The URL the store was opened from, for messages and probes.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The same store, for generations written by the process `holder_id`: the writer field of
    /// each generation it commits names it (before the writer's nonce), so a run's timeline
    /// can say who held each epoch.
    pub fn writing_as(&self, holder_id: &str) -> Store {
        Store {
            writer: Some(Arc::from(holder_id)),
            ..self.clone()
        }
    }

    /// Whether `writer` (a generation's writer field) was written through a handle naming the
    /// same holder as this one (`writing_as`): the test a writer resuming at a generation of
    /// its own epoch makes before taking it for its own holding. A handle that names no holder
    /// owns nothing.
    pub fn writes_as(&self, writer: &str) -> bool {
        self.writer.as_deref().is_some_and(|holder| {
            writer
                .strip_prefix(holder)
                .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// A nonce for a new generation writer: unique, and prefixed by the writing process's
    /// holder ID and `/` when this handle knows it.
    pub fn writer_nonce(&self) -> String {
        match &self.writer {
            Some(holder) => format!("{holder}/{}", self.clock.nonce()),
            None => self.clock.nonce(),
        }
    }

    /// The same store with its own request counters (to measure one component's traffic).
    pub fn with_fresh_metrics(&self) -> Store {
        Store {
            metrics: Arc::new(Metrics::default()),
            ..self.clone()
        }
    }

    /// Which kind of backend this store writes to.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The clock leases, heartbeats and tombstones read their time from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The request and byte counters of this store (shared with its clones) right now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// How many directories this store fsynced after local deletes.
    pub fn local_directory_syncs(&self) -> u64 {
        self.local_directory_syncs.load(Ordering::Relaxed)
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn relative(&self, path: &Path) -> String {
        let full = path.as_ref();
        if self.prefix.is_empty() {
            full.to_owned()
        } else {
            full.strip_prefix(&self.prefix)
                .map_or(full, |rest| rest.trim_start_matches('/'))
                .to_owned()
        }
    }

    /// Runs `attempt` with retries of transient errors and a per-attempt deadline.
    async fn retrying<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        attempt: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let timeout = self.retry.attempt_timeout;
        let kind = request_kind(op);
        let mut attempt = attempt;
        let attempts = AtomicU64::new(0);
        let result = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(op, key, "store request");
            let future = attempt();
            async move {
                let stopwatch = crate::clock::Stopwatch::start();
                let result = match tokio::time::timeout(timeout, future).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::Unavailable {
                        op,
                        key: key.to_owned(),
                        attempts: 1,
                        message: format!("no answer within {} ms", timeout.as_millis()),
                    }),
                };
                let outcome = match &result {
                    Ok(_) => "ok",
                    Err(
                        StoreError::AlreadyExists { .. }
                        | StoreError::Unconfirmed { .. }
                        | StoreError::Changed { .. },
                    ) => "conflict",
                    Err(_) => "error",
                };
                crate::metrics::store_request(kind, outcome, stopwatch.elapsed());
                result
            }
        })
        .retry(match self.clock.jitter_seed() {
            Some(seed) => self.retry.backoff().with_jitter_seed(seed),
            None => self.retry.backoff(),
        })
        .when(StoreError::is_transient)
        .notify(|error, delay| {
            crate::metrics::store_retry(kind);
            tracing::debug!(op, key, %error, delay_ms = delay.as_millis() as u64, "retrying store request");
        })
        .await;
        result.map_err(|error| match error {
            StoreError::Unavailable {
                op, key, message, ..
            } => StoreError::Unavailable {
                op,
                key,
                attempts: attempts.load(Ordering::Relaxed) as usize,
                message,
            },
            other => other,
        })
    }

    /// Creates `key` only if it does not exist. A conflict whose existing bytes equal ours is
    /// our own earlier attempt and is adopted.
    pub async fn create(&self, key: &str, bytes: Bytes) -> Result<ETag, StoreError> {
        self.retrying("create", key, || self.try_create(key, bytes.clone()))
            .await
    }

    /// [`Store::create`] for a slot gc frees once superseded (a generation). gc may free a
    /// slot its writer filled once the run went on past it, so a writer must never fill one
    /// again: an attempt after one whose outcome was unknown (a lost response, a timeout, or
    /// `may_have_landed`, an earlier call's) first reads the key. Our bytes there are adopted,
    /// other bytes are [`StoreError::AlreadyExists`]; an empty key is created only if
    /// `still_free` says nothing can have collected it (`Chain::create` asks the hint), and
    /// is otherwise [`StoreError::Unconfirmed`]. All attempts share one backoff.
    pub async fn create_slot<F, Fut>(
        &self,
        key: &str,
        bytes: Bytes,
        may_have_landed: bool,
        still_free: F,
    ) -> Result<ETag, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        let attempts = AtomicU64::new(u64::from(may_have_landed));
        self.retrying("create", key, || async {
            if attempts.fetch_add(1, Ordering::Relaxed) > 0 {
                match self.read_once(key).await? {
                    Some(existing) if existing.bytes == bytes => return Ok(existing.etag),
                    Some(_) => {
                        return Err(StoreError::AlreadyExists {
                            key: key.to_owned(),
                        });
                    }
                    None if !still_free().await? => {
                        return Err(StoreError::Unconfirmed {
                            key: key.to_owned(),
                        });
                    }
                    None => {}
                }
            }
            self.try_create(key, bytes.clone()).await
        })
        .await
    }

    async fn try_create(&self, key: &str, bytes: Bytes) -> Result<ETag, StoreError> {
        bump(&self.metrics.conditional_put, 1);
        bump(&self.metrics.bytes_written, bytes.len() as u64);
        crate::metrics::store_bytes("written", bytes.len() as u64);
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let result = self
            .inner
            .put_opts(&self.path(key), PutPayload::from(bytes.clone()), options)
            .await;
        match result {
            Ok(put) => Ok(self.version(put.e_tag, &bytes, key)),
            Err(object_store::Error::AlreadyExists { .. }) => match self.read_once(key).await? {
                Some(existing) if existing.bytes == bytes => Ok(existing.etag),
                Some(_) => Err(StoreError::AlreadyExists {
                    key: key.to_owned(),
                }),
                // A 409 ConditionalRequestConflict: a concurrent create was in flight and did
                // not land. Try again.
                None => Err(StoreError::Unavailable {
                    op: "create",
                    key: key.to_owned(),
                    attempts: 1,
                    message: "conditional request conflict".into(),
                }),
            },
            Err(error) => Err(classify("create", key, error)),
        }
    }

    /// Replaces `key` only if its current version is `expected`.
    pub async fn swap(&self, key: &str, bytes: Bytes, expected: &ETag) -> Result<ETag, StoreError> {
        let attempts = AtomicU64::new(0);
        self.retrying("swap", key, || {
            let retry = attempts.fetch_add(1, Ordering::Relaxed) > 0;
            self.try_swap(key, bytes.clone(), expected, retry)
        })
        .await
    }

    /// One swap attempt; `retry` says an earlier attempt of the same swap failed, possibly
    /// after its write landed.
    async fn try_swap(
        &self,
        key: &str,
        bytes: Bytes,
        expected: &ETag,
        retry: bool,
    ) -> Result<ETag, StoreError> {
        if let Backend::Local { .. } = &self.backend {
            let expected = expected.clone();
            return self
                .locked("swap", key, move |store, key| async move {
                    // One request on S3: injected latency is charged on the write alone.
                    let mut read_half = GetOptions::default();
                    read_half.extensions.insert(faults::ReadHalfOfSwap);
                    match store.read_once_with(&key, read_half).await? {
                        Some(current) if current.etag == expected => {
                            store.put_once(&key, bytes, PutMode::Overwrite, true).await
                        }
                        // Our own write from an earlier attempt whose deadline fired: it ran
                        // to the end under the lock, so the retry finds it here. Only on a
                        // retry: the local backend never writes twice within one attempt, and
                        // a first attempt finding equal bytes met another writer's equal state.
                        Some(current) if retry && current.bytes == bytes => Ok(current.etag),
                        _ => Err(StoreError::Changed { key }),
                    }
                })
                .await;
        }
        let mode = PutMode::Update(UpdateVersion {
            e_tag: Some(expected.0.clone()),
            version: None,
        });
        match self.put_once(key, bytes.clone(), mode, true).await {
            // S3 answers a concurrent conditional write with 409 ConditionalRequestConflict,
            // which object_store reports as "already exists" even for an If-Match update. Like
            // a 412 it says nothing about who won: read back and judge the same way.
            Err(StoreError::Changed { .. } | StoreError::AlreadyExists { .. }) => {
                match self.read_once(key).await? {
                    Some(current) if current.bytes == bytes => Ok(current.etag),
                    // Still the expected version: the refusal was a transient conflict.
                    Some(current) if current.etag == *expected => Err(StoreError::Unavailable {
                        op: "swap",
                        key: key.to_owned(),
                        attempts: 1,
                        message: "conditional request conflict".into(),
                    }),
                    _ => Err(StoreError::Changed {
                        key: key.to_owned(),
                    }),
                }
            }
            other => other,
        }
    }

    /// Writes `key` unconditionally (heartbeats and hints, whose last writer may win).
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<ETag, StoreError> {
        self.retrying("put", key, || async {
            if let Backend::Local { .. } = &self.backend {
                let bytes = bytes.clone();
                return self
                    .locked("put", key, move |store, key| async move {
                        store.put_once(&key, bytes, PutMode::Overwrite, false).await
                    })
                    .await;
            }
            self.put_once(key, bytes.clone(), PutMode::Overwrite, false)
                .await
        })
        .await
    }

    /// One PUT attempt; `conditional` says how it counts (the local backend's
    /// compare-and-swap is a conditional write done as a locked overwrite).
    async fn put_once(
        &self,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        conditional: bool,
    ) -> Result<ETag, StoreError> {
        let counter = if conditional {
            &self.metrics.conditional_put
        } else {
            &self.metrics.put
        };
        bump(counter, 1);
        bump(&self.metrics.bytes_written, bytes.len() as u64);
        crate::metrics::store_bytes("written", bytes.len() as u64);
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        match self
            .inner
            .put_opts(&self.path(key), PutPayload::from(bytes.clone()), options)
            .await
        {
            Ok(put) => Ok(self.version(put.e_tag, &bytes, key)),
            Err(
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. },
            ) => Err(StoreError::Changed {
                key: key.to_owned(),
            }),
            Err(error) => Err(classify("put", key, error)),
        }
    }

    /// Reads `key`; `None` if it does not exist.
    pub async fn read(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.retrying("read", key, || self.read_once(key)).await
    }

    async fn read_once(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.read_once_with(key, GetOptions::default()).await
    }

    async fn read_once_with(
        &self,
        key: &str,
        options: GetOptions,
    ) -> Result<Option<Object>, StoreError> {
        bump(&self.metrics.get, 1);
        let result = match self.inner.get_opts(&self.path(key), options).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(classify("read", key, error)),
        };
        let store_etag = result.meta.e_tag.clone();
        let bytes = match result.bytes().await {
            Ok(bytes) => bytes,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(classify("read", key, error)),
        };
        let etag = self.version(store_etag, &bytes, key);
        bump(&self.metrics.bytes_read, bytes.len() as u64);
        crate::metrics::store_bytes("read", bytes.len() as u64);
        Ok(Some(Object { bytes, etag }))
    }

    /// The version of `key` as a listing reports it ([`Listed::etag`]; empty if the store
    /// reports none), without its bytes; `None` if it does not exist. On the local backend a
    /// listing's versions are the file system's, not the content hashes that reads and
    /// swaps use (see [`Store::head`]), so a version seen in a listing is checked with this.
    pub async fn listed_version(&self, key: &str) -> Result<Option<ETag>, StoreError> {
        self.retrying("head", key, || async {
            bump(&self.metrics.head, 1);
            match self.inner.head(&self.path(key)).await {
                Ok(meta) => Ok(Some(ETag(meta.e_tag.unwrap_or_default()))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(error) => Err(classify("head", key, error)),
            }
        })
        .await
    }

    /// The current version of `key`, without its bytes; `None` if it does not exist.
    pub async fn head(&self, key: &str) -> Result<Option<ETag>, StoreError> {
        if let Backend::Local { .. } = self.backend {
            // Local versions are content hashes (see `version`), so a head is a read.
            return Ok(self.read(key).await?.map(|object| object.etag));
        }
        self.retrying("head", key, || async {
            bump(&self.metrics.head, 1);
            match self.inner.head(&self.path(key)).await {
                Ok(meta) => Ok(Some(etag_of(meta.e_tag, key))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(error) => Err(classify("head", key, error)),
            }
        })
        .await
    }

    /// Deletes `key`; deleting a missing key succeeds (as on S3, unlike the local backend).
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.retrying("delete", key, || async {
            if let Backend::Local { .. } = &self.backend {
                return self
                    .locked_then("delete", key, true, |store, key| async move {
                        store.delete_once(&key).await?;
                        store.sync_parent_directory(&key).await
                    })
                    .await;
            }
            self.delete_once(key).await
        })
        .await
    }

    async fn delete_once(&self, key: &str) -> Result<(), StoreError> {
        bump(&self.metrics.delete, 1);
        match self.inner.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(classify("delete", key, error)),
        }
    }
}

impl Store {
    /// The version of an object as compare-and-swap sees it. S3 and memory report ETags that
    /// change with every write. The local backend's ETag is inode, mtime and size; with
    /// coarse file timestamps and inodes reused after a rename, two different writes in quick
    /// succession can share one, which would let a stale swap through. Local versions are
    /// therefore the SHA-256 of the content: every payload carries a nonce or counter, so two
    /// writes share a version only if they wrote the same state.
    fn version(&self, store_etag: Option<String>, bytes: &Bytes, key: &str) -> ETag {
        match self.backend {
            Backend::Local { .. } => {
                ETag(format!("sha256:{}", crate::core::digest::sha256_hex(bytes)))
            }
            _ => etag_of(store_etag, key),
        }
    }
}

fn etag_of(etag: Option<String>, key: &str) -> ETag {
    // Every backend used here reports ETags; a missing one would make every swap fail
    // loudly as "changed", never silently succeed.
    ETag(etag.unwrap_or_else(|| format!("missing-etag:{key}")))
}

/// Sorts an object_store error into what the caller does next.
fn classify(op: &'static str, key: &str, error: object_store::Error) -> StoreError {
    let message = error.to_string();
    match error {
        object_store::Error::AlreadyExists { .. } => StoreError::AlreadyExists {
            key: key.to_owned(),
        },
        object_store::Error::Precondition { .. } => StoreError::Changed {
            key: key.to_owned(),
        },
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => StoreError::Denied {
            op,
            key: key.to_owned(),
            message,
        },
        // Generic covers server errors, throttling (503 SlowDown), timeouts and broken
        // connections: all worth a bounded retry.
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. } => {
            StoreError::Unavailable {
                op,
                key: key.to_owned(),
                attempts: 1,
                message,
            }
        }
        _ => StoreError::Failed {
            op,
            key: key.to_owned(),
            message,
        },
    }
}
