//! S3 through object_store, with credentials from the standard AWS chain (aws-config).
//!
//! This module owns the mapping from the AWS environment to an object_store S3 client: the
//! aws-config credential chain (environment, profile, web identity on Kubernetes, instance
//! metadata) adapted into object_store's credential provider with a cache, the region and
//! endpoint, MinIO-style settings, and the conditional-put mode, set explicitly to ETag
//! matching rather than left to a crate default. Retries are disabled inside object_store:
//! `Store` retries with its own bounded policy, so the fault handling lives in one place.
//! Rekindle's own settings (endpoint, addressing, plain HTTP, region, deadline) arrive as
//! [`StoreSettings`]; only what they leave unset comes from the AWS environment.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use object_store::aws::{AmazonS3Builder, AwsCredential, S3ConditionalPut};
use object_store::{ClientOptions, CredentialProvider, ObjectStore, RetryConfig};

use super::{S3Addressing, StoreError, StoreSettings};

/// Credentials are refreshed this long before they expire.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

pub(crate) async fn open_s3(
    bucket: &str,
    settings: &StoreSettings,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_virtual_hosted_style_request(settings.addressing == S3Addressing::VirtualHosted)
        .with_retry(RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        })
        .with_client_options(
            ClientOptions::new()
                .with_allow_http(settings.allow_http)
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(settings.retry.attempt_timeout),
        );
    if settings
        .region
        .as_deref()
        .is_some_and(|r| r.trim().is_empty())
    {
        return Err(StoreError::InvalidUrl {
            url: format!("s3://{bucket}"),
            reason: "the region is empty".into(),
        });
    }
    if let Some(region) = settings
        .region
        .clone()
        .or_else(|| sdk.region().map(|r| r.to_string()))
    {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = settings
        .endpoint
        .clone()
        .or_else(|| sdk.endpoint_url().map(str::to_owned))
    {
        check_endpoint(&endpoint, settings.allow_http).map_err(|reason| {
            StoreError::InvalidUrl {
                url: format!("s3://{bucket}"),
                reason: format!("endpoint '{endpoint}' {reason}"),
            }
        })?;
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(provider) = sdk.credentials_provider() {
        builder = builder.with_credentials(Arc::new(CachedAwsCredentials::new(provider)));
    }
    let store = builder.build().map_err(|error| StoreError::InvalidUrl {
        url: format!("s3://{bucket}"),
        reason: error.to_string(),
    })?;
    Ok(Arc::new(store))
}

/// Refuses an endpoint the S3 client cannot use before it is used: object_store panics on
/// one that is not an absolute URL, and retries a plain-HTTP one it was not allowed to use
/// until its deadline, then reports a builder error.
fn check_endpoint(endpoint: &str, allow_http: bool) -> Result<(), String> {
    let url = reqwest::Url::parse(endpoint).map_err(|error| {
        format!("is not an absolute URL ({error}); expected e.g. http://127.0.0.1:9000")
    })?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("names no host".into());
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" if allow_http => Ok(()),
        "http" => {
            Err("is plain HTTP; allow plain HTTP explicitly (or set AWS_ALLOW_HTTP=true)".into())
        }
        other => Err(format!("has scheme '{other}'; expected http or https")),
    }
}

/// aws-config's provider chain asks its sources on every call; object_store asks for
/// credentials on every request. This cache sits between them so STS and instance-metadata
/// calls happen once per credential lifetime, not once per request.
#[derive(Debug)]
pub struct CachedAwsCredentials {
    provider: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl CachedAwsCredentials {
    /// A cache in front of `provider`, empty until the first request asks for credentials.
    pub fn new(provider: SharedCredentialsProvider) -> Self {
        CachedAwsCredentials {
            provider,
            cached: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait::async_trait]
impl CredentialProvider for CachedAwsCredentials {
    type Credential = AwsCredential;

    #[allow(clippy::disallowed_methods)] // Expiry is an absolute wall time set by the issuer.
    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        if let Some((credential, expiry)) = cached.as_ref() {
            let fresh = expiry.is_none_or(|expiry| {
                expiry
                    .duration_since(SystemTime::now())
                    .is_ok_and(|left| left > REFRESH_BEFORE_EXPIRY)
            });
            if fresh {
                return Ok(Arc::clone(credential));
            }
        }
        let credentials = self.provider.provide_credentials().await.map_err(|error| {
            // The error names the source that failed; it never contains secret values.
            object_store::Error::Unauthenticated {
                path: String::new(),
                source: format!("no AWS credentials: {error}").into(),
            }
        })?;
        let credential = Arc::new(AwsCredential {
            key_id: credentials.access_key_id().to_owned(),
            secret_key: credentials.secret_access_key().to_owned(),
            token: credentials.session_token().map(str::to_owned),
        });
        *cached = Some((Arc::clone(&credential), credentials.expiry()));
        Ok(credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the endpoints object_store would panic on, or retry until its deadline, are
    // refused up front with the reason.
    #[test]
    fn endpoints_are_checked_before_use() {
        assert!(check_endpoint("https://s3.example.com", false).is_ok());
        assert!(check_endpoint("http://127.0.0.1:9000", true).is_ok());
        let refused = |endpoint: &str| check_endpoint(endpoint, false).unwrap_err();
        assert!(refused("not-a-url").contains("not an absolute URL"));
        assert!(refused("").contains("not an absolute URL"));
        assert!(refused("http://127.0.0.1:9").contains("AWS_ALLOW_HTTP"));
        assert!(refused("ftp://x").contains("scheme 'ftp'"));
    }
    use aws_credential_types::Credentials;
    use aws_credential_types::provider::future;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A credential source that counts how often it is asked.
    #[derive(Debug)]
    struct Counting {
        calls: Arc<AtomicUsize>,
        lifetime: Option<Duration>,
    }

    impl ProvideCredentials for Counting {
        #[allow(clippy::disallowed_methods)] // Expiry is an absolute wall time.
        fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
        where
            Self: 'a,
        {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let expiry = self.lifetime.map(|lifetime| SystemTime::now() + lifetime);
            future::ProvideCredentials::ready(Ok(Credentials::new(
                "AKIDEXAMPLE",
                "secret-that-must-not-leak",
                Some("token".into()),
                expiry,
                "counting",
            )))
        }
    }

    async fn calls_for(lifetime: Option<Duration>, requests: usize) -> usize {
        let calls = Arc::new(AtomicUsize::new(0));
        let provider = SharedCredentialsProvider::new(Counting {
            calls: calls.clone(),
            lifetime,
        });
        let cached = CachedAwsCredentials::new(provider);
        for _ in 0..requests {
            let credential = cached.get_credential().await.unwrap();
            assert_eq!(credential.key_id, "AKIDEXAMPLE");
            assert!(!format!("{credential:?}").contains("secret-that-must-not-leak"));
        }
        calls.load(Ordering::SeqCst)
    }

    // Proves credentials are fetched once and reused until shortly before they expire, so
    // object_store's per-request lookups do not turn into per-request STS or IMDS calls.
    #[tokio::test]
    async fn credentials_are_cached_until_near_expiry() {
        assert_eq!(calls_for(Some(Duration::from_secs(3600)), 50).await, 1);
        assert_eq!(calls_for(None, 50).await, 1);
        // Expiring within the refresh margin: fetched again on every request.
        assert_eq!(calls_for(Some(Duration::from_secs(60)), 5).await, 5);
    }
}
