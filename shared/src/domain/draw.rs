//! What the database keeps of a draw sale's draw: its entries (written by the consumer from
//! the entry messages), and its outcome (the cutoff and the winners, written before the first
//! winner is sent). A load from scratch rebuilds the pool from them. docs/invariants.md, "Draw
//! admission", "What the database keeps".

use crate::domain::status::FailureReason;
use sqlx::{PgConnection, PgExecutor, PgPool};
use uuid::Uuid;

/// One entry of a draw, or one of its winners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub request_id: Uuid,
    pub user_id: String,
    pub quantity: i64,
}

/// A sale's entry as the load's rebuild reads it: with its row id, the rebuild's cursor, and
/// whether it goes back into the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryRow {
    pub id: i64,
    pub entry: Entry,
    /// A live entry: see [`entries_after`].
    pub live: bool,
    /// Put back into the pool only once the draw had begun ([`mark_late`]).
    pub late: bool,
}

/// Marks the entries `request_ids` of sale `activity_id` late: put back into its pool only
/// once the draw had begun, which could not look at them.
pub async fn mark_late(
    db: impl PgExecutor<'_>,
    activity_id: i64,
    request_ids: &[Uuid],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update draw_entries set late = true where activity_id = $1 and request_id = any($2)",
        activity_id,
        request_ids
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Writes the entries of sale `activity_id` (once per request id; one whose request was
/// claimed, i.e. answered 503, is not written), in the caller's transaction, and answers
/// those of them the database holds as live entries (written now or before, not claimed):
/// the ones whose pool entry the caller makes sure of.
pub async fn insert_entries(
    conn: &mut PgConnection,
    activity_id: i64,
    entries: &[Entry],
) -> Result<Vec<Uuid>, sqlx::Error> {
    let ids: Vec<Uuid> = entries.iter().map(|e| e.request_id).collect();
    let users: Vec<String> = entries.iter().map(|e| e.user_id.clone()).collect();
    let quantities: Vec<i64> = entries.iter().map(|e| e.quantity).collect();
    sqlx::query!(
        "insert into draw_entries (activity_id, user_id, request_id, quantity)
         select $1, e.user_id, e.request_id, e.quantity
         from unnest($2::uuid[], $3::text[], $4::bigint[]) as e(request_id, user_id, quantity)
         where not exists (select 1 from orders o where o.request_id = e.request_id)
         on conflict (request_id) do nothing",
        activity_id,
        &ids,
        &users,
        &quantities
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query_scalar!(
        r#"select d.request_id as "request_id!" from draw_entries d
           where d.request_id = any($1::uuid[]) and d.activity_id = $2
             and not exists (select 1 from orders o where o.request_id = d.request_id)"#,
        &ids,
        activity_id
    )
    .fetch_all(&mut *conn)
    .await
}

/// The newest live entry of `user_id` in sale `activity_id` other than request `except` (kept,
/// no order row for its request, the user holding no live order in the sale), and whether it
/// is kept late: what stands for the user once `except`, a newer entry answered 503, is taken
/// out of the pool. One index range (`draw_entries_by_user`).
pub async fn other_live_entry(
    db: &PgPool,
    activity_id: i64,
    user_id: &str,
    except: Uuid,
) -> Result<Option<(Entry, bool)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"select d.request_id as "request_id!", d.quantity as "quantity!", d.late as "late!"
           from draw_entries d
           where d.activity_id = $1 and d.user_id = $2 and d.request_id <> $3
             and not exists (select 1 from orders o where o.request_id = d.request_id)
             and not exists (
               select 1 from orders o
               where o.activity_id = d.activity_id and o.user_id = d.user_id
                 and order_is_live(o.status))
           order by d.id desc
           limit 1"#,
        activity_id,
        user_id,
        except
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| {
        let entry = Entry {
            request_id: r.request_id,
            user_id: user_id.to_string(),
            quantity: r.quantity,
        };
        (entry, r.late)
    }))
}

/// The next `limit` entries of sale `activity_id` after row `after`, in row order, each with
/// whether it is **live**. An entry whose request has an order row (a claim after a 503, or a
/// winner's order) is not, nor is one whose user holds a live order in the sale or has a newer
/// live entry (she entered again, after a 503 or while Redis had lost the sale): one entry per
/// user goes back. The page is taken by the index first and each of its rows checked on its
/// own (index lookups), so a read costs the page, whatever the sale's size. The planner may
/// only use indexes here: with the statistics of a table that just grew by a million rows (not
/// analyzed yet) it would otherwise read every entry after the cursor for each page, a
/// bitmap or sequential scan and a sort, making the rebuild quadratic in the pool's size.
pub async fn entries_after(
    db: &PgPool,
    activity_id: i64,
    after: i64,
    limit: i64,
) -> Result<Vec<EntryRow>, sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query("set local enable_seqscan = off")
        .execute(&mut *tx)
        .await?;
    sqlx::query("set local enable_bitmapscan = off")
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query!(
        r#"with page as materialized (
             select d.id, d.activity_id, d.user_id, d.request_id, d.quantity, d.late
             from draw_entries d
             where d.activity_id = $1 and d.id > $2
             order by d.id
             limit $3
           )
           select p.id as "id!", p.user_id as "user_id!", p.request_id as "request_id!",
                  p.quantity as "quantity!", p.late as "late!",
                  (not exists (select 1 from orders o where o.request_id = p.request_id)
                   and not exists (
                     select 1 from orders o
                     where o.activity_id = p.activity_id and o.user_id = p.user_id
                       and order_is_live(o.status))
                   and not exists (
                     select 1 from draw_entries n
                     where n.activity_id = p.activity_id and n.user_id = p.user_id
                       and n.id > p.id
                       and not exists (select 1 from orders o where o.request_id = n.request_id))
                  ) as "live!"
           from page p
           order by p.id"#,
        activity_id,
        after,
        limit
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .map(|r| EntryRow {
            id: r.id,
            entry: Entry {
                request_id: r.request_id,
                user_id: r.user_id,
                quantity: r.quantity,
            },
            live: r.live,
            late: r.late,
        })
        .collect())
}

/// The recorded outcome's cutoff of sale `activity_id` (`None`: its draw is not recorded).
pub async fn outcome(
    db: impl PgExecutor<'_>,
    activity_id: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "select cutoff from draw_outcomes where activity_id = $1",
        activity_id
    )
    .fetch_optional(db)
    .await
}

/// The recorded winners of sale `activity_id` whose request has no order row yet: their units
/// are the draw's, not the stock's, until their order commits (or a claim fails it).
pub async fn winners_without_order(
    db: impl PgExecutor<'_>,
    activity_id: i64,
) -> Result<Vec<Entry>, sqlx::Error> {
    let rows = sqlx::query!(
        "select w.request_id, w.user_id, w.quantity from draw_winners w
         where w.activity_id = $1
           and not exists (select 1 from orders o where o.request_id = w.request_id)
         order by w.request_id",
        activity_id
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Entry {
            request_id: r.request_id,
            user_id: r.user_id,
            quantity: r.quantity,
        })
        .collect())
}

/// The units a load from scratch of sale `activity_id` may sell: the database's remaining
/// stock less the units of the recorded winners whose order is not written yet, in one
/// statement (one snapshot: a winner's order commits with its stock update, so it is counted
/// on exactly one side).
pub async fn stock_to_load(
    db: impl PgExecutor<'_>,
    activity_id: i64,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select a.remaining_stock - coalesce((
             select sum(w.quantity) from draw_winners w
             where w.activity_id = a.id
               and not exists (select 1 from orders o where o.request_id = w.request_id)
           ), 0)::bigint as "stock!"
           from activities a where a.id = $1"#,
        activity_id
    )
    .fetch_optional(db)
    .await
}

/// The units of sale `activity_id`'s recorded winners whose order is not written yet: held by
/// the draw's record, so neither a load's stock nor an admin's lower may count them as
/// unsold.
pub async fn held_units(db: impl PgExecutor<'_>, activity_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select coalesce(sum(w.quantity), 0)::bigint as "held!" from draw_winners w
           where w.activity_id = $1
             and not exists (select 1 from orders o where o.request_id = w.request_id)"#,
        activity_id
    )
    .fetch_one(db)
    .await
}

/// What [`record`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The outcome is in the database now, as Redis holds it.
    New,
    /// It was there already, with these winners among its own (a drainer before this one, or
    /// a draw run again on the same pool after Redis lost its mark: the same tickets pick the
    /// same winners).
    Same,
    /// It was there already and these winners are not all in it: Redis holds a draw that is
    /// not the recorded one. Nothing was written; nothing may be sent.
    Diverged { unrecorded: usize },
    /// The sale was loaded from scratch since the draw ran (the load epoch moved): that draw is
    /// gone with the Redis that held it. Nothing was written.
    Stale,
}

/// Winners one statement of [`record`] inserts (or checks, for a second record): about 50 ms
/// of server time, so that a record of 10⁵ winners is twenty bounded statements.
pub const RECORD_STATEMENT: usize = 5000;

/// Records the outcome of sale `activity_id`'s draw (its `cutoff` and `winners`), run under
/// load `epoch`, in one transaction of statements of [`RECORD_STATEMENT`] winners each. Only
/// while the sale's load epoch is still `epoch`, read under a share lock: a load from scratch
/// bumps it before it reads what is recorded, so it either waits for this commit and loads
/// the outcome, or came first and this draw is not recorded. A sale's outcome is written once
/// (a second record waits on the first's row, then only checks that its winners are the
/// first's).
pub async fn record(
    db: &PgPool,
    activity_id: i64,
    epoch: i64,
    cutoff: &str,
    winners: &[Entry],
) -> Result<Recorded, sqlx::Error> {
    let mut tx = db.begin().await?;
    let current = sqlx::query_scalar!(
        "select load_epoch from activities where id = $1 for share",
        activity_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    if current != Some(epoch) {
        return Ok(Recorded::Stale);
    }
    let units: i64 = winners.iter().map(|w| w.quantity).sum();
    let inserted = sqlx::query!(
        "insert into draw_outcomes (activity_id, cutoff, winners, units)
         values ($1, $2, $3, $4)
         on conflict (activity_id) do nothing",
        activity_id,
        cutoff,
        winners.len() as i64,
        units
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        let mut unrecorded = 0;
        for part in winners.chunks(RECORD_STATEMENT) {
            let ids: Vec<Uuid> = part.iter().map(|w| w.request_id).collect();
            let known = sqlx::query_scalar!(
                r#"select count(*) as "n!" from draw_winners
                   where activity_id = $1 and request_id = any($2::uuid[])"#,
                activity_id,
                &ids
            )
            .fetch_one(&mut *tx)
            .await?;
            unrecorded += ids.len().saturating_sub(known as usize);
        }
        return Ok(if unrecorded == 0 {
            Recorded::Same
        } else {
            Recorded::Diverged { unrecorded }
        });
    }
    for part in winners.chunks(RECORD_STATEMENT) {
        let ids: Vec<Uuid> = part.iter().map(|w| w.request_id).collect();
        let users: Vec<String> = part.iter().map(|w| w.user_id.clone()).collect();
        let quantities: Vec<i64> = part.iter().map(|w| w.quantity).collect();
        sqlx::query!(
            "insert into draw_winners (request_id, activity_id, user_id, quantity)
             select w.request_id, $1, w.user_id, w.quantity
             from unnest($2::uuid[], $3::text[], $4::bigint[]) as w(request_id, user_id, quantity)",
            activity_id,
            &ids,
            &users,
            &quantities
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Recorded::New)
}

/// What one [`write_orders`] chunk did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// The outcome is not recorded: nothing was written.
    pub unrecorded: bool,
    /// Winners whose `confirmed` order this chunk inserted, their units taken from the stock.
    pub ordered: Vec<Entry>,
    /// Winners of the chunk whose request held an order row already (a claim after a 503, a
    /// give-back), or whose user held another live order (this chunk claimed the request
    /// `failed / already_purchased`): the caller applies each one's row.
    pub skipped: Vec<Entry>,
    /// Every recorded winner has its order row now (or had before this call).
    pub done: bool,
}

/// Writes the orders of the next `limit` recorded winners of sale `activity_id` after the
/// outcome's cursor, in one transaction: the outcome's row locked (a second writer waits,
/// then goes on from where this one left), the page read by the index, one `confirmed` order
/// per winner whose request and user hold none (the request id is the claim), one update of
/// the sale's stock by their units (held by the record since the draw: a winner's order
/// commits under any load epoch), a `failed / already_purchased` claim for each winner whose
/// user holds another live order (so that every winner has its row when the cursor passes
/// it), and the cursor moved past the page; the chunk that finds fewer than `limit` winners
/// after it marks the orders written.
pub async fn write_orders(
    db: &PgPool,
    activity_id: i64,
    limit: i64,
) -> Result<Written, sqlx::Error> {
    let mut tx = db.begin().await?;
    let Some(at) = sqlx::query!(
        "select written_after, written_at from draw_outcomes where activity_id = $1 for update",
        activity_id
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(Written {
            unrecorded: true,
            ..Written::default()
        });
    };
    if at.written_at.is_some() {
        return Ok(Written {
            done: true,
            ..Written::default()
        });
    }
    let page: Vec<Entry> = sqlx::query!(
        "select request_id, user_id, quantity from draw_winners
         where activity_id = $1 and ($2::uuid is null or request_id > $2)
         order by request_id
         limit $3",
        activity_id,
        at.written_after,
        limit
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| Entry {
        request_id: r.request_id,
        user_id: r.user_id,
        quantity: r.quantity,
    })
    .collect();
    let ids: Vec<Uuid> = page.iter().map(|w| w.request_id).collect();
    let users: Vec<String> = page.iter().map(|w| w.user_id.clone()).collect();
    let quantities: Vec<i64> = page.iter().map(|w| w.quantity).collect();
    // No conflict target: a request that has a row and a user who holds a live order are
    // both passed over here, and told apart by the caller.
    let inserted: std::collections::HashSet<Uuid> = sqlx::query_scalar!(
        r#"insert into orders (request_id, activity_id, user_id, quantity, status,
                                unit_price_minor, currency)
           select w.request_id, a.id, w.user_id, w.quantity, 'confirmed', a.price_minor, a.currency
           from unnest($2::uuid[], $3::text[], $4::bigint[]) as w(request_id, user_id, quantity)
           join activities a on a.id = $1
           on conflict do nothing
           returning request_id"#,
        activity_id,
        &ids,
        &users,
        &quantities
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let (ordered, skipped): (Vec<Entry>, Vec<Entry>) = page
        .iter()
        .cloned()
        .partition(|w| inserted.contains(&w.request_id));
    if !skipped.is_empty() {
        let ids: Vec<Uuid> = skipped.iter().map(|w| w.request_id).collect();
        let users: Vec<String> = skipped.iter().map(|w| w.user_id.clone()).collect();
        let quantities: Vec<i64> = skipped.iter().map(|w| w.quantity).collect();
        sqlx::query!(
            "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
             select w.request_id, $1, w.user_id, w.quantity, 'failed', $5
             from unnest($2::uuid[], $3::text[], $4::bigint[]) as w(request_id, user_id, quantity)
             on conflict (request_id) do nothing",
            activity_id,
            &ids,
            &users,
            &quantities,
            FailureReason::AlreadyPurchased.as_str()
        )
        .execute(&mut *tx)
        .await?;
    }
    let units: i64 = ordered.iter().map(|w| w.quantity).sum();
    if units > 0 {
        sqlx::query!(
            "update activities set remaining_stock = remaining_stock - $2, updated_at = now()
             where id = $1",
            activity_id,
            units
        )
        .execute(&mut *tx)
        .await?;
    }
    let done = (page.len() as i64) < limit;
    sqlx::query!(
        "update draw_outcomes
         set written_after = coalesce($2, written_after),
             written_at = case when $3 then now() end
         where activity_id = $1",
        activity_id,
        page.last().map(|w| w.request_id),
        done
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Written {
        unrecorded: false,
        ordered,
        skipped,
        done,
    })
}

/// Whether every recorded winner of sale `activity_id` has its order row (`None`: its draw is
/// not recorded).
pub async fn orders_written(
    db: impl PgExecutor<'_>,
    activity_id: i64,
) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select written_at is not null as "written!" from draw_outcomes where activity_id = $1"#,
        activity_id
    )
    .fetch_optional(db)
    .await
}
