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
pub mod local;
pub mod log;
pub mod measure;
pub mod partitions;
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

    /// Runs `section` under the local lock of `key`, in a task of its own. A caller that stops
    /// waiting (the per-attempt deadline in `retrying` drops its future) does not cancel the
    /// task, and dropping a `JoinHandle` does not either: the lock is released only after the
    /// section, and object_store's blocking write inside it, have finished. A caller that gave
    /// up while the task still waited for the lock never has its write done later: the task
    /// then skips the section.
    async fn locked<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        section: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Store, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.locked_then(op, key, false, section).await
    }

    /// [`Self::locked`]; with `forget`, a section that succeeded (the key was deleted) also
    /// removes the key's lock file, still holding it, so lock files do not outlive their
    /// keys (see [`local_lock`] for why that is safe).
    async fn locked_then<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        forget: bool,
        section: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Store, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let Backend::Local { root } = &self.backend else {
            return section(self.clone(), key.to_owned()).await;
        };
        let root = root.clone();
        let store = self.clone();
        let owned = key.to_owned();
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Set when this future is dropped or finishes, whichever comes first.
        let _caller = Abandon(Arc::clone(&abandoned));
        tokio::spawn(async move {
            let lock = local_lock(&root, &owned).await?;
            if abandoned.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable {
                    op,
                    key: owned,
                    attempts: 1,
                    message: "the caller gave up while waiting for the local lock".into(),
                });
            }
            let done = section(store, owned).await;
            if forget && done.is_ok() {
                lock.forget().await;
            }
            done
        })
        .await
        .map_err(|error| StoreError::Failed {
            op,
            key: key.to_owned(),
            message: format!("the locked section stopped: {error}"),
        })?
    }

    /// Makes a local delete durable: fsyncs the directory that held `key` (object_store's
    /// `with_fsync` covers writes, not standalone deletes). A directory that does not exist
    /// holds nothing to sync.
    async fn sync_parent_directory(&self, key: &str) -> Result<(), StoreError> {
        let Backend::Local { root } = &self.backend else {
            return Ok(());
        };
        // Local keys have no prefix, and layout keys use only characters that object_store
        // maps to the file system unchanged, so this is the directory it deleted from.
        let Some(directory) = root
            .join(self.path(key).as_ref())
            .parent()
            .map(|p| p.to_path_buf())
        else {
            return Ok(());
        };
        let syncs = Arc::clone(&self.local_directory_syncs);
        let synced = tokio::task::spawn_blocking(move || {
            match std::fs::File::open(&directory).and_then(|dir| dir.sync_all()) {
                Ok(()) => {
                    syncs.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(format!("fsync {}: {error}", directory.display())),
            }
        })
        .await
        .map_err(|error| error.to_string())
        .and_then(|inner| inner);
        synced.map_err(|message| StoreError::Failed {
            op: "delete",
            key: key.to_owned(),
            message,
        })
    }

    /// Lists every key under `prefix`, in key order, one bounded page ([`LIST_PAGE`] keys, one
    /// request) at a time. The one pager: callers never hand-write the `after` loop.
    pub async fn list_all(&self, prefix: &str) -> Result<Vec<Listed>, StoreError> {
        // The local backend walks the whole directory tree under `prefix` for every page (its
        // offset only skips the stat of what it passes), so paging costs the square of the
        // keys: one walk lists them all, counted a request per thousand keys as pages would be.
        if matches!(self.backend, Backend::Local { .. }) {
            return self.list(prefix, None, usize::MAX).await;
        }
        let mut all = Vec::new();
        loop {
            let after = all.last().map(|listed: &Listed| listed.key.clone());
            let page = self.list(prefix, after.as_deref(), LIST_PAGE).await?;
            let full = page.len() == LIST_PAGE;
            all.extend(page);
            if !full {
                return Ok(all);
            }
        }
    }

    /// Calls `each` with every key under `prefix`, a prefix whose keys all start with a hex
    /// shard (`<prefix><shard>/…`, as `layout::index_entry`'s do), in no particular order and
    /// never holding more than a few pages: a big index is never held twice in memory (as
    /// listed, and as its reader keeps it). On S3, once the prefix holds more than one page,
    /// the rest is listed as 16 ranges side by side, one per first hex digit: N keys take
    /// about N / 16 000 round trips one after another after the first page, not N / 1 000.
    /// A retried page may hand `each` some keys twice.
    pub async fn for_each_sharded(
        &self,
        prefix: &str,
        each: impl FnMut(Listed) + Send,
    ) -> Result<(), StoreError> {
        let each = Mutex::new(each);
        let each = |listed: Listed| (each.lock().unwrap_or_else(|e| e.into_inner()))(listed);
        if matches!(self.backend, Backend::Local { .. }) {
            return self.walk_local(prefix, &each).await;
        }
        let first = self.list(prefix, None, LIST_PAGE).await?;
        let last = match first.last() {
            Some(last) if first.len() == LIST_PAGE => last.key.clone(),
            _ => {
                first.into_iter().for_each(each);
                return Ok(());
            }
        };
        first.into_iter().for_each(each);
        let base = prefix.trim_end_matches('/');
        // Range `h` holds the keys from `<base>/<h>` to `<base>/<h + 1>` (the last one to the
        // end); the ranges partition everything after the first page's last key.
        // A range ends at its bound inclusive (a key equal to `<base>/<h + 1>` is its, and the
        // next range lists strictly after it); the first starts right after `last`, so keys
        // that sort before `<base>/0` are listed too. Nothing after `last` is skipped.
        let ranges = (0..16u32).filter_map(|h| {
            let start = format!("{base}/{h:x}");
            let end = (h < 15).then(|| format!("{base}/{:x}", h + 1));
            if end.as_deref().is_some_and(|end| end < last.as_str()) {
                return None;
            }
            let after = if h == 0 {
                last.clone()
            } else {
                start.max(last.clone())
            };
            Some((after, end))
        });
        let pages = ranges.map(|(after, end)| {
            Box::pin(futures::stream::try_unfold(Some(after), move |after| {
                let end = end.clone();
                async move {
                    let Some(after) = after else {
                        return Ok::<_, StoreError>(None);
                    };
                    let page = self.list(prefix, Some(&after), LIST_PAGE).await?;
                    let full = page.len() == LIST_PAGE;
                    let page: Vec<Listed> = page
                        .into_iter()
                        .take_while(|listed| {
                            end.as_deref().is_none_or(|end| listed.key.as_str() <= end)
                        })
                        .collect();
                    let next = match page.last() {
                        Some(last) if full && page.len() == LIST_PAGE => Some(last.key.clone()),
                        _ => None,
                    };
                    Ok(Some((page, next)))
                }
            }))
        });
        let mut pages = futures::stream::select_all(pages);
        while let Some(page) = pages.try_next().await? {
            page.into_iter().for_each(each);
        }
        Ok(())
    }

    /// The local backend's listing of `prefix`: one walk, as `list_all`'s, handed on as it goes
    /// instead of sorted first.
    async fn walk_local(
        &self,
        prefix: &str,
        each: &(impl Fn(Listed) + Sync),
    ) -> Result<(), StoreError> {
        bump(&self.metrics.list, 1);
        let walked = std::sync::atomic::AtomicUsize::new(0);
        let counted = |listed: Listed| {
            if (walked.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(1000) {
                bump(&self.metrics.list, 1);
            }
            each(listed)
        };
        self.walk_local_uncounted(prefix, &counted).await
    }

    /// [`Store::walk_local`] without counting listings (its caller counts them).
    async fn walk_local_uncounted(
        &self,
        prefix: &str,
        each: &(impl Fn(Listed) + Sync),
    ) -> Result<(), StoreError> {
        self.retrying("list", prefix, || async {
            let mut stream = self
                .inner
                .list(Some(&self.path(prefix.trim_end_matches('/'))));
            loop {
                match stream.next().await {
                    Some(Ok(meta)) => {
                        each(self.listed(meta));
                    }
                    Some(Err(object_store::Error::NotFound { .. })) | None => {
                        return Ok(());
                    }
                    Some(Err(error)) => return Err(classify("list", prefix, error)),
                }
            }
        })
        .await
    }

    /// Hands `each` every key under `prefix` whose shard (the two hex digits after the prefix,
    /// see `layout`) lies in `first..=last`, as [`Store::for_each_sharded`] does for all of
    /// them: on S3 one listing from the range's start, and once that holds more than a page,
    /// the rest as up to 16 sub-ranges side by side. A coordinator lists its partitions so.
    pub async fn for_each_in_shards(
        &self,
        prefix: &str,
        (first, last): (u8, u8),
        each: impl FnMut(Listed) + Send,
    ) -> Result<(), StoreError> {
        if (first, last) == (0, 255) {
            return self.for_each_sharded(prefix, each).await;
        }
        let base = prefix.trim_end_matches('/');
        // Only keys laid out as `<base>/<shard>/...` with the shard in range: a stray key that
        // sorts between two shards' keys is no shard's.
        let within = |key: &str| {
            key.strip_prefix(base)
                .and_then(|rest| rest.strip_prefix('/'))
                .and_then(|rest| rest.get(..3))
                .and_then(|shard| shard.strip_suffix('/'))
                .and_then(|shard| u8::from_str_radix(shard, 16).ok())
                .is_some_and(|shard| (first..=last).contains(&shard))
        };
        let each = Mutex::new(each);
        let each = |listed: Listed| {
            if within(&listed.key) {
                (each.lock().unwrap_or_else(|e| e.into_inner()))(listed)
            }
        };
        if matches!(self.backend, Backend::Local { .. }) {
            // A walk of each shard's directory (the whole prefix would walk every other
            // share's too), counted as one listing per 1000 keys, as S3 pages.
            let walked = std::sync::atomic::AtomicUsize::new(0);
            let counted = |listed: Listed| {
                walked.fetch_add(1, Ordering::Relaxed);
                each(listed)
            };
            for shard in first..=last {
                self.walk_local_uncounted(&format!("{base}/{shard:02x}/"), &counted)
                    .await?;
            }
            let walked = walked.into_inner();
            bump(&self.metrics.list, walked.div_ceil(1000).max(1) as u64);
            return Ok(());
        }
        // Every key of shard `s` sorts after `<base>/<s>` and before `<base>/<s>0` ('/' is
        // below '0'): the exclusive bounds of a run of shards.
        let start = |shard: u8| format!("{base}/{shard:02x}");
        let end = |shard: u8| format!("{base}/{shard:02x}0");
        let stop = end(last);
        let page = self.list(prefix, Some(&start(first)), LIST_PAGE).await?;
        let full = page.len() == LIST_PAGE;
        let page: Vec<Listed> = page.into_iter().take_while(|l| l.key < stop).collect();
        let resume = match page.last() {
            Some(last) if full && page.len() == LIST_PAGE => last.key.clone(),
            _ => {
                page.into_iter().for_each(each);
                return Ok(());
            }
        };
        page.into_iter().for_each(each);
        // The rest, from `resume`, as up to 16 runs of shards side by side.
        let count = u32::from(last - first) + 1;
        let groups = count.min(16);
        let ranges = (0..groups).filter_map(|g| {
            let lo = first + (g * count / groups) as u8;
            let hi = first + ((g + 1) * count / groups - 1) as u8;
            let until = end(hi);
            if until <= resume {
                return None;
            }
            Some((start(lo).max(resume.clone()), until))
        });
        let pages = ranges.map(|(after, until)| {
            Box::pin(futures::stream::try_unfold(Some(after), move |after| {
                let until = until.clone();
                async move {
                    let Some(after) = after else {
                        return Ok::<_, StoreError>(None);
                    };
                    let page = self.list(prefix, Some(&after), LIST_PAGE).await?;
                    let full = page.len() == LIST_PAGE;
                    let page: Vec<Listed> =
                        page.into_iter().take_while(|l| l.key < until).collect();
                    let next = match page.last() {
                        Some(last) if full && page.len() == LIST_PAGE => Some(last.key.clone()),
                        _ => None,
                    };
                    Ok(Some((page, next)))
                }
            }))
        });
        let mut pages = futures::stream::select_all(pages);
        while let Some(page) = pages.try_next().await? {
            page.into_iter().for_each(each);
        }
        Ok(())
    }

    /// Lists up to `limit` keys under `prefix` (a key prefix ending in `/`), in key order,
    /// starting after `after` if given. Listings are bounded: callers page with `after`.
    pub async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, StoreError> {
        self.retrying("list", prefix, || async {
            bump(&self.metrics.list, 1);
            let path = self.path(prefix.trim_end_matches('/'));
            let mut stream = match after {
                Some(after) => self.inner.list_with_offset(Some(&path), &self.path(after)),
                None => self.inner.list(Some(&path)),
            };
            // The local backend lists in directory order: read it whole, then sort and cut.
            let local = matches!(self.backend, Backend::Local { .. });
            let mut listed = Vec::new();
            while local || listed.len() < limit {
                match stream.next().await {
                    Some(Ok(meta)) => {
                        // Pages hold up to 1000 keys; count each further page as a request.
                        if !listed.is_empty() && listed.len().is_multiple_of(1000) {
                            bump(&self.metrics.list, 1);
                        }
                        listed.push(self.listed(meta));
                    }
                    Some(Err(object_store::Error::NotFound { .. })) | None => break,
                    Some(Err(error)) => return Err(classify("list", prefix, error)),
                }
            }
            if local {
                listed.sort_by(|a, b| a.key.cmp(&b.key));
                listed.truncate(limit);
            }
            Ok(listed)
        })
        .await
    }

    /// A listed object as the store reports it.
    fn listed(&self, meta: object_store::ObjectMeta) -> Listed {
        // A memory bucket lives inside one process and has no clock of its own: its
        // timestamps are that process's system clock, which tests and the simulation replace
        // with an injected one. Only a store with its own clock reports times.
        let timed = !matches!(self.backend, Backend::Memory);
        Listed {
            key: self.relative(&meta.location),
            etag: meta.e_tag.map(ETag),
            size: meta.size,
            modified_ms: u64::try_from(meta.last_modified.timestamp_millis())
                .ok()
                .filter(|&ms| timed && ms > 0),
        }
    }

    /// Runs the capability probe unless this process already passed it for this URL.
    pub async fn probe_once(&self) -> Result<(), StoreError> {
        static PASSED: OnceLock<Mutex<HashMap<String, ()>>> = OnceLock::new();
        let passed = PASSED.get_or_init(Default::default);
        let cached = passed
            .lock()
            .map(|map| map.contains_key(&self.url))
            .unwrap_or(false);
        // Memory stores are distinct per open, so each one is probed.
        if cached && self.backend != Backend::Memory {
            return Ok(());
        }
        self.probe().await?;
        if let Ok(mut map) = passed.lock() {
            map.insert(self.url.clone(), ());
        }
        Ok(())
    }

    /// Verifies, against this very store, that conditional writes are enforced and atomic:
    /// a create on an existing key fails, a swap with a stale version fails, and of several
    /// concurrent creates of one key exactly one wins. Names the failed check otherwise.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let run = self.clock.nonce();
        let base = format!("probe/{run}");
        let failed = |check: &'static str, detail: String| StoreError::ProbeFailed {
            url: self.url.clone(),
            check,
            detail,
        };
        let result = async {
            let key = format!("{base}/create");
            let first = self.create(&key, Bytes::from(format!("first {run}"))).await?;
            match self.create(&key, Bytes::from(format!("second {run}"))).await {
                Err(StoreError::AlreadyExists { .. }) => {}
                Ok(_) => {
                    return Err(failed(
                        "create-if-absent",
                        format!("a second create of '{key}' succeeded; the store ignores If-None-Match"),
                    ));
                }
                Err(other) => return Err(other),
            }
            let second = self.swap(&key, Bytes::from(format!("swapped {run}")), &first).await?;
            if second == first {
                return Err(failed(
                    "compare-and-swap",
                    format!("'{key}' kept its version after an update"),
                ));
            }
            match self.swap(&key, Bytes::from(format!("stale {run}")), &first).await {
                Err(StoreError::Changed { .. }) => {}
                Ok(_) => {
                    return Err(failed(
                        "compare-and-swap",
                        format!("an update of '{key}' with a stale version succeeded; the store ignores If-Match"),
                    ));
                }
                Err(other) => return Err(other),
            }
            let race = format!("{base}/race");
            let contenders = 8;
            let outcomes = futures::future::join_all((0..contenders).map(|i| {
                let race = race.clone();
                let run = run.clone();
                async move { self.create(&race, Bytes::from(format!("contender {i} {run}"))).await }
            }))
            .await;
            let mut winners = Vec::new();
            for (i, outcome) in outcomes.into_iter().enumerate() {
                match outcome {
                    Ok(_) => winners.push(i),
                    Err(StoreError::AlreadyExists { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            let stored = self.read(&race).await?.map(|o| o.bytes);
            let expected = winners
                .first()
                .map(|i| Bytes::from(format!("contender {i} {run}")));
            if winners.len() != 1 || stored != expected {
                return Err(failed(
                    "atomic create race",
                    format!(
                        "{} of {contenders} concurrent creates of '{race}' reported success",
                        winners.len()
                    ),
                ));
            }
            Ok(())
        }
        .await;
        // Clean up whatever the probe left; failures here do not matter.
        for key in [format!("{base}/create"), format!("{base}/race")] {
            let _ = self.delete(&key).await;
        }
        if let Backend::Local { root } = &self.backend {
            let _ = std::fs::remove_dir_all(root.join("probe").join(&run));
        }
        result
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

/// Marks a locked section's caller as gone when dropped.
struct Abandon(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A held per-key lock: the open lock file (locked) and its path.
struct LocalLock {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl LocalLock {
    /// Removes the lock file while holding it, then releases it. Best effort: a lock file
    /// left behind only takes space. One unlink, done in place (see [`local_lock`]).
    async fn forget(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}

/// Takes the per-key lock that makes compare-and-swap, overwrite and delete atomic on the
/// local directory backend (object_store's local backend has create-if-absent but no
/// compare-and-swap). An exclusive `flock` on `<root>/.rekindle-locks/<sha256(key)>` is held
/// for the duration; the kernel drops it if the process dies.
///
/// The lock is first tried in place, without blocking: a free lock is a few system calls of
/// microseconds, and a trip to tokio's blocking pool (a thread woken, the caller's task woken
/// again) costs more CPU than they do. Only a lock another holder has is waited for on the
/// blocking pool, where `flock` may block as long as that holder takes.
///
/// Architecture invariant: a lock file is removed only by its holder (a delete of its key,
/// [`LocalLock::forget`]), and a lock counts only if its file is still the one at the path
/// once locked: a waiter that was blocked on a file its holder then removed finds the path
/// gone or naming another file, lets go and locks the path anew. So two processes never hold
/// the lock of one key at once, and lock files stay bounded by the keys that exist.
async fn local_lock(root: &std::path::Path, key: &str) -> Result<LocalLock, StoreError> {
    let dir = root.join(".rekindle-locks");
    let path = dir.join(crate::core::digest::sha256_hex(key.as_bytes()));
    let failed = |message: String| StoreError::Failed {
        op: "lock",
        key: key.to_owned(),
        message,
    };
    if let Some(lock) = lock_path(&dir, &path, false).map_err(failed)? {
        return Ok(lock);
    }
    tokio::task::spawn_blocking(move || {
        lock_path(&dir, &path, true).map(|lock| lock.expect("a blocking lock is always taken"))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|inner| inner)
    .map_err(failed)
}

/// Locks the lock file at `path` (see [`local_lock`]); without `wait`, `None` if another
/// holder has it.
fn lock_path(
    dir: &std::path::Path,
    path: &std::path::Path,
    wait: bool,
) -> Result<Option<LocalLock>, String> {
    use std::os::unix::fs::MetadataExt;
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
    };
    loop {
        // The directory is made once, by the first lock that finds it missing.
        let file = match open() {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("create {}: {e}", dir.display()))?;
                open()
            }
            other => other,
        }
        .map_err(|e| format!("open {}: {e}", path.display()))?;
        if wait {
            file.lock()
                .map_err(|e| format!("lock {}: {e}", path.display()))?;
        } else {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(format!("lock {}: {e}", path.display()));
                }
            }
        }
        let held = file
            .metadata()
            .map_err(|e| format!("stat {}: {e}", path.display()))?;
        match std::fs::metadata(path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                return Ok(Some(LocalLock {
                    file,
                    path: path.to_owned(),
                }));
            }
            // Removed (or replaced) by the holder we waited for: try the path again.
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(format!("stat {}: {error}", path.display())),
        }
    }
}

#[cfg(test)]
mod lock_tests {
    use super::local_lock;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    // Proves a lock file removed by its holder never lets two holders in at once: one waiter
    // blocked on the removed file and one newcomer on the new file take turns, in whichever
    // order they come.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_removed_lock_file_keeps_the_lock_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let holders = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let first = local_lock(&root, "k").await.unwrap();
        let take = |root: std::path::PathBuf| {
            let (holders, most) = (Arc::clone(&holders), Arc::clone(&most));
            tokio::spawn(async move {
                let lock = local_lock(&root, "k").await.unwrap();
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                crate::clock::sleep(Duration::from_millis(100)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                lock.forget().await;
            })
        };
        let waiter = take(root.clone());
        // The waiter opens the file and blocks on it; then the holder removes it.
        crate::clock::sleep(Duration::from_millis(200)).await;
        first.forget().await;
        let newcomer = take(root.clone());
        waiter.await.unwrap();
        newcomer.await.unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
        let left = std::fs::read_dir(root.join(".rekindle-locks"))
            .unwrap()
            .count();
        assert_eq!(left, 0, "every lock file was removed by its last holder");
    }
}
