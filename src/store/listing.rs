//! Listing: the one pager ([`Store::list_all`]), the sharded walks of the index and the
//! heartbeats (all 256 shards, or a partition's ranges of them, side by side on S3 and in one
//! directory walk on the local backend), and a bounded page.

use super::*;

impl Store {
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
}
