//! `catchup run --metrics-addr`: `/metrics` for Prometheus and `/healthz` for liveness
//! probes, on one plain HTTP/1.x listener (a request line, headers ignored, the body
//! written and the connection closed: what scrapers and probes send).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use catchup::CatchupConsumer;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::Failure;

/// The consumer `/healthz` asks, once it is open (until then it answers 503 "starting").
pub type Probe = Arc<OnceLock<Arc<CatchupConsumer>>>;

/// Installs the Prometheus recorder and serves it with `/healthz` on `addr`.
pub async fn serve(addr: SocketAddr) -> Result<Probe, Failure> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(
                catchup::metrics::TIME_TO_FIRST_FRESH.to_owned(),
            ),
            catchup::metrics::TIME_TO_FIRST_FRESH_BUCKETS,
        )
        .and_then(|builder| builder.install_recorder())
        .map_err(|e| Failure::Usage(format!("serving metrics on {addr}: {e}")))?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::Usage(format!("serving metrics on {addr}: {e}")))?;
    let probe: Probe = Arc::default();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        // Histograms and idle series are maintained by the caller of a handle.
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let served = probe.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (handle, probe) = (handle.clone(), served.clone());
            tokio::spawn(async move {
                let _ = answer(stream, &handle, &probe).await;
            });
        }
    });
    Ok(probe)
}

/// Reads one request and writes its response.
async fn answer(
    stream: TcpStream,
    handle: &PrometheusHandle,
    probe: &Probe,
) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    let mut request_line = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_line(&mut request_line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request line"))??;
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (status, content_type, body) = match path.split('?').next().unwrap_or(path) {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", handle.render()),
        "/healthz" => match probe.get().map(|consumer| consumer.health()) {
            None => ("503 Service Unavailable", "text/plain", "starting\n".into()),
            Some(health) if health.is_healthy() => ("200 OK", "text/plain", "ok\n".into()),
            Some(health) => (
                "503 Service Unavailable",
                "text/plain",
                match health.stopped {
                    Some(reason) => format!("stopped: {reason}\n"),
                    None => "the brokers cannot be reached\n".into(),
                },
            ),
        },
        _ => (
            "404 Not Found",
            "text/plain",
            "try /metrics or /healthz\n".into(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let stream = stream.get_mut();
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
