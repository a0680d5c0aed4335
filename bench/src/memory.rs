//! Redis memory per participant: the users hash (user -> request id) and the
//! pending-reservation ledger of one activity for N users, loaded by pipelined variadic HSETs
//! of the exact fields `purchase.lua` writes (a uuid v7 request id; a ledger entry
//! `r|<requestId>|<qty>|<reservedAtMs>`), then `MEMORY USAGE ... SAMPLES 0`.

use crate::util;
use redis::aio::MultiplexedConnection;
use seckill_shared::store::keys::Keys;
use seckill_shared::store::values::{EntryKind, LedgerEntry};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRow {
    pub users: usize,
    /// How user ids look (`user-0000001`, or a 36-character UUID as Cognito `sub`s are).
    pub id_format: &'static str,
    pub user_set_bytes: u64,
    pub user_set_encoding: String,
    pub ledger_bytes: u64,
    pub ledger_encoding: String,
    pub user_set_bytes_per_participant: f64,
    pub ledger_bytes_per_participant: f64,
    /// Both keys: every participant while all reservations are still pending.
    pub bytes_per_participant: f64,
}

pub async fn measure(
    con: &mut MultiplexedConnection,
    n: usize,
    uuid_ids: bool,
) -> anyhow::Result<MemoryRow> {
    let prefix = util::fresh_prefix();
    let k = Keys::new(&prefix, 1);
    let now_ms = chrono::Utc::now().timestamp_millis();
    let chunk = 1000;
    let mut i = 0;
    while i < n {
        let end = (i + chunk).min(n);
        let ids: Vec<String> = (i..end)
            .map(|j| {
                if uuid_ids {
                    uuid::Uuid::new_v4().to_string()
                } else {
                    format!("user-{j:07}")
                }
            })
            .collect();
        let mut pipe = redis::pipe();
        let mut users = redis::cmd("HSET");
        users.arg(&k.users);
        for id in &ids {
            users.arg(id).arg(uuid::Uuid::now_v7().to_string());
        }
        pipe.add_command(users).ignore();
        let mut hset = redis::cmd("HSET");
        hset.arg(&k.ledger);
        for id in &ids {
            let reservation = LedgerEntry {
                user_id: id.clone(),
                kind: EntryKind::Reservation,
                id: uuid::Uuid::now_v7().to_string(),
                quantity: 1,
                at_ms: now_ms,
                order_id: None,
                transfer: None,
            };
            hset.arg(id).arg(reservation.to_string());
        }
        pipe.add_command(hset).ignore();
        let _: () = pipe.query_async(con).await?;
        i = end;
    }
    let usage = |key: &str| {
        let mut c = redis::cmd("MEMORY");
        c.arg("USAGE").arg(key).arg("SAMPLES").arg(0);
        c
    };
    let user_set_bytes: u64 = usage(&k.users).query_async(con).await?;
    let ledger_bytes: u64 = usage(&k.ledger).query_async(con).await?;
    let encoding = |key: &str| {
        let mut c = redis::cmd("OBJECT");
        c.arg("ENCODING").arg(key);
        c
    };
    let user_set_encoding: String = encoding(&k.users).query_async(con).await?;
    let ledger_encoding: String = encoding(&k.ledger).query_async(con).await?;
    util::delete_prefix(con, &prefix).await?;
    let row = MemoryRow {
        users: n,
        id_format: if uuid_ids {
            "uuid (36 chars)"
        } else {
            "user-0000001 (12 chars)"
        },
        user_set_bytes,
        user_set_encoding,
        ledger_bytes,
        ledger_encoding,
        user_set_bytes_per_participant: user_set_bytes as f64 / n as f64,
        ledger_bytes_per_participant: ledger_bytes as f64 / n as f64,
        bytes_per_participant: (user_set_bytes + ledger_bytes) as f64 / n as f64,
    };
    eprintln!(
        "  {:>9} users, {:<24} set {:>6.1} B + ledger {:>6.1} B = {:>6.1} B/participant",
        n,
        row.id_format,
        row.user_set_bytes_per_participant,
        row.ledger_bytes_per_participant,
        row.bytes_per_participant
    );
    Ok(row)
}
