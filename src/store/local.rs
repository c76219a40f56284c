//! The local directory backend: object_store's `LocalFileSystem`, with whole-object reads
//! done in one blocking call.
//!
//! `LocalFileSystem::get_opts` opens the file on a blocking thread and returns it; reading
//! its bytes is then a second trip to a blocking thread. Every trip wakes a thread of
//! tokio's blocking pool and wakes the caller's task again when it is done, and on a busy
//! fleet those wake-ups cost more CPU than the file operations themselves. A plain read (the
//! whole object, no conditions) is the common case, so it opens, stats and reads the file in
//! place, on the caller's runtime thread: the objects are small (a few KB) and were mostly
//! written moments before, so the read is served from the page cache in microseconds, less
//! than the trip to the pool would cost. A read that misses the cache (a cold start on a
//! disk) holds its runtime thread for the disk's read time. Everything else is
//! `LocalFileSystem`'s own code.

use std::fmt;
use std::io::Read;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// A local directory store (see the module documentation).
#[derive(Debug)]
pub struct LocalDir {
    fs: LocalFileSystem,
}

impl LocalDir {
    /// Wraps `fs`, which must be configured already (prefix, fsync).
    pub fn new(fs: LocalFileSystem) -> Self {
        LocalDir { fs }
    }
}

impl fmt::Display for LocalDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalDir({})", self.fs)
    }
}

/// Whether `options` asks for exactly what [`whole_file`] does: every byte, no conditions.
fn plain(options: &GetOptions) -> bool {
    options.if_match.is_none()
        && options.if_none_match.is_none()
        && options.if_modified_since.is_none()
        && options.if_unmodified_since.is_none()
        && options.range.is_none()
        && options.version.is_none()
        && !options.head
}

/// Opens, stats and reads `path` whole, as `LocalFileSystem` would in two steps: the same
/// not-found errors (a missing file or a directory), the same metadata and ETag.
fn whole_file(path: &std::path::Path, location: Path) -> Result<(ObjectMeta, Bytes)> {
    let not_found =
        |source: Box<dyn std::error::Error + Send + Sync>| object_store::Error::NotFound {
            path: path.display().to_string(),
            source,
        };
    let failed = |error: std::io::Error| object_store::Error::Generic {
        store: "LocalDir",
        source: format!("read {}: {error}", path.display()).into(),
    };
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_found(error.into()));
        }
        Err(error) => return Err(failed(error)),
    };
    let metadata = file.metadata().map_err(failed)?;
    if metadata.is_dir() {
        return Err(not_found("is a directory".into()));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.read_to_end(&mut bytes).map_err(failed)?;
    let modified = metadata.modified().map_err(failed)?;
    let mtime = modified
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    let meta = ObjectMeta {
        location,
        last_modified: modified.into(),
        size: bytes.len() as u64,
        e_tag: Some(format!("\"{inode:x}-{mtime:x}-{:x}\"", metadata.len())),
        version: None,
    };
    Ok((meta, Bytes::from(bytes)))
}

#[async_trait]
impl ObjectStore for LocalDir {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.fs.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.fs.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if !plain(&options) {
            return self.fs.get_opts(location, options).await;
        }
        let path = self.fs.path_to_filesystem(location)?;
        let location = location.clone();
        let read = whole_file(&path, location);
        // Done within one poll: give the runtime its turn when this task's budget is spent, so
        // a long run of reads (a scan's, side by side) never holds a runtime thread from the
        // other tasks (the heartbeat's among them).
        tokio::task::consume_budget().await;
        let (meta, bytes) = read?;
        Ok(GetResult {
            range: 0..meta.size,
            payload: GetResultPayload::Stream(futures::stream::once(async { Ok(bytes) }).boxed()),
            attributes: Default::default(),
            meta,
            extensions: options.extensions,
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.fs.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.fs.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.fs.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.fs.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.fs.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.fs.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    // Proves a plain read returns what object_store's own two-step read returns (bytes, size,
    // ETag, not-found for a missing key and for a directory), so the store above cannot tell
    // the difference.
    #[tokio::test]
    async fn a_whole_read_matches_the_file_systems_own() {
        let dir = tempfile::tempdir().unwrap();
        let fs = || LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let local = LocalDir::new(fs());
        let key = Path::from("a/b/object");
        local
            .put(&key, PutPayload::from_static(b"some bytes"))
            .await
            .unwrap();
        let ours = local.get(&key).await.unwrap();
        let theirs = fs().get(&key).await.unwrap();
        assert_eq!(ours.meta, theirs.meta);
        assert_eq!(ours.range, theirs.range);
        assert_eq!(ours.bytes().await.unwrap(), theirs.bytes().await.unwrap());
        for missing in ["a/b/none", "a/b"] {
            let error = local.get(&Path::from(missing)).await.unwrap_err();
            assert!(
                matches!(error, object_store::Error::NotFound { .. }),
                "{missing}: {error}"
            );
        }
    }
}
