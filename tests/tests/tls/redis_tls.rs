//! Redis over TLS with an auth token (ElastiCache's `rediss://`): the purchase script runs.

use crate::make_certs;
use seckill_shared::infra::config::RedisTopology;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use std::time::Duration;

#[tokio::test]
async fn purchase_script_runs_over_tls_with_an_auth_token() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("seckill-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    make_certs(&dir, "IP:127.0.0.1");
    let port = 20000 + (std::process::id() % 20000) as u16;
    let mut server = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            "server.pem",
            "--tls-key-file",
            "server.key",
        ])
        .args(["--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no"])
        .args([
            "--requirepass",
            "s3cret-token",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server starts");
    // rustls-native-certs reads SSL_CERT_FILE: trust our CA the way a Lambda trusts Amazon's.
    // (nextest runs each test in its own process, so this touches no other test.)
    std::env::set_var("SSL_CERT_FILE", dir.join("ca.pem"));

    let mut config = seckill_shared::Config::from_env()?;
    config.key_prefix = "tls".into();
    config.redis =
        RedisTopology::Standalone(format!("rediss://:s3cret-token@127.0.0.1:{port}").into());
    config.redis_timeout = Duration::from_secs(2);
    let mut redis = None;
    for _ in 0..50 {
        match Redis::connect(&config).await {
            Ok(r) => {
                redis = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let redis = redis.expect("connects over TLS with the AUTH token");

    let k = redis.keys(1);
    let now = chrono::Utc::now().timestamp_millis();
    let _: () = redis
        .cmd(redis::cmd("HSET").arg(&k.meta).arg(&[
            ("startMs", (now - 60_000).to_string()),
            ("endMs", (now + 60_000).to_string()),
            ("limit", "1".into()),
            ("expireAtMs", (now + 120_000).to_string()),
            ("stock", "1".into()),
        ]))
        .await?;
    let decision = testkit::purchase(
        &redis,
        1,
        "alice",
        1,
        uuid::Uuid::new_v4(),
        purchase::far_deadline(),
    )
    .await?;
    assert!(
        matches!(decision, Ok(Reservation { stock_left: 0, .. })),
        "{decision:?}"
    );

    // Without the token the same server refuses us.
    config.redis = RedisTopology::Standalone(format!("rediss://127.0.0.1:{port}").into());
    let refused = match Redis::connect(&config).await {
        Err(_) => true,
        Ok(r) => r.cmd::<String>(redis::cmd("PING").arg("x")).await.is_err(),
    };
    assert!(
        refused,
        "a connection without the AUTH token must be refused"
    );

    server.kill().await.ok();
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
