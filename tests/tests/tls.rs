//! The TLS paths to AWS's managed services, against real TLS-only servers these tests start,
//! each with a CA of its own:
//!
//! - ElastiCache over `rediss://` with an AUTH token (a redis-server);
//! - RDS Proxy over `sslmode=verify-full` (a PostgreSQL server of the test's own: initdb, TLS
//!   only, SCRAM passwords): the URL `secrets` builds connects only with the right CA bundle
//!   and host name, a role password set by `seckill-migrate` logs that role in, and a pool
//!   connection whose borrower was cancelled mid-statement is lent again.
//!
//! The server of the test's own also starts without the functions' roles, which the shared
//! local server has long had: there many databases migrated at once all create and configure
//! them.

use seckill_migrate::MigrateConfig;
use seckill_shared::infra::aws_secrets::DatabaseSecret;
use seckill_shared::infra::aws_secrets::RoleSecret;
use seckill_shared::infra::config::RedisTopology;
use seckill_shared::infra::config::SecretRefs;
use seckill_shared::infra::db;
use seckill_shared::infra::db::CaBundle;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use sqlx::{ConnectOptions, Connection};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args:?} failed");
}

/// A CA (`ca.pem`) and a server certificate (`server.pem`, `server.key`) signed by it, for
/// the subject alternative name `san` (`IP:127.0.0.1`, `DNS:localhost`).
fn make_certs(dir: &Path, san: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=seckill test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=seckill test server",
        ],
    );
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName={san}\n")).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
    );
}

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

/// A fresh directory under the system's temp dir.
fn temp_dir(what: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("seckill-{what}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A PostgreSQL binary of the installed server (Debian keeps them off PATH).
fn pg_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin").join(name))
                .collect()
        })
        .unwrap_or_default();
    versions.retain(|p| p.exists());
    versions.sort();
    versions.pop().unwrap_or_else(|| PathBuf::from(name))
}

/// PostgreSQL refuses to run as root: as root, the server's files and process belong to the
/// `postgres` user the Debian package creates.
fn running_as_root() -> bool {
    let out = Command::new("id").arg("-u").output().expect("id runs");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// `program args` as the server's user.
fn as_server_user(program: &Path) -> Command {
    if running_as_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=postgres", "--regid=postgres", "--clear-groups"])
            .arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// A PostgreSQL server of the test's own on a free port: TLS only (`hostssl`, no `host` line),
/// SCRAM passwords, its certificate for `localhost` signed by `ca.pem` in its directory, its
/// superuser `seckill` with password `master-pw`. Stopped (fast shutdown) when dropped.
struct TlsPostgres {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
}

const MASTER_PASSWORD: &str = "master-pw";

impl TlsPostgres {
    fn start() -> Self {
        let dir = temp_dir("tls-pg");
        make_certs(&dir, "DNS:localhost");
        let data = dir.join("data");
        std::fs::write(dir.join("pw"), MASTER_PASSWORD).unwrap();
        if running_as_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the server's directory");
        }
        let initdb = as_server_user(&pg_bin("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "seckill",
                "-E",
                "UTF8",
                "--no-sync",
                "--auth=scram-sha-256",
            ])
            .arg(format!("--pwfile={}", dir.join("pw").display()))
            .stdout(std::process::Stdio::null())
            .output()
            .expect("initdb runs");
        assert!(
            initdb.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        std::fs::write(
            data.join("pg_hba.conf"),
            "hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl all all ::1/128 scram-sha-256\n",
        )
        .unwrap();
        let key = dir.join("server.key");
        let ok = as_server_user(Path::new("chmod"))
            .arg("600")
            .arg(&key)
            .status()
            .unwrap();
        assert!(ok.success(), "chmod the key");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let child = as_server_user(&pg_bin("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=localhost"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .args(["-c", "ssl=on", "-c", "fsync=off"])
            .arg("-c")
            .arg(format!(
                "ssl_cert_file={}",
                dir.join("server.pem").display()
            ))
            .arg("-c")
            .arg(format!("ssl_key_file={}", key.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("postgres.log")).unwrap())
            .spawn()
            .expect("postgres starts");
        let mut me = Self { child, port, dir };
        // Ready once it accepts connections (listening comes earlier, still starting up).
        for _ in 0..200 {
            let ready = Command::new(pg_bin("pg_isready"))
                .args(["-q", "-h", "localhost", "-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return me;
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("postgres exited: {status}\n{}", me.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "postgres did not accept connections on {port}\n{}",
            me.log()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    /// The URL `secrets` builds for `username` / `password`, with `host` for DATABASE_HOST.
    fn url(&self, host: &str, username: &str, password: &str, dbname: &str) -> String {
        let secret = DatabaseSecret::parse(
            &serde_json::json!({
                "username": username, "password": password, "port": self.port, "dbname": dbname
            })
            .to_string(),
        )
        .unwrap();
        secret
            .database_url(Some(host))
            .unwrap()
            .expose()
            .to_string()
    }

    fn ca(&self) -> CaBundle {
        CaBundle::file(self.dir.join("ca.pem"))
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        // SIGINT: fast shutdown, the backends end with the postmaster.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects once with `url` and `ca` as the functions do ([`db::connect_options`]).
async fn connect(url: &str, ca: &CaBundle) -> Result<sqlx::PgConnection, sqlx::Error> {
    db::connect_options(url, ca)
        .expect("options")
        .connect()
        .await
}

/// rustls refused the server's certificate, for `why` (its `CertificateError` variant).
fn assert_refused_certificate(err: &sqlx::Error, why: &str) {
    let text = format!("{err:?}");
    assert!(
        text.contains("InvalidCertificate") && text.contains(why),
        "expected the certificate refused for {why}, got {text}"
    );
}

#[tokio::test]
async fn verify_full_connects_only_with_the_right_ca_and_host_name() -> anyhow::Result<()> {
    let pg = TlsPostgres::start();
    let url = pg.url("localhost", "seckill", MASTER_PASSWORD, "postgres");
    assert!(url.ends_with("sslmode=verify-full"), "{url}");

    let mut conn = connect(&url, &pg.ca()).await?;
    let (ssl, me): (bool, String) = sqlx::query_as(
        "select ssl, current_user::text from pg_stat_ssl where pid = pg_backend_pid()",
    )
    .fetch_one(&mut conn)
    .await?;
    assert_eq!((ssl, me.as_str()), (true, "seckill"));
    conn.close().await?;

    // Another CA of the same name (an impostor's), and the bundle compiled in (AWS's roots),
    // do not vouch for this server.
    let other = temp_dir("tls-other-ca");
    make_certs(&other, "DNS:localhost");
    for (what, ca, why) in [
        (
            "another CA",
            CaBundle::file(other.join("ca.pem")),
            "BadSignature",
        ),
        (
            "the compiled-in bundle",
            CaBundle::default(),
            "UnknownIssuer",
        ),
    ] {
        let err = connect(&url, &ca).await.expect_err(what);
        assert_refused_certificate(&err, why);
    }
    std::fs::remove_dir_all(&other).ok();

    // The right CA, but a name the certificate does not carry: an address, not `localhost`.
    let by_address = pg.url("127.0.0.1", "seckill", MASTER_PASSWORD, "postgres");
    let err = connect(&by_address, &pg.ca())
        .await
        .expect_err("wrong host name");
    assert_refused_certificate(&err, "NotValidForName");

    // What `sslmode=require` (the URL before) accepted: any certificate at all.
    let unchecked = by_address.replace("sslmode=verify-full", "sslmode=require");
    connect(&unchecked, &CaBundle::default())
        .await?
        .close()
        .await?;
    Ok(())
}

/// What `seckill-migrate` does in AWS, over verify-full as the master: the database `seckill`
/// created on `pg` and migrated, and the entry role's password set to `entry_password`.
/// Returns the master's URL of that database and the migration's report.
async fn migrate_with_entry_password(
    pg: &TlsPostgres,
    entry_password: &str,
) -> anyhow::Result<(String, serde_json::Value)> {
    let admin = pg.url("localhost", "seckill", MASTER_PASSWORD, "postgres");
    let mut conn = connect(&admin, &pg.ca()).await?;
    sqlx::raw_sql("create database seckill")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let master = pg.url("localhost", "seckill", MASTER_PASSWORD, "seckill");
    let config = MigrateConfig {
        database_url: Some(master.clone().into()),
        secrets: SecretRefs::default(),
        database_ca: pg.ca(),
        db_acquire_timeout: Duration::from_secs(10),
    };
    let report = seckill_migrate::migrate(&config).await?;
    let secret = RoleSecret::parse(
        &serde_json::json!({"username": "seckill_entry", "password": entry_password}).to_string(),
    )?;
    let options = db::connect_options(&master, &pg.ca())?;
    let set = seckill_migrate::set_role_passwords(options, &[secret]).await?;
    assert_eq!(set, ["seckill_entry"]);
    Ok((master, report))
}

#[tokio::test]
async fn migrate_over_verify_full_sets_a_role_password_that_logs_the_role_in() -> anyhow::Result<()>
{
    let pg = TlsPostgres::start();
    let password = "an-entry-password-from-its-secret";
    let (master, report) = migrate_with_entry_password(&pg, password).await?;
    assert!(report["latest"].as_i64() >= Some(6), "{report}");

    let entry = pg.url("localhost", "seckill_entry", password, "seckill");
    let mut conn = connect(&entry, &pg.ca()).await?;
    let me: String = sqlx::query_scalar("select current_user::text")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(me, "seckill_entry");
    conn.close().await?;
    let wrong = pg.url("localhost", "seckill_entry", "not-its-password", "seckill");
    match connect(&wrong, &pg.ca()).await {
        Err(sqlx::Error::Database(e)) => assert_eq!(e.code().as_deref(), Some("28P01")),
        other => panic!("a wrong password logged in: {other:?}"),
    }
    // The server holds a verifier, never the password.
    let mut conn = connect(&master, &pg.ca()).await?;
    let stored: String =
        sqlx::query_scalar("select rolpassword from pg_authid where rolname = 'seckill_entry'")
            .fetch_one(&mut conn)
            .await?;
    assert!(stored.starts_with("SCRAM-SHA-256$4096:") && !stored.contains(password));
    Ok(())
}

/// How long the test's pool waits for its one connection: longer than the entry role's
/// statement timeout (migrations/0011_role_timeouts.sql), which ends an abandoned statement.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `sql` on `conn` in a task and aborts the task once the server is running it: a
/// borrower cancelled mid-statement (a timeout around its call, a Lambda killed), its
/// connection (or transaction) dropped with the statement still running.
async fn abandon_mid_statement<C>(mut conn: C, sql: &'static str, watch: &mut sqlx::PgConnection)
where
    C: std::ops::DerefMut<Target = sqlx::PgConnection> + Send + 'static,
{
    let borrower = tokio::spawn(async move {
        let _ = sqlx::query(sql).execute(&mut *conn).await;
    });
    let started = std::time::Instant::now();
    loop {
        let running: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where usename = 'seckill_entry' and state = 'active' and query = $1",
        )
        .bind(sql)
        .fetch_one(&mut *watch)
        .await
        .unwrap();
        if running > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the server never ran {sql}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    borrower.abort();
    assert!(borrower.await.is_err_and(|e| e.is_cancelled()));
}

/// A borrower cancelled in the middle of a long statement, alone or inside a transaction,
/// over TLS (as to RDS Proxy): the pool's only connection is lent again before the pool's
/// acquire timeout, in a session outside any transaction, twenty times in a row. The
/// server's statement timeout for the role ends the abandoned statement, and the release
/// check then hands the connection back or closes it gracefully; it never turns the
/// abandoned statement's error into a hard close, which over rustls waits for a byte the
/// idle server never sends, holding the slot for good.
#[tokio::test]
async fn a_borrower_cancelled_mid_statement_gives_the_tls_connection_back() -> anyhow::Result<()> {
    let pg = TlsPostgres::start();
    let password = "an-entry-password-from-its-secret";
    let (master, _) = migrate_with_entry_password(&pg, password).await?;
    let mut watch = connect(&master, &pg.ca()).await?;
    let entry = pg.url("localhost", "seckill_entry", password, "seckill");
    let pool = db::pool_options()
        .max_connections(1)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(db::connect_options(&entry, &pg.ca())?)
        .await?;
    let lent_again = |what: String| {
        let pool = pool.clone();
        async move {
            let asked = std::time::Instant::now();
            let mut conn = match pool.acquire().await {
                Ok(conn) => conn,
                Err(e) => panic!(
                    "{what}: no connection after {:?} ({e}); the abandoned statement holds \
                     the slot",
                    asked.elapsed()
                ),
            };
            // One simple-protocol statement: outside a transaction block it is the whole
            // implicit transaction, so `now()` (the transaction's start) is its own start.
            let in_transaction: bool = sqlx::raw_sql("select now() <> statement_timestamp()")
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| sqlx::Row::try_get(&row, 0))
                .unwrap_or_else(|e| panic!("{what}: the connection lent again fails: {e}"));
            assert!(!in_transaction, "{what}: lent inside a transaction");
        }
    };
    for round in 1..=20 {
        let conn = pool.acquire().await?;
        abandon_mid_statement(conn, "select pg_sleep(30)", &mut watch).await;
        lent_again(format!("round {round}, a statement")).await;

        let tx = pool.begin().await?;
        abandon_mid_statement(tx, "select pg_sleep(31)", &mut watch).await;
        lent_again(format!("round {round}, a statement in a transaction")).await;
    }
    Ok(())
}

/// A server that has never seen the functions' roles, eight databases migrated at once (as
/// the tests and several stacks' deploys do): every migration succeeds, although each creates
/// the cluster-wide roles and sets their bounds at the same moment, and each role ends with
/// the bounds `migrations/0011_role_timeouts.sql` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_databases_migrated_at_once_on_a_new_server_share_one_set_of_role_bounds(
) -> anyhow::Result<()> {
    let pg = TlsPostgres::start();
    let admin = pg.url("localhost", "seckill", MASTER_PASSWORD, "postgres");
    let mut conn = connect(&admin, &pg.ca()).await?;
    let names: Vec<String> = (0..8).map(|i| format!("seckill_{i}")).collect();
    for name in &names {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
            .execute(&mut conn)
            .await?;
    }
    let migrations = names.iter().map(|name| {
        let config = MigrateConfig {
            database_url: Some(pg.url("localhost", "seckill", MASTER_PASSWORD, name).into()),
            secrets: SecretRefs::default(),
            database_ca: pg.ca(),
            db_acquire_timeout: Duration::from_secs(10),
        };
        async move { seckill_migrate::migrate(&config).await }
    });
    for (name, migrated) in names
        .iter()
        .zip(futures::future::join_all(migrations).await)
    {
        migrated.unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
    let rows: Vec<(String, i32, Vec<String>)> = sqlx::query_as(
        "select rolname::text, rolconnlimit, coalesce(rolconfig, '{}') from pg_roles
         where rolname like 'seckill\\_%' order by 1",
    )
    .fetch_all(&mut conn)
    .await?;
    let mut want = db::ROLES.to_vec();
    want.sort_unstable();
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        want,
        "{rows:?}"
    );
    for (role, limit, config) in &rows {
        assert!(*limit > 0, "{role}: no connection limit");
        for setting in ["statement_timeout=", "idle_in_transaction_session_timeout="] {
            assert_eq!(
                config.iter().filter(|c| c.starts_with(setting)).count(),
                1,
                "{role}: {config:?}"
            );
        }
    }
    Ok(())
}
