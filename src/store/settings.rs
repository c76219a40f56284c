//! Where a store is and how to reach it, as typed values.
//!
//! This module owns parsing a `--store` string into a [`StoreUrl`] and the [`StoreSettings`]
//! a store is opened with: S3 endpoint, addressing style, plain HTTP, region, the request
//! deadline and retries, the sealing keys and (for tests only) fault injection. The binaries
//! parse their flags and environment into these values once, at their boundary, and hand them
//! down; [`Store::open`](super::Store::open) and everything below it take them as given and
//! never read the environment. AWS credentials (and settings the flags leave unset) still come
//! from the standard AWS chain inside `aws.rs`, as every AWS tool reads them.
//!
//! Architecture invariant: settings are parsed once, at the binary boundary — nothing in the
//! library reads `REKINDLE_SEAL_KEY*`, `REKINDLE_FAULTS*` or `AWS_ALLOW_HTTP`; a store injects
//! faults only when its `StoreSettings::faults` says so.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::faults::FaultSettings;
use super::seal::Sealer;
use super::{RetryPolicy, StoreError};

/// A parsed store URL: `s3://bucket/prefix`, `file:///abs/path` or a plain path, `memory://`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// A bucket and a key prefix inside it (no leading or trailing `/`; may be empty).
    S3 {
        /// The bucket's name.
        bucket: String,
        /// Prefix every key is stored under, without slashes at either end.
        prefix: String,
    },
    /// A local directory, made absolute when parsed (against the working directory then).
    Local {
        /// The directory's absolute path.
        root: PathBuf,
    },
    /// A bucket that lives in this process only, for tests and demos.
    Memory,
}

/// The schemes a store URL may have, as named in errors.
const EXPECTED: &str = "expected s3://bucket/prefix, file:///abs/path, a plain path, or memory://";

impl StoreUrl {
    /// Parses a `--store` value. Refuses, naming the URL: an unknown scheme, an S3 URL without
    /// a bucket or with characters no bucket name has, a prefix with empty, `.` or `..`
    /// segments, a `file://` URL whose path is not absolute, and an empty path.
    pub fn parse(text: &str) -> Result<StoreUrl, StoreError> {
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: text.to_owned(),
            reason,
        };
        let Some((scheme, rest)) = split_scheme(text) else {
            if text.trim().is_empty() {
                return Err(invalid("empty path".into()));
            }
            return local(text).map_err(invalid);
        };
        match scheme.to_ascii_lowercase().as_str() {
            "memory" if rest.is_empty() || rest == "//" => Ok(StoreUrl::Memory),
            "memory" => Err(invalid(
                "a memory store has no bucket or path (write memory://)".into(),
            )),
            "s3" => {
                let Some(rest) = rest.strip_prefix("//") else {
                    return Err(invalid(format!("no '//' after 's3:' ({EXPECTED})")));
                };
                s3(rest).map_err(invalid)
            }
            "file" => {
                let Some(path) = rest.strip_prefix("//") else {
                    return Err(invalid(format!("no '//' after 'file:' ({EXPECTED})")));
                };
                if !path.starts_with('/') {
                    return Err(invalid(
                        "a file:// URL needs an absolute path (file:///abs/path); give a relative directory as a plain path".into(),
                    ));
                }
                local(path).map_err(invalid)
            }
            other if rest.starts_with("//") => {
                Err(invalid(format!("unknown scheme '{other}' ({EXPECTED})")))
            }
            // A colon in a plain relative path ("runs:old"), not a scheme.
            _ => local(text).map_err(invalid),
        }
    }

    /// Whether this is a bucket of this process only.
    pub fn is_memory(&self) -> bool {
        matches!(self, StoreUrl::Memory)
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(text: &str) -> Result<StoreUrl, StoreError> {
        StoreUrl::parse(text)
    }
}

/// The canonical form: `s3://bucket/prefix`, the absolute directory, or `memory://`. This is
/// the store's name in messages and in [`Store::url`](super::Store::url).
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            StoreUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            StoreUrl::Local { root } => write!(f, "{}", root.display()),
            StoreUrl::Memory => write!(f, "memory://"),
        }
    }
}

/// The scheme and the rest, if `text` starts like a URL (`letters:`); a single letter is a
/// Windows drive, not a scheme.
fn split_scheme(text: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = text.split_once(':')?;
    let mut chars = scheme.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (scheme.len() > 1 && starts_with_letter && rest_ok).then_some((scheme, rest))
}

fn s3(rest: &str) -> Result<StoreUrl, String> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err("no bucket name (expected s3://bucket/prefix)".into());
    }
    // Every S3-compatible server takes at most these characters (AWS: lowercase letters,
    // digits, '.', '-'; older buckets and MinIO also uppercase and '_').
    if let Some(bad) = bucket
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!(
            "bucket name '{bucket}' has the character {bad:?}, which no bucket name has"
        ));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        object_store::path::Path::parse(prefix)
            .map_err(|error| format!("key prefix '{prefix}': {error}"))?;
    }
    Ok(StoreUrl::S3 {
        bucket: bucket.to_owned(),
        prefix: prefix.to_owned(),
    })
}

fn local(path: &str) -> Result<StoreUrl, String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    let root = std::path::absolute(path).map_err(|error| error.to_string())?;
    Ok(StoreUrl::Local { root })
}

/// How S3 requests name the bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum S3Addressing {
    /// `host/bucket/key`: what MinIO and most S3-compatible servers expect.
    #[default]
    Path,
    /// `bucket.host/key`.
    VirtualHosted,
}

/// Everything a store is opened with beyond its URL, as explicit values.
#[derive(Clone, Debug, Default)]
pub struct StoreSettings {
    /// S3 endpoint, e.g. `http://127.0.0.1:9000` for MinIO (otherwise `AWS_ENDPOINT_URL` or
    /// the AWS default).
    pub endpoint: Option<String>,
    /// How the bucket is named in request URLs: path-style (the default) or virtual-hosted.
    pub addressing: S3Addressing,
    /// Allow plain-HTTP S3 endpoints.
    pub allow_http: bool,
    /// S3 region (otherwise the AWS environment or profile).
    pub region: Option<String>,
    /// Retries of transient faults, and the deadline of one request attempt.
    pub retry: RetryPolicy,
    /// Seal new generation payloads (and open sealed ones) with these keys.
    pub sealer: Option<Arc<Sealer>>,
    /// Test only: wrap the backend in a fault injector (logged as a warning when opened).
    pub faults: Option<FaultSettings>,
    /// Skip the capability probe and format check (for read-only commands).
    pub skip_probe: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> String {
        match StoreUrl::parse(text) {
            Err(StoreError::InvalidUrl { url, reason }) => {
                assert_eq!(url, text);
                reason
            }
            other => panic!("{text}: expected an invalid URL, got {other:?}"),
        }
    }

    // Proves each accepted form parses to its store, and the canonical text round-trips.
    #[test]
    fn accepted_forms() {
        assert_eq!(StoreUrl::parse("memory://").unwrap(), StoreUrl::Memory);
        assert_eq!(StoreUrl::parse("memory:").unwrap(), StoreUrl::Memory);
        let s3 = StoreUrl::parse("s3://bucket/a/b/").unwrap();
        assert_eq!(
            s3,
            StoreUrl::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(s3.to_string(), "s3://bucket/a/b");
        assert_eq!(
            StoreUrl::parse("s3://bucket").unwrap().to_string(),
            "s3://bucket"
        );
        assert_eq!(
            StoreUrl::parse("file:///tmp/x").unwrap(),
            StoreUrl::Local {
                root: PathBuf::from("/tmp/x")
            }
        );
        let relative = StoreUrl::parse("some/dir").unwrap();
        let StoreUrl::Local { root } = &relative else {
            panic!("{relative:?}")
        };
        assert!(root.is_absolute() && root.ends_with("some/dir"), "{root:?}");
        // A colon inside a relative path is not a scheme.
        assert!(matches!(
            StoreUrl::parse("runs:old").unwrap(),
            StoreUrl::Local { .. }
        ));
        let canonical = StoreUrl::parse("s3://b/p").unwrap().to_string();
        assert_eq!(StoreUrl::parse(&canonical).unwrap().to_string(), canonical);
    }

    // Proves malformed URLs are refused with a reason, naming the URL as given.
    #[test]
    fn malformed_urls_are_refused() {
        assert!(reason("ftp://host/x").contains("unknown scheme 'ftp'"));
        assert!(reason("s3://").contains("no bucket name"));
        assert!(reason("s3:bucket").contains("no '//' after 's3:'"));
        assert!(reason("s3://my bucket/x").contains("which no bucket name has"));
        assert!(reason("s3://b/a/../c").contains("key prefix 'a/../c'"));
        assert!(reason("file://relative").contains("absolute path"));
        assert!(reason("memory://x").contains("no bucket or path"));
        assert!(reason("").contains("empty path"));
    }
}
