//! The entry over HTTP on the dev server's app (the same authorizer middleware and routers
//! `make serve` runs): purchases against a trivial route behind the same middleware, and the
//! public view against the sold-out flood, with the database transactions the view caused.

use super::fixture::{Bench, Measure, PublicView, Sizes, BODY};
use crate::strategies::open_activity;
use crate::util::{self, Outcome};
use axum::routing::get;
use axum::Router;
use seckill_shared::http::auth::{mint, JwtVerifier, USER_SCOPE};
use seckill_shared::store::conn::Redis;
use std::sync::Arc;
use std::time::Duration;

/// The dev server's app (the same authorizer middleware and routers `make serve` runs) on
/// 127.0.0.1:0, plus a trivial route behind the same middleware.
pub(crate) async fn http(
    b: &Bench,
    activity_id: i64,
    user_count: usize,
    sizes: &Sizes,
) -> anyhow::Result<(Measure, Measure)> {
    let secret = "bench-secret-local-only";
    let functions = seckill_devserver::Functions::connect(&b.config).await?;
    let noop = Router::new().route("/bench/noop", get(|| async { "ok" }));
    let app = seckill_devserver::app(
        functions.entry.clone().merge(noop),
        functions.admin.clone(),
        JwtVerifier::new(secret)?,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let token_count = user_count.min(2_000);
    let tokens: Arc<Vec<String>> = Arc::new(
        b.users[..token_count]
            .iter()
            .map(|u| mint(secret, u, USER_SCOPE, 3600))
            .collect::<anyhow::Result<_>>()?,
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(sizes.concurrency)
        .build()?;
    let c = sizes.concurrency;

    let entry_url = Arc::new(format!("http://{addr}/activities/{activity_id}/orders"));
    let (client, t) = (http.clone(), tokens.clone());
    let mut admin = b.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let run = util::run_tasks(c, sizes.http, move |i| {
        let (client, t, url) = (client.clone(), t.clone(), entry_url.clone());
        async move {
            let r = client
                .post(url.as_str())
                .bearer_auth(&t[i % t.len()])
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await;
            match r {
                Ok(resp) if resp.status().as_u16() == 409 => {
                    let _ = resp.bytes().await;
                    Outcome::Refused
                }
                Ok(resp) => Outcome::Error(format!("status {}", resp.status())),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let after = util::commandstats(&mut admin).await?;
    let entry = Measure::from_run(
        "HTTP dev server: POST orders (already_purchased)",
        &run,
        c,
        Some(util::commands_between(&before, &after)),
    );

    let noop_url = Arc::new(format!("http://{addr}/bench/noop"));
    let (client, t) = (http.clone(), tokens.clone());
    let run = util::run_tasks(c, sizes.http, move |i| {
        let (client, t, url) = (client.clone(), t.clone(), noop_url.clone());
        async move {
            match client
                .get(url.as_str())
                .bearer_auth(&t[i % t.len()])
                .send()
                .await
            {
                Ok(resp) if resp.status().is_success() => {
                    let _ = resp.bytes().await;
                    Outcome::Refused
                }
                Ok(resp) => Outcome::Error(format!("status {}", resp.status())),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let trivial = Measure::from_run("HTTP dev server: trivial route (same auth)", &run, c, None);
    server.abort();
    Ok((entry, trivial))
}

/// The dev server's app on 127.0.0.1:0 (its own functions, pools and key prefix): the sold-out
/// flood on a sale loaded with no stock, then the public view of a running sale the database
/// and Redis both hold, each `sizes.http` requests at the same concurrency. The view row's database transactions are read from
/// `pg_stat_database` before it and after the server and its pools are gone (a backend reports
/// its counts when idle at most once a second, and at exit), until the figure settles.
pub(crate) async fn public_view(b: &Bench, sizes: &Sizes) -> anyhow::Result<PublicView> {
    // A database of the row's own: its transaction count is the app's alone, not the
    // autovacuum that the earlier sections' writes set off in the bench's database.
    let (database_url, pool) = testkit::fresh_database().await?;
    let measured = public_view_on(b, sizes, &database_url, &pool).await;
    pool.close().await;
    crate::util::drop_database(&database_url).await?;
    measured
}

async fn public_view_on(
    b: &Bench,
    sizes: &Sizes,
    database_url: &str,
    pool: &sqlx::PgPool,
) -> anyhow::Result<PublicView> {
    let secret = "bench-secret-local-only";
    let row = seckill_shared::domain::activity::insert(
        pool,
        &testkit::new_activity()
            .title("bench public view")
            .stock(1_000_000)
            .limit(1)
            .build()
            .settings()?,
    )
    .await?;
    let mut config = b.config.clone();
    config.key_prefix = util::fresh_prefix();
    config.database_url = database_url.into();
    let redis = Redis::connect(&config).await?;
    let buffer = Duration::from_secs(3600);
    testkit::load_without_db(&redis, &row, buffer).await?;
    // A sale Redis holds and the database does not, so its id cannot be a row's.
    let sold_out_id = row.id + 1_000_000;
    testkit::load_without_db(&redis, &open_activity(sold_out_id, 0), buffer).await?;
    let functions = seckill_devserver::Functions::connect(&config).await?;
    let app = seckill_devserver::app(
        functions.entry.clone(),
        functions.admin.clone(),
        JwtVerifier::new(secret)?,
    );
    drop(functions);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let tokens: Arc<Vec<String>> = Arc::new(
        b.users[..b.users.len().min(2_000)]
            .iter()
            .map(|u| mint(secret, u, USER_SCOPE, 3600))
            .collect::<anyhow::Result<_>>()?,
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(sizes.concurrency)
        .build()?;
    let c = sizes.concurrency;

    let url = Arc::new(format!("http://{addr}/activities/{sold_out_id}/orders"));
    let (client, t) = (http.clone(), tokens.clone());
    let run = util::run_tasks(c, sizes.http, move |i| {
        let (client, t, url) = (client.clone(), t.clone(), url.clone());
        async move {
            let r = client
                .post(url.as_str())
                .bearer_auth(&t[i % t.len()])
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await;
            expect_status(r, 409).await
        }
    })
    .await;
    let sold_out = Measure::from_run(
        "HTTP dev server: POST orders (sold out, cache warm)",
        &run,
        c,
        None,
    );

    // Settled first: the backends that migrated the database and connected the functions report
    // their transactions up to a second late.
    let mut count = TransactionCount::new(database_url);
    let before = count.settled().await?;
    let url = Arc::new(format!("http://{addr}/activities/{}", row.id));
    let client = http.clone();
    let run = util::run_tasks(c, sizes.http, move |_| {
        let (client, url) = (client.clone(), url.clone());
        async move { expect_status(client.get(url.as_str()).send().await, 200).await }
    })
    .await;
    let view = Measure::from_run("HTTP dev server: GET activity (public view)", &run, c, None);
    let after_view = count.settled().await?;

    // Anonymous load on ids no sale has: each a different id above the highest one.
    let base = Arc::new(format!("http://{addr}/activities/"));
    let (client, first_unknown) = (http.clone(), row.id + 1);
    let run = util::run_tasks(c, sizes.http, move |i| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let url = format!("{base}{}", first_unknown + i as i64);
            expect_status(client.get(url).send().await, 404).await
        }
    })
    .await;
    let unknown = Measure::from_run(
        "HTTP dev server: GET activity (distinct unknown ids)",
        &run,
        c,
        None,
    );
    server.abort();
    let _ = server.await;
    drop(http);
    let after = count.settled().await?;
    let mut con = b.admin.clone();
    util::delete_prefix(&mut con, &config.key_prefix).await?;
    let db_transactions = (after_view - before).max(0);
    let unknown_db_transactions = (after - after_view).max(0);
    eprintln!(
        "  public view: {db_transactions} database transactions for {} requests; \
         {unknown_db_transactions} for {} requests of distinct unknown ids",
        view.attempts, unknown.attempts
    );
    Ok(PublicView {
        view_vs_sold_out: view.per_s / sold_out.per_s,
        db_transactions_per_request: db_transactions as f64 / view.attempts as f64,
        db_transactions,
        unknown_db_transactions_per_request: unknown_db_transactions as f64
            / unknown.attempts.max(1) as f64,
        unknown_db_transactions,
        view,
        sold_out,
        unknown,
    })
}

async fn expect_status(r: reqwest::Result<reqwest::Response>, want: u16) -> Outcome {
    match r {
        Ok(resp) if resp.status().as_u16() == want => {
            let _ = resp.bytes().await;
            Outcome::Refused
        }
        Ok(resp) => Outcome::Error(format!("status {}", resp.status())),
        Err(e) => Outcome::Error(e.to_string()),
    }
}

/// `xact_commit + xact_rollback` of one database, less the transactions of its own reads
/// (each read is one transaction, on a connection of its own).
struct TransactionCount<'a> {
    url: &'a str,
    own_reads: i64,
}

impl<'a> TransactionCount<'a> {
    fn new(url: &'a str) -> Self {
        Self { url, own_reads: 0 }
    }

    async fn read(&mut self) -> anyhow::Result<i64> {
        use sqlx::Connection;
        let mut con = sqlx::PgConnection::connect(self.url).await?;
        let (n,): (i64,) = sqlx::query_as(
            "select (xact_commit + xact_rollback)::bigint from pg_stat_database
             where datname = current_database()",
        )
        .fetch_one(&mut con)
        .await?;
        con.close().await?;
        // The reads before this one have been counted by now (a backend reports at exit);
        // this one's own transaction is not yet in `n`, and is taken off the next reads.
        let count = n - self.own_reads;
        self.own_reads += 1;
        Ok(count)
    }

    /// The count once two reads a second apart agree (at most ~12 s): backends report their
    /// counts when idle, at most once a second, and at exit.
    async fn settled(&mut self) -> anyhow::Result<i64> {
        let mut last = self.read().await?;
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            let now = self.read().await?;
            if now == last {
                return Ok(now);
            }
            last = now;
        }
        Ok(last)
    }
}
