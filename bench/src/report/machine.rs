//! Where and when the run happened: the machine, its load, the Redis it ran against.

use std::time::Duration;

/// Where and when the run happened.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    pub uname: String,
    pub cpu: String,
    pub nproc: usize,
    pub load_start: String,
    pub load_end: String,
    pub redis_version: String,
    pub redis_clients_at_start: Option<i64>,
    pub date: String,
    pub command: String,
    pub seconds: f64,
}

impl Machine {
    pub async fn probe() -> Self {
        let uname = std::process::Command::new("uname")
            .arg("-a")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self {
            uname,
            cpu,
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            load_start: loadavg(),
            load_end: String::new(),
            redis_version: String::new(),
            redis_clients_at_start: None,
            date: String::new(),
            command: format!(
                "cargo run --release -p seckill-bench{}{}",
                if args.is_empty() { "" } else { " -- " },
                args.join(" ")
            ),
            seconds: 0.0,
        }
    }

    pub async fn finish(
        mut self,
        started: chrono::DateTime<chrono::Utc>,
        took: Duration,
        clients: (Option<i64>, String),
    ) -> Self {
        self.load_end = loadavg();
        self.date = started.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        self.seconds = took.as_secs_f64();
        self.redis_clients_at_start = clients.0;
        self.redis_version = clients.1;
        self
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Connected clients and server version, to judge how alone the bench was on Redis.
pub async fn redis_clients(con: &mut redis::aio::MultiplexedConnection) -> (Option<i64>, String) {
    let info: String = redis::cmd("INFO")
        .query_async(con)
        .await
        .unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    (
        field("connected_clients:").and_then(|v| v.parse().ok()),
        field("redis_version:").unwrap_or_default(),
    )
}
