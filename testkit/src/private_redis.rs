//! A redis-server of the test's own, on a random port, so a test may pause (SIGSTOP),
//! resume, flush or restart it without disturbing the tests running beside it.

use crate::env::{RedisKind, TestEnv};
use seckill_shared::infra::config::RedisTopology;
use std::time::Duration;

/// A redis-server the test started, killed when dropped.
pub struct PrivateRedis {
    child: tokio::process::Child,
    port: u16,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        for _ in 0..20 {
            let port = 20000 + (rand_port() % 20000);
            if let Some(me) = Self::start_on(port).await {
                return me;
            }
        }
        panic!("no private redis-server could be started");
    }

    /// Starts a server on `port`; `None` when it did not come up (the port was taken).
    pub async fn start_on(port: u16) -> Option<Self> {
        let child = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server on PATH");
        let mut me = Self { child, port };
        for _ in 0..100 {
            if me.raw().await.is_ok() {
                return Some(me);
            }
            if let Ok(Some(_)) = me.child.try_wait() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain connection that bypasses the test's `Redis` handle (and its timeout).
    pub async fn raw(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Sends a signal to the server (`-STOP` pauses it, `-CONT` resumes it).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill on PATH")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Commands the server has executed, apart from the INFO calls that read the count.
    pub async fn commands_served(&self) -> u64 {
        let mut con = self.raw().await.expect("private redis answers");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .expect("INFO answers");
        info.lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// The functions' Redis ACL users on this server, as scripts/stack.sh creates them on the
    /// local stack's (`scripts/redis_acl.py apply`).
    async fn add_function_users(&self) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = tokio::process::Command::new("python3")
            .arg(root.join("scripts/redis_acl.py"))
            .arg("apply")
            .arg(format!("127.0.0.1:{}", self.port))
            .output()
            .await
            .expect("python3 runs scripts/redis_acl.py");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A test env whose Redis is this server (its own prefix, database and queue as usual).
    pub async fn env(&self, redis_timeout: Duration, sold_out_ttl: Duration) -> TestEnv {
        let mut env = TestEnv::new(RedisKind::Standalone)
            .await
            .expect("test env against the real services");
        env.config.redis = RedisTopology::Standalone(self.url().into());
        env.config.redis_timeout = redis_timeout;
        env.config.sold_out_cache_ttl = sold_out_ttl;
        self.add_function_users().await;
        env.reconnect().await.expect("private redis connects");
        env
    }
}

fn rand_port() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 65_536) as u16
}
