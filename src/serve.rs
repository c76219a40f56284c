//! Health, readiness and Prometheus metrics over HTTP for the fleet binaries.
//!
//! `/healthz` answers 200 while the process runs; `/readyz` answers what
//! [`Readiness`](crate::fleet::readiness::Readiness) says (200 once the store is open and the
//! process registered, with `leading` or `standing by` for a coordinator; 503 with the reason
//! before that, while draining and while heartbeats fail); `/metrics` renders the process's
//! metrics (`crate::metrics`) in the Prometheus text format; `POST /wake` cuts the process's
//! wait for work short (see `fleet::wake`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::get;

use crate::fleet::readiness::Readiness;
use crate::metrics::Exporter;

/// Binds `listen` now, so an address in use is an error at startup, not a process running
/// without its endpoints.
pub async fn bind(listen: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| {
            std::io::Error::new(error.kind(), format!("cannot listen on {listen}: {error}"))
        })
}

/// Serves the endpoints on a bound listener until the process ends, with `POST /wake`
/// waking `wake` (see `fleet::wake`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    readiness: Arc<Readiness>,
    metrics: Option<Exporter>,
    wake: Option<crate::fleet::wake::Wakeup>,
) -> std::io::Result<()> {
    let probe = Arc::clone(&readiness);
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let (ready, line) = probe.check();
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (status, format!("{line}\n")) }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                readiness.check();
                let text = metrics.as_ref().map(Exporter::render).unwrap_or_default();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
            }),
        );
    let app = match wake {
        Some(wake) => app.merge(crate::fleet::wake::route(wake)),
        None => app,
    };
    let listen: SocketAddr = listener.local_addr()?;
    tracing::info!(%listen, "serving /healthz, /readyz, /metrics and /wake");
    axum::serve(listener, app).await
}
