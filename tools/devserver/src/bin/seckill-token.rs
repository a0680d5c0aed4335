//! `seckill-token --user alice [--admin] [--ttl-secs N]`: prints a dev JWT for curl.
//!
//! Signed with `SECKILL_JWT_SECRET` (HS256), exactly what the dev server verifies.

use clap::Parser;
use seckill_shared::auth::{mint, ADMIN_SCOPE};

/// Prints a token the local dev server accepts.
#[derive(Parser, Debug)]
#[command(name = "seckill-token", version, about)]
struct Args {
    /// The user id (the token's `sub`).
    #[arg(long, default_value = "alice")]
    user: String,
    /// Grant the admin scope (`seckill:admin`).
    #[arg(long)]
    admin: bool,
    /// Lifetime of the token in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    ttl_secs: u64,
    /// The HS256 secret; the dev server's default is in scripts/env.sh.
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true)]
    secret: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scope = if args.admin { ADMIN_SCOPE } else { "" };
    println!("{}", mint(&args.secret, &args.user, scope, args.ttl_secs)?);
    Ok(())
}
