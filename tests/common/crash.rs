//! An `ObjectStore` wrapper that kills its process at a chosen write: from then on every
//! request of that process hangs forever, as if the process had been killed -9 there. The
//! crashing write itself lands or not, as the test chooses (before or after the PUT).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

pub(crate) struct Crashable {
    inner: Arc<dyn ObjectStore>,
    /// Writes left before the crash; negative: never.
    writes_left: AtomicI64,
    /// Whether the crashing write lands before the process dies.
    lands: AtomicBool,
    crashed: AtomicBool,
    /// Writes to keys ending with this fail (after the given number of them succeeded).
    failing: std::sync::Mutex<Option<(String, usize)>>,
    /// The next write to a key ending with this lands but its response is lost, and the
    /// given number of writes to such keys after it fail without landing (a brownout that
    /// outlasts the retries).
    lost: std::sync::Mutex<Option<Lost>>,
}

/// A write whose answer is lost, and the failures after it (see [`Crashable::lose_answer`]).
struct Lost {
    suffix: String,
    landed: bool,
    failing: usize,
}

impl fmt::Debug for Crashable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Crashable({})", self.inner)
    }
}

impl fmt::Display for Crashable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Crashable({})", self.inner)
    }
}

impl Crashable {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Crashable {
            inner,
            writes_left: AtomicI64::new(-1),
            lands: AtomicBool::new(false),
            crashed: AtomicBool::new(false),
            failing: std::sync::Mutex::new(None),
            lost: std::sync::Mutex::new(None),
        })
    }

    /// The next write to a key ending with `suffix` lands and answers an error, and the
    /// `then_failing` writes to such keys after it fail without landing.
    pub(crate) fn lose_answer(&self, suffix: &str, then_failing: usize) {
        *self.lost.lock().unwrap() = Some(Lost {
            suffix: suffix.to_owned(),
            landed: false,
            failing: then_failing,
        });
    }

    /// For a write to `location`: whether it lands, and whether it answers an error.
    fn answer(&self, location: &Path) -> (bool, bool) {
        let mut lost = self.lost.lock().unwrap();
        let Some(plan) = lost.as_mut() else {
            return (true, false);
        };
        if !location.as_ref().ends_with(plan.suffix.as_str()) {
            return (true, false);
        }
        if !plan.landed {
            plan.landed = true;
            if plan.failing == 0 {
                *lost = None;
            }
            return (true, true);
        }
        plan.failing -= 1;
        if plan.failing == 0 {
            *lost = None;
        }
        (false, true)
    }

    /// Fails every write to a key ending with `suffix` after the next `after` such writes
    /// (the process lives on: a store that refuses them), until called with `None`.
    pub(crate) fn fail_writes(&self, failing: Option<(&str, usize)>) {
        *self.failing.lock().unwrap() = failing.map(|(suffix, after)| (suffix.to_owned(), after));
    }

    fn refuses(&self, location: &Path) -> bool {
        let mut failing = self.failing.lock().unwrap();
        match failing.as_mut() {
            Some((suffix, after)) if location.as_ref().ends_with(suffix.as_str()) => {
                if *after == 0 {
                    return true;
                }
                *after -= 1;
                false
            }
            _ => false,
        }
    }

    /// Dies at the `n`th write from now (1 = the next one); `lands` says whether it lands.
    pub(crate) fn crash_at_write(&self, n: i64, lands: bool) {
        self.lands.store(lands, Ordering::SeqCst);
        self.writes_left.store(n, Ordering::SeqCst);
    }

    /// Dies now.
    pub(crate) fn crash(&self) {
        self.crashed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    async fn dead(&self) -> ! {
        futures::future::pending::<()>().await;
        unreachable!("a pending future never completes")
    }

    async fn before_write(&self) -> bool {
        if self.crashed() {
            self.dead().await;
        }
        let left = self.writes_left.load(Ordering::SeqCst);
        if left < 0 {
            return false;
        }
        if left == 1 {
            self.crashed.store(true, Ordering::SeqCst);
            if !self.lands.load(Ordering::SeqCst) {
                self.dead().await;
            }
            return true;
        }
        self.writes_left.store(left - 1, Ordering::SeqCst);
        false
    }

    async fn before_read(&self) {
        if self.crashed() {
            self.dead().await;
        }
    }
}

#[async_trait]
impl ObjectStore for Crashable {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let last = self.before_write().await;
        if self.refuses(location) {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "refused by the test".into(),
            });
        }
        let (lands, fails) = self.answer(location);
        if !lands {
            return Err(object_store::Error::Generic {
                store: "crashable",
                source: "refused in a test's brownout".into(),
            });
        }
        let result = self.inner.put_opts(location, payload, opts).await;
        if last {
            self.dead().await;
        }
        if fails && result.is_ok() {
            return Err(object_store::Error::Generic {
                store: "crashable",
                source: "the answer was lost (a test's brownout)".into(),
            });
        }
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.before_read().await;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.before_read().await;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.before_read().await;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // A delete is a write: counted, and it may be where the process dies.
        if self.crashed() {
            return futures::stream::pending().boxed();
        }
        let left = self.writes_left.load(Ordering::SeqCst);
        if left > 1 {
            self.writes_left.store(left - 1, Ordering::SeqCst);
        }
        if left != 1 {
            return self.inner.delete_stream(locations);
        }
        self.crashed.store(true, Ordering::SeqCst);
        if !self.lands.load(Ordering::SeqCst) {
            return futures::stream::pending().boxed();
        }
        // Lands, then the process dies before it hears back.
        let deleted = self.inner.delete_stream(locations);
        futures::stream::once(async move {
            let _: Vec<_> = deleted.collect().await;
            futures::future::pending::<Result<Path>>().await
        })
        .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.crashed() {
            return futures::stream::pending().boxed();
        }
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.crashed() {
            return futures::stream::pending().boxed();
        }
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.before_read().await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let last = self.before_write().await;
        let result = self.inner.copy_opts(from, to, options).await;
        if last {
            self.dead().await;
        }
        result
    }
}
