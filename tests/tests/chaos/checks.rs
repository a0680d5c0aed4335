//! The checks at quiescence, per sale: the books (the kit's invariant checker), an empty ledger,
//! the draw's outcomes, every 202 resolved, and no order behind any other answer.

use crate::world::{lock, Attempt, Chaos};
use crate::{ALLOWED_FAILURE_REASONS, GIVE_BACK_WAIT};
use seckill_shared::domain::order;
use seckill_shared::store;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use testkit::invariants::{some, Books};
use uuid::Uuid;

/// An orders row, as the checks read it.
struct Row {
    id: i64,
    user_id: String,
    quantity: i64,
    status: String,
    reason: Option<String>,
}

fn is_live(status: &str) -> bool {
    matches!(status, "confirmed" | "paid")
}

impl Chaos {
    /// Every check of one sale at quiescence.
    pub async fn check_activity(&self, id: i64) -> anyhow::Result<()> {
        // The books: conservation, the database's remaining stock, no oversell, the users,
        // one live order per user.
        let books = Books::read(&self.patient.redis, &self.env.pool, id).await?;
        for v in books.violations() {
            self.broke(id, v);
        }
        self.check_ledger_empty(id, &books);
        let rows = self.rows(id).await?;
        let attempts: Vec<Attempt> = lock(&self.attempts)
            .iter()
            .filter(|a| a.activity_id == id)
            .cloned()
            .collect();
        let (pool, kept_after_draw) = if self.draws.contains_key(&id) {
            let kept_after_draw = self.kept_after_draw(id).await?;
            (
                self.check_draw(id, &rows, &kept_after_draw).await?,
                kept_after_draw,
            )
        } else {
            (HashMap::new(), HashSet::new())
        };
        let accepted =
            self.check_accepted_requests_resolved(id, &attempts, &rows, &pool, &kept_after_draw);
        self.check_no_order_behind_another_answer(id, &attempts, &accepted, &rows);
        self.count(|r| {
            for row in rows.values() {
                let label = match &row.reason {
                    Some(reason) => format!("{} {reason}", row.status),
                    None => row.status.clone(),
                };
                *r.rows.entry(label).or_default() += 1;
            }
        });
        Ok(())
    }

    /// Nothing in flight once all is quiet: every reservation became an order or was given
    /// back, every cancel finished, every check of reconcile's ended.
    fn check_ledger_empty(&self, id: i64, books: &Books) {
        if books.ledger().next().is_none() {
            return;
        }
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for e in books.ledger() {
            *kinds.entry(format!("{:?}", e.kind)).or_default() += 1;
        }
        let entries: Vec<String> = books
            .ledger()
            .map(|e| format!("{}:{:?}:{}x{}", e.user_id, e.kind, e.id, e.quantity))
            .collect();
        self.violate(
            "ledger_empty",
            Some(id),
            format!(
                "entries {kinds:?} ({} units reserved) left in the ledger {GIVE_BACK_WAIT:?} \
                 after the queue drained: {}",
                books.units().pending,
                some(&entries)
            ),
        );
    }

    async fn rows(&self, id: i64) -> anyhow::Result<HashMap<Uuid, Row>> {
        Ok(order::of_activity(&self.env.pool, id)
            .await?
            .into_iter()
            .map(|o| {
                let row = Row {
                    id: o.id,
                    user_id: o.user_id,
                    quantity: o.quantity,
                    status: o.status.to_string(),
                    reason: o.failure_reason.map(|r| r.to_string()),
                };
                (o.request_id, row)
            })
            .collect())
    }

    /// A draw sale after its draw: drawn, every winner's request an order (or an allowed
    /// failure), no loser's, and no loser holding any live order, but one whose entry the
    /// database kept only after the draw was recorded (Redis lost the sale after the draw
    /// while her entry was on the queue: absent from the pool, she bought a unit that came
    /// back first come, first served, before the consumer put her entry back as a loser).
    /// Answers the pool by request id.
    /// The entries of draw sale `id` the database kept only after its draw was recorded:
    /// Redis may have lost the sale after the draw while they were on the queue, and their
    /// users bought a unit that came back, first come, first served, meanwhile.
    async fn kept_after_draw(&self, id: i64) -> anyhow::Result<HashSet<Uuid>> {
        Ok(sqlx::query_scalar(
            "select e.request_id from draw_entries e join draw_outcomes o using (activity_id)
             where e.activity_id = $1 and e.created_at > o.drawn_at",
        )
        .bind(id)
        .fetch_all(&self.env.pool)
        .await?
        .into_iter()
        .collect())
    }

    async fn check_draw(
        &self,
        id: i64,
        rows: &HashMap<Uuid, Row>,
        kept_after_draw: &HashSet<Uuid>,
    ) -> anyhow::Result<HashMap<Uuid, store::values::PoolEntry>> {
        let drawn = store::draw::draw(&self.patient.redis, id, Duration::MAX).await?;
        if !drawn.is_done() {
            self.violate(
                "draw_ran",
                Some(id),
                format!("the draw has not run: {drawn:?}"),
            );
        }
        let pool = store::draw::pool(&self.patient.redis, id).await?;
        let live_users: HashSet<&str> = rows
            .values()
            .filter(|r| is_live(&r.status))
            .map(|r| r.user_id.as_str())
            .collect();
        let (mut winners_without, mut losers_with) = (Vec::new(), Vec::new());
        for (user, e) in &pool {
            let row = rows.get(&e.request_id);
            if e.won && row.is_none() {
                winners_without.push(format!("{user} ({})", e.request_id));
            }
            let bought_while_out = kept_after_draw.contains(&e.request_id);
            if !e.won
                && (row.is_some() || (live_users.contains(user.as_str()) && !bought_while_out))
            {
                losers_with.push(format!("{user} ({})", e.request_id));
            }
        }
        if !winners_without.is_empty() || !losers_with.is_empty() {
            self.violate(
                "draw_outcomes",
                Some(id),
                format!(
                    "{} winner(s) without an orders row: {}; {} loser(s) with an order: {}",
                    winners_without.len(),
                    some(&winners_without),
                    losers_with.len(),
                    some(&losers_with)
                ),
            );
        }
        self.check_cutoff(id, &pool, rows).await?;
        if seckill_shared::domain::draw::orders_written(&self.env.pool, id).await? == Some(false) {
            self.violate(
                "draw_ordered",
                Some(id),
                "the recorded winners' orders are not all written".to_string(),
            );
        }
        self.count(|r| {
            r.draw_entrants += pool.len() as u64;
            r.draw_winners += pool.iter().filter(|(_, e)| e.won).count() as u64;
        });
        Ok(pool.into_iter().map(|(_, e)| (e.request_id, e)).collect())
    }

    /// The cutoff rule, for every entry of a done draw (the published cutoff: the last ticket
    /// the draw looked at). No winner above it. At or below it, an entry passed over (queued,
    /// not late, its user holding no other order) asked more units than the stock left at its
    /// turn: at least one unit (a draw whose stock is gone looks at no further ticket) and at
    /// least the units of any winner after it (the stock only falls during the draw).
    async fn check_cutoff(
        &self,
        id: i64,
        pool: &[(String, store::values::PoolEntry)],
        rows: &HashMap<Uuid, Row>,
    ) -> anyhow::Result<()> {
        let k = self.patient.redis.keys(id);
        let cutoff: Option<i64> = self
            .patient
            .redis
            .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawCutoff"))
            .await?;
        let tickets: HashMap<String, i64> = self
            .patient
            .redis
            .cmd::<Vec<(String, f64)>>(
                redis::cmd("ZRANGE")
                    .arg(&k.tickets)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES"),
            )
            .await?
            .into_iter()
            .map(|(user, t)| (user, t as i64))
            .collect();
        let holds_other_order = |user: &str, request_id: Uuid| {
            rows.iter().any(|(rid, r)| {
                *rid != request_id
                    && r.user_id == user
                    && matches!(r.status.as_str(), "confirmed" | "paid" | "cancelled")
            })
        };
        let mut looked: Vec<(i64, &str, &store::values::PoolEntry)> = pool
            .iter()
            .filter_map(|(user, e)| Some((*tickets.get(user)?, user.as_str(), e)))
            .collect();
        looked.sort_by_key(|(t, _, _)| *t);
        let (mut broken, mut passed_over) = (Vec::new(), 0);
        for (i, &(ticket, user, e)) in looked.iter().enumerate() {
            let at_or_below = cutoff.is_some_and(|c| ticket <= c);
            if e.won && !at_or_below {
                broken.push(format!(
                    "{user} won with ticket {ticket} above the cutoff {cutoff:?}"
                ));
            }
            if e.won || e.late || !at_or_below || holds_other_order(user, e.request_id) {
                continue;
            }
            passed_over += 1;
            let later_winner = looked[i + 1..]
                .iter()
                .filter(|(t, _, w)| w.won && cutoff.is_some_and(|c| *t <= c))
                .map(|(_, _, w)| w.quantity)
                .max()
                .unwrap_or(0);
            if e.quantity <= later_winner.max(1) {
                broken.push(format!(
                    "{user} (ticket {ticket}, {} units) passed over at or below the cutoff                      {cutoff:?}, though a later winner took {later_winner}",
                    e.quantity
                ));
            }
        }
        if !broken.is_empty() {
            self.violate(
                "draw_cutoff",
                Some(id),
                format!(
                    "{} entries broke the cutoff rule: {}",
                    broken.len(),
                    some(&broken)
                ),
            );
        }
        self.count(|r| r.draw_passed_over += passed_over);
        Ok(())
    }

    /// Every 202 ends in an order (live or cancelled since) or a failure with an allowed reason,
    /// for the user and quantity asked. Returns the request ids answered 202.
    fn check_accepted_requests_resolved(
        &self,
        id: i64,
        attempts: &[Attempt],
        rows: &HashMap<Uuid, Row>,
        pool: &HashMap<Uuid, store::values::PoolEntry>,
        kept_after_draw: &HashSet<Uuid>,
    ) -> HashSet<Uuid> {
        let mut accepted = HashSet::new();
        let (mut unresolved, mut wrong) = (Vec::new(), Vec::new());
        // The users one of whose queued entries the draw decided (an order, or passed over).
        let decided: HashSet<&str> = attempts
            .iter()
            .filter(|a| a.status == 202 && a.queued)
            .filter(|a| {
                a.request_id
                    .is_some_and(|id| rows.contains_key(&id) || pool.contains_key(&id))
            })
            .map(|a| a.user.as_str())
            .collect();
        for a in attempts.iter().filter(|a| a.status == 202) {
            let Some(request_id) = a.request_id else {
                wrong.push(format!("a 202 to {} without a requestId", a.user));
                continue;
            };
            accepted.insert(request_id);
            let Some(row) = rows.get(&request_id) else {
                // A queued entry the draw passed over holds nothing: it reads `not_drawn`. One
                // Redis forgot before it was put back, whose user then entered again (and was
                // queued: nothing of hers was in the pool), is stood for by her newer entry,
                // with the same ticket: the draw decided that one. One the database kept only
                // after the draw, whose user bought meanwhile (Redis had lost the sale), is
                // stood for by her order: an entry whose user holds a live order is not live,
                // and no rebuild puts it back.
                let passed_over = pool.get(&request_id).is_some_and(|e| !e.won);
                let bought_while_out = kept_after_draw.contains(&request_id)
                    && rows
                        .values()
                        .any(|r| r.user_id == a.user && is_live(&r.status));
                let superseded = decided.contains(a.user.as_str()) || bought_while_out;
                if !(a.queued && (passed_over || superseded)) {
                    unresolved.push(request_id);
                }
                continue;
            };
            let allowed = match row.status.as_str() {
                "confirmed" | "paid" | "cancelled" => true,
                "failed" => row
                    .reason
                    .as_deref()
                    .is_some_and(|r| ALLOWED_FAILURE_REASONS.contains(&r)),
                _ => false,
            };
            if !allowed || row.user_id != a.user || row.quantity != a.quantity {
                wrong.push(format!(
                    "{request_id} ({} x{}) ended as order {} ({} x{}) {} {:?}",
                    a.user, a.quantity, row.id, row.user_id, row.quantity, row.status, row.reason
                ));
            }
        }
        if !unresolved.is_empty() || !wrong.is_empty() {
            self.violate(
                "accepted_requests_resolved",
                Some(id),
                format!(
                    "{} request(s) answered 202 have no orders row: {}; {} ended wrongly: {}",
                    unresolved.len(),
                    some(&unresolved),
                    wrong.len(),
                    some(&wrong)
                ),
            );
        }
        accepted
    }

    /// A 503 means nothing happened: an order that came to be (live, or cancelled since) stems
    /// from a 202. A 503 does not name its request id, so an order whose request id no buyer
    /// was answered 202 for is one behind another answer; a 503 that does carry one is checked
    /// directly.
    fn check_no_order_behind_another_answer(
        &self,
        id: i64,
        attempts: &[Attempt],
        accepted: &HashSet<Uuid>,
        rows: &HashMap<Uuid, Row>,
    ) {
        let refused_ids: HashSet<Uuid> = attempts
            .iter()
            .filter(|a| a.status != 202)
            .filter_map(|a| a.request_id)
            .collect();
        let mut behind: Vec<String> = rows
            .iter()
            .filter(|(rid, r)| {
                matches!(r.status.as_str(), "confirmed" | "paid" | "cancelled")
                    && (!accepted.contains(*rid) || refused_ids.contains(*rid))
            })
            .map(|(rid, r)| {
                // What that user was told instead, for the same quantity: 5xx, or no answer.
                let failed_answers = attempts
                    .iter()
                    .filter(|a| a.user == r.user_id && a.quantity == r.quantity)
                    .filter(|a| a.status == 0 || a.status >= 500)
                    .count();
                format!(
                    "order {} ({} x{}, {}, request {rid}; {failed_answers} 5xx/unanswered \
                     clicks of that user for x{})",
                    r.id, r.user_id, r.quantity, r.status, r.quantity
                )
            })
            .collect();
        behind.sort();
        if !behind.is_empty() {
            self.violate(
                "unavailable_means_nothing",
                Some(id),
                format!(
                    "{} order(s) exist for requests not answered 202: {}",
                    behind.len(),
                    some(&behind)
                ),
            );
        }
    }
}

/// An order and its payment, as the payment check reads them.
#[derive(sqlx::FromRow)]
struct PaymentEnd {
    order: String,
    activity: i64,
    amount: i64,
    /// The order's price times its quantity.
    price: Option<i64>,
    payment: String,
    refund: Option<String>,
}

impl Chaos {
    /// Every payment started agrees with the provider at quiescence: an order is paid only by
    /// a payment the provider says succeeded, for the order's price times its quantity; money
    /// taken at the provider paid its order or is owed back (a refund tracked); an order
    /// cancelled (by its owner or the release) has its payment cancelled at the provider, or
    /// its money owed back; a payment recorded cancelled is cancelled there.
    pub async fn check_payments(&self) -> anyhow::Result<()> {
        let started = lock(&self.payments).clone();
        for (order_id, pi) in started {
            let at_provider = testkit::localstripe::intent_status(&pi).await;
            let row: Option<PaymentEnd> = sqlx::query_as(
                "select o.status as \"order\", o.activity_id as activity, p.amount_minor as amount,
                            o.unit_price_minor * o.quantity as price, p.status as payment,
                            p.refund_state as refund
                     from orders o join payments p on p.order_id = o.id
                     where o.id = $1 and p.provider_payment_id = $2",
            )
            .bind(order_id)
            .bind(&pi)
            .fetch_optional(&self.env.pool)
            .await?;
            let Some(PaymentEnd {
                order,
                activity,
                amount,
                price,
                payment,
                refund,
            }) = row
            else {
                self.violate(
                    "payment_recorded",
                    None,
                    format!("order {order_id}: payment {pi} was started but has no row"),
                );
                continue;
            };
            let succeeded = at_provider == "succeeded";
            let owed_back = matches!(refund.as_deref(), Some("due" | "refunding" | "refunded"));
            let broken = match order.as_str() {
                "paid" if !succeeded || payment != "succeeded" => {
                    Some("paid without a payment that succeeded at the provider")
                }
                "paid" if Some(amount) != price => Some("paid an amount that is not its price"),
                "cancelled" if succeeded && !owed_back => {
                    Some("cancelled with the buyer's money taken and nothing owed back")
                }
                "cancelled" if !succeeded && at_provider != "canceled" => {
                    Some("cancelled with its payment still open at the provider")
                }
                "confirmed" if succeeded && !owed_back => {
                    Some("paid at the provider, its event delivered, the order not paid")
                }
                _ if payment == "cancelled" && at_provider != "canceled" => {
                    Some("payment recorded cancelled, not cancelled at the provider")
                }
                _ => None,
            };
            if let Some(what) = broken {
                self.violate(
                    "payment_agrees_with_provider",
                    Some(activity),
                    format!(
                        "order {order_id} ({order}, payment {payment}, refund {refund:?}) and \
                         {pi} ({at_provider}): {what}"
                    ),
                );
            }
            self.count(|r| {
                *r.payments
                    .entry(match (order.as_str(), at_provider.as_str()) {
                        ("paid", _) => "end: paid",
                        ("cancelled", "canceled") => "end: cancelled at both",
                        ("cancelled", _) => "end: cancelled, money owed back",
                        ("confirmed", "canceled") => "end: confirmed, intent cancelled",
                        ("confirmed", _) => "end: confirmed, intent open",
                        _ => "end: other",
                    })
                    .or_default() += 1;
            });
        }
        Ok(())
    }
}
