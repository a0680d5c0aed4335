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
//!
//! Here the certificates and a private PostgreSQL server with TLS; Redis over TLS in [`redis_tls`],
//! PostgreSQL over TLS in [`postgres`].

mod postgres;
mod redis_tls;

use seckill_shared::infra::aws_secrets::DatabaseSecret;
use seckill_shared::infra::db;
use seckill_shared::infra::db::CaBundle;
use sqlx::ConnectOptions;
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
