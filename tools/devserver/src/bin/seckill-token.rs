//! `seckill-token --user alice [--admin] [--ttl-secs N]`: prints a dev JWT for curl.
//! `seckill-token --users N --prefix u`: prints N user tokens (`u0` .. `u<N-1>`), one a line,
//! for a load tool that needs a distinct buyer per request (`make wrk-check`).
//!
//! Signed with `SECKILL_JWT_SECRET` (HS256), exactly what the dev server verifies. Its `scope`
//! is what the user pool issues (`issued_scope`): `seckill:user`, and `seckill:user
//! seckill:admin` with `--admin`; `--scope ''` mints one without any, to see the 403 the user
//! routes answer it, locally as on AWS.

use clap::Parser;
use seckill_shared::http::auth::{issued_scope, mint};
use std::io::{BufWriter, Write};

/// Prints a token the local dev server accepts, or many.
#[derive(Parser, Debug)]
#[command(name = "seckill-token", version, about)]
struct Args {
    /// The user id (the token's `sub`).
    #[arg(long, default_value = "alice", conflicts_with = "users")]
    user: String,
    /// Bulk mode: this many tokens, for the users `<prefix>0` .. `<prefix><N-1>`, one a line.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    users: Option<u32>,
    /// The user ids' prefix in bulk mode.
    #[arg(long, default_value = "user-", requires = "users")]
    prefix: String,
    /// Grant the admin scope too (`seckill:user seckill:admin`).
    #[arg(long)]
    admin: bool,
    /// The `scope` claim exactly, instead of what the pool issues (`--scope ''`: none).
    #[arg(long, conflicts_with = "admin")]
    scope: Option<String>,
    /// Lifetime of the token in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    ttl_secs: u64,
    /// The HS256 secret; the dev server's default is in scripts/env.sh.
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true)]
    secret: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scope = args.scope.unwrap_or_else(|| issued_scope(args.admin));
    let scope = scope.as_str();
    let mut out = BufWriter::new(std::io::stdout().lock());
    match args.users {
        None => writeln!(
            out,
            "{}",
            mint(&args.secret, &args.user, scope, args.ttl_secs)?
        )?,
        Some(n) => {
            for i in 0..n {
                let user = format!("{}{i}", args.prefix);
                writeln!(out, "{}", mint(&args.secret, &user, scope, args.ttl_secs)?)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}
