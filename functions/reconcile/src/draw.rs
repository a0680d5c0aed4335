//! A draw sale's part of a reconcile run, before the snapshot: the rebuild of its pool a load
//! left unfinished, the draw nobody has finished since its window closed, its record and its
//! winners' orders ([`seckill_shared::protocol::draw::drive`]), so that the ledger the snapshot
//! reads shows the written winners settled. Reconcile is the one drawer: it alone runs a draw,
//! records it and writes its winners' orders; each run does what its share allows and the
//! next goes on.

use crate::budget::Share;
use crate::{ActivityReport, Reconcile};
use anyhow::Context as _;
use seckill_shared::domain::activity::Activity;
use seckill_shared::protocol::draw;
use seckill_shared::protocol::load;
use seckill_shared::store::draw::Drawn;

impl Reconcile {
    /// The rebuild a load left, the draw's steps, its record, its winners' orders, within
    /// `share` (each does its least, a chunk, a step, the record, a chunk of orders, whatever
    /// the time); a sale whose Redis draw is not the recorded one is loaded from scratch.
    pub(crate) async fn draw_and_order(
        &self,
        a: &Activity,
        share: Share,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        // A rebuild a load did not finish (out of its time, or an error) goes on from its
        // cursor first: the draw waits for it.
        let rebuilt = draw::rebuild(&self.redis, &self.pool, a.id, share.until)
            .await
            .context("failed to rebuild the draw's pool")?;
        r.pool_rebuilt = rebuilt.winners as usize + rebuilt.entries as usize;
        r.out_of_time |= !rebuilt.done;
        let queue = self.queue().await;
        let wait = self.config.draw_entry_wait;
        let run = draw::drive(&self.redis, &self.pool, queue, a.id, share.until, wait)
            .await
            .context("failed to run the draw and write its winners' orders")?;
        if run.diverged {
            // Redis holds a draw that is not the recorded one: loaded from scratch, the sale
            // gets the recorded outcome back, and its winners' orders are written from there.
            let (outcome, _) =
                load::reload_under_lock(&self.redis, &self.pool, &self.config, a.id, share.hard)
                    .await
                    .context("failed to load the sale whose draw is not the recorded one")?;
            tracing::warn!(
                activity_id = a.id,
                ?outcome,
                repair = "draw_reloaded",
                "sale loaded from scratch: its draw was not the recorded one"
            );
            r.draw_reloaded = true;
        }
        r.pool_left = run.left;
        r.drawn = matches!(run.drawn, Drawn::Now { .. });
        let entrants = match run.drawn {
            Drawn::Open { entrants, .. }
            | Drawn::Now { entrants, .. }
            | Drawn::Running { entrants, .. }
            | Drawn::Before { entrants }
            | Drawn::Restoring { entrants }
            | Drawn::Waiting { entrants } => Some(entrants),
            Drawn::NotDraw | Drawn::NotLoaded => None,
        };
        r.draw_entrants = entrants;
        r.pool_fill_percent = entrants.map(|n| 100.0 * n as f64 / a.max_entrants.max(1) as f64);
        r.winners_ordered = run.ordered;
        r.orders_pending = run.drawn.is_done() && !run.written && !run.diverged;
        r.out_of_time |= matches!(run.drawn, Drawn::Running { .. }) || r.orders_pending;
        Ok(())
    }
}
