//! Shared test helpers: opening each backend the conformance suite runs on.
#![allow(dead_code)]

pub(crate) mod crash;

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use rekindle::clock::{Clock, SystemClock};
use rekindle::store::faults::{FaultPlan, FaultyStore};
use rekindle::store::{Backend, RetryPolicy, Store, StoreSettings, StoreUrl};

/// Fast retries so fault tests finish quickly; still bounded.
pub(crate) fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(20),
        max_retries: 12,
        attempt_timeout: Duration::from_secs(5),
    }
}

pub(crate) fn memory() -> Store {
    Store::from_parts(
        Arc::new(InMemory::new()),
        Backend::Memory,
        "memory://",
        "",
        fast_retry(),
        SystemClock::shared(),
    )
}

/// A memory store under a seeded fault injector.
pub(crate) fn faulty_memory(plan: FaultPlan, seed: u64) -> (Store, Arc<FaultyStore>) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), plan, seed);
    let store = Store::from_parts(
        faulty.clone(),
        Backend::Memory,
        "memory://faulty",
        "",
        fast_retry(),
        SystemClock::shared(),
    );
    (store, faulty)
}

/// Settings with fast retries, reaching the S3 test server as `scripts/test` describes it:
/// the binaries read `AWS_ALLOW_HTTP` at their boundary, and so do the tests, here.
pub(crate) fn settings() -> StoreSettings {
    StoreSettings {
        retry: fast_retry(),
        allow_http: std::env::var("AWS_ALLOW_HTTP")
            .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1"),
        ..StoreSettings::default()
    }
}

pub(crate) async fn local(dir: &std::path::Path) -> Store {
    let url = StoreUrl::Local {
        root: dir.to_owned(),
    };
    Store::open(&url, &settings(), SystemClock::shared())
        .await
        .unwrap()
}

/// The S3 test server's URL. `scripts/test` starts one (moto behind a request-serialising
/// wrapper) and sets it; set it yourself to run against MinIO or AWS.
pub(crate) fn s3_url() -> String {
    std::env::var("REKINDLE_TEST_S3_URL").unwrap_or_else(|_| {
        panic!(
            "REKINDLE_TEST_S3_URL is not set: run the tests through scripts/test, which starts a local S3 server, or point it at a bucket (with AWS credentials in the environment)"
        )
    })
}

/// The S3 test store at an exact URL.
pub(crate) async fn s3_store_at(url: &str) -> Store {
    Store::open(&url.parse().unwrap(), &settings(), SystemClock::shared())
        .await
        .unwrap()
}

/// A fresh prefix in the S3 test bucket, so tests never see each other's objects.
pub(crate) async fn s3(name: &str) -> Store {
    let clock: Arc<dyn Clock> = SystemClock::shared();
    let url = format!(
        "{}/{name}-{}",
        s3_url().trim_end_matches('/'),
        clock.nonce()
    );
    Store::open(&url.parse().unwrap(), &settings(), clock)
        .await
        .unwrap()
}

/// A child process that is killed (and reaped) when dropped, so a failing test never leaves
/// fleet processes running.
pub(crate) struct Proc(Option<std::process::Child>);

impl Proc {
    pub(crate) fn new(child: std::process::Child) -> Self {
        Proc(Some(child))
    }

    pub(crate) fn into_inner(mut self) -> std::process::Child {
        self.0.take().expect("the child is present until dropped")
    }
}

impl std::ops::Deref for Proc {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("the child is present until dropped")
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("the child is present until dropped")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
