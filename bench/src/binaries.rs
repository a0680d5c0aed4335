//! Each Lambda function's release binary: its size, and its time from process start to ready.
//!
//! "Ready" is the moment the Lambda runtime asks for its first event: the bench plays the
//! Runtime API on 127.0.0.1 (`AWS_LAMBDA_RUNTIME_API`), spawns the binary and times the spawn
//! until `GET /2018-06-01/runtime/invocation/next` arrives. That covers the process start,
//! config, and every client the function's `main` builds (Redis connects for real; pools are
//! lazy where the function makes them lazy). Then the process is killed.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const FUNCTIONS: [&str; 5] = [
    "seckill-entry",
    "order-consumer",
    "preheat",
    "reconcile",
    "admin",
];

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BinaryRow {
    pub name: &'static str,
    pub path: String,
    pub built: bool,
    pub size_bytes: Option<u64>,
    /// No `.symtab` section left in the file.
    pub stripped: Option<bool>,
    pub init_ms: Vec<f64>,
    pub init_ms_median: Option<f64>,
    pub error: Option<String>,
}

pub fn release_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("release")
}

pub async fn measure(name: &'static str, repeats: usize) -> BinaryRow {
    let path = release_dir().join(name);
    let mut row = BinaryRow {
        name,
        path: path.display().to_string(),
        built: false,
        size_bytes: None,
        stripped: None,
        init_ms: Vec::new(),
        init_ms_median: None,
        error: None,
    };
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("  {name:<16} not built ({})", path.display());
        return row;
    };
    row.built = true;
    row.size_bytes = Some(bytes.len() as u64);
    row.stripped = Some(!bytes.windows(8).any(|w| w == b".symtab\0"));
    drop(bytes);
    for _ in 0..repeats {
        match init_once(name, &path).await {
            Ok(d) => row.init_ms.push(d.as_secs_f64() * 1000.0),
            Err(e) => {
                row.error = Some(format!("{e:#}"));
                break;
            }
        }
    }
    if !row.init_ms.is_empty() {
        let mut v = row.init_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        row.init_ms_median = Some(v[v.len() / 2]);
    }
    eprintln!(
        "  {name:<16} {:>6.1} MB  stripped {:?}  init {:?} ms{}",
        row.size_bytes.unwrap_or(0) as f64 / 1e6,
        row.stripped.unwrap_or(false),
        row.init_ms
            .iter()
            .map(|v| (v * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        row.error
            .as_deref()
            .map(|e| format!("  error: {e}"))
            .unwrap_or_default()
    );
    row
}

async fn init_once(name: &str, path: &Path) -> anyhow::Result<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let start = Instant::now();
    let mut child = tokio::process::Command::new(path)
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", name)
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"))
        .env("SECKILL_KEY_PREFIX", crate::util::fresh_prefix())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let result = tokio::select! {
        r = wait_for_next(&listener) => r.map(|_| start.elapsed()),
        status = child.wait() => Err(anyhow::anyhow!("exited before asking for an event: {status:?}")),
        _ = tokio::time::sleep(Duration::from_secs(20)) => Err(anyhow::anyhow!("not ready within 20 s")),
    };
    let _ = child.start_kill();
    let _ = child.wait().await;
    if result.is_err() {
        if let Some(mut err) = child.stderr.take() {
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(1), err.read_to_end(&mut buf)).await;
            let text = String::from_utf8_lossy(&buf);
            let tail: String = text
                .chars()
                .rev()
                .take(400)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return result.map_err(|e| e.context(tail.trim().to_string()));
        }
    }
    result
}

/// Accepts connections until one asks for the next invocation.
async fn wait_for_next(listener: &TcpListener) -> anyhow::Result<()> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        if head.starts_with(b"GET /2018-06-01/runtime/invocation/next") {
            return Ok(());
        }
        // Anything else (an init error report, ...): answer and keep listening.
        let _ = stream
            .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}")
            .await;
    }
}
