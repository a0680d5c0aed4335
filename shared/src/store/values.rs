//! The values the scripts keep in Redis, read back (and, for tests and tools that age or seed
//! them, written) on the Rust side: a ledger entry, a pool entry, a winner entry, a sale's
//! terms (and the memory of them a Redis handle keeps for `purchase.lua`). The formats
//! are told once, in docs/invariants.md, "The state"; the scripts write them through
//! `lua/prelude.lua` only, and the tests below hold this module to the strings it writes.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use uuid::Uuid;

/// What a ledger entry stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// `r`: units reserved, the order message on its way.
    Reservation,
    /// `c`: a cancel attempt between Redis and the database.
    Cancel,
    /// `x`: a check is looking at this user (reconcile's orphan check, a restore of a lost
    /// field); it holds no units.
    Check,
    /// `t`, under a [`super::keys::transfer_field`]: units taken from this bucket for a
    /// purchase in another (`lua/borrow.lua`), not yet known to be there.
    Transfer,
}

impl EntryKind {
    /// The letter the entry starts with.
    pub fn letter(self) -> &'static str {
        match self {
            EntryKind::Reservation => "r",
            EntryKind::Cancel => "c",
            EntryKind::Check => "x",
            EntryKind::Transfer => "t",
        }
    }
}

/// One in-flight entry of the ledger, keyed by user (or, for a transfer, by its field).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    pub user_id: String,
    pub kind: EntryKind,
    /// What guards the entry: the request id (reservation), the cancel id (cancel), the check
    /// token or the transfer id.
    pub id: String,
    pub quantity: i64,
    pub at_ms: i64,
    /// The order a cancel entry is about.
    pub order_id: Option<i64>,
    /// A transfer's home bucket index and the load epoch it was taken in.
    pub transfer: Option<(u32, i64)>,
}

impl LedgerEntry {
    /// Reads the entry `value` of field `user_id`: `kind|id|qty|ms`, then a cancel's order id,
    /// or a transfer's home bucket and epoch.
    pub fn parse(user_id: &str, value: &str) -> Option<Self> {
        let mut parts = value.split('|');
        let kind = match parts.next()? {
            "r" => EntryKind::Reservation,
            "c" => EntryKind::Cancel,
            "x" => EntryKind::Check,
            "t" => EntryKind::Transfer,
            _ => return None,
        };
        let id = parts.next()?.to_string();
        let quantity = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        let order_id = match kind {
            EntryKind::Cancel => Some(parts.next()?.parse().ok()?),
            _ => None,
        };
        let transfer = match kind {
            EntryKind::Transfer => Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?)),
            _ => None,
        };
        Some(Self {
            user_id: user_id.to_string(),
            kind,
            id,
            quantity,
            at_ms,
            order_id,
            transfer,
        })
    }

    /// The reservation's request id, when this is a reservation.
    pub fn request_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Reservation)
            .then(|| self.id.parse().ok())
            .flatten()
    }

    /// The transfer's id, when this is a transfer.
    pub fn transfer_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Transfer)
            .then(|| self.id.parse().ok())
            .flatten()
    }

    /// The cancel attempt's id, when this is a cancel.
    pub fn cancel_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Cancel)
            .then(|| self.id.parse().ok())
            .flatten()
    }
}

/// The value as the scripts write it.
impl fmt::Display for LedgerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, id, qty, ms) = (self.kind.letter(), &self.id, self.quantity, self.at_ms);
        write!(f, "{kind}|{id}|{qty}|{ms}")?;
        if let Some(order_id) = self.order_id {
            write!(f, "|{order_id}")?;
        }
        if let Some((home, epoch)) = self.transfer {
            write!(f, "|{home}|{epoch}")?;
        }
        Ok(())
    }
}

/// A user's entry in a draw sale's pool: `requestId|qty|rank|state`, `state` `q` (queued;
/// after the draw, not drawn) or `w` (won). A tombstone (`x`) is no entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    pub request_id: Uuid,
    pub quantity: i64,
    /// Arrival order in the pool, from 1.
    pub rank: i64,
    /// Drawn as a winner (else queued, or after the draw not drawn).
    pub won: bool,
    /// Put back into the pool once the draw had begun, too late for it (`l`).
    pub late: bool,
}

impl PoolEntry {
    /// Reads a pool value; `None` for a tombstone and for the sentinel.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.split('|');
        let request_id = parts.next()?.parse().ok()?;
        let quantity = parts.next()?.parse().ok()?;
        let rank = parts.next()?.parse().ok()?;
        let (won, late) = match parts.next()? {
            "w" => (true, false),
            "q" => (false, false),
            "l" => (false, true),
            _ => return None,
        };
        Some(Self {
            request_id,
            quantity,
            rank,
            won,
            late,
        })
    }

    /// Whether a pool value is a tombstone: an entry taken back after a 503
    /// (`requestId|0|0|x`).
    pub fn is_tombstone(value: &str) -> bool {
        value.ends_with("|x")
    }
}

/// The value as the scripts write it.
impl fmt::Display for PoolEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match (self.won, self.late) {
            (true, _) => "w",
            (false, true) => "l",
            (false, false) => "q",
        };
        write!(
            f,
            "{}|{}|{}|{state}",
            self.request_id, self.quantity, self.rank
        )
    }
}

/// A draw winner in the sale's `winners`, under its request id: `userId|qty|epoch`, the
/// winner, its units and the load epoch the draw ran under. The sentinel is no entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WinnerEntry {
    pub user_id: String,
    pub quantity: i64,
    pub epoch: i64,
}

impl WinnerEntry {
    /// Reads a winner value; the user id is all before the last two fields.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.rsplitn(3, '|');
        let (epoch, quantity, user_id) = (parts.next()?, parts.next()?, parts.next()?);
        Some(Self {
            user_id: user_id.to_string(),
            quantity: quantity.parse().ok()?,
            epoch: epoch.parse().ok()?,
        })
    }
}

/// The value as the scripts write it.
impl fmt::Display for WinnerEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}|{}", self.user_id, self.quantity, self.epoch)
    }
}

/// A sale's terms, the meta's `terms`: `version:startMs:endMs:limit:drawEndMs:rate`, the
/// fields it is written with (`sale_terms` in `lua/prelude.lua`). `purchase.lua` takes a copy
/// in its arguments, the whole value and its parts, and uses the parts only when the value is
/// the meta's own and the meta's `version` the one it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleTerms {
    text: String,
    parts: [std::ops::Range<usize>; 6],
}

impl SaleTerms {
    /// The meta fields a `terms` value is made of, in its order.
    pub const FIELDS: [&str; 6] = ["version", "startMs", "endMs", "limit", "drawEndMs", "rate"];

    /// Reads a `terms` value: six fields, none empty.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts: [std::ops::Range<usize>; 6] = Default::default();
        let mut fields = text.split(':');
        let mut at = 0;
        for part in &mut parts {
            let field = fields.next().filter(|f| !f.is_empty())?;
            *part = at..at + field.len();
            at += field.len() + 1;
        }
        fields.next().is_none().then(|| Self {
            text: text.to_string(),
            parts,
        })
    }

    /// The value as the meta holds it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its fields in order: version, startMs, endMs, limit, drawEndMs, rate.
    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().map(|r| &self.text[r.clone()])
    }

    /// The `terms` a meta's own [`Self::FIELDS`] make, as `terms_of_fields` in
    /// `lua/prelude.lua` makes them (the draw end and the rate absent: `0`); `None` when one
    /// of the others is absent.
    pub fn of_fields(fields: &[Option<String>; 6]) -> Option<String> {
        let mut parts = Vec::with_capacity(6);
        for (i, field) in fields.iter().enumerate() {
            parts.push(match field.as_deref() {
                Some(f) => f,
                None if i >= 4 => "0",
                None => return None,
            });
        }
        Some(parts.join(":"))
    }
}

/// The terms of the sales a Redis handle (and its clones) last read, by activity: what its
/// purchases carry. A copy is only ever used by the script when it is the meta's own and
/// names the meta's version, so a stale one costs one read, never a wrong answer (docs/
/// invariants.md, "Entry: a purchase", step 1, says why). At most [`TermsSeen::MAX`] sales;
/// past it the memory starts afresh.
#[derive(Debug, Default)]
pub struct TermsSeen {
    seen: RwLock<HashMap<i64, Arc<SaleTerms>>>,
}

impl TermsSeen {
    pub const MAX: usize = 1024;

    pub fn get(&self, activity_id: i64) -> Option<Arc<SaleTerms>> {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        seen.get(&activity_id).cloned()
    }

    /// Keeps `text` as the sale's terms; a value that does not read is forgotten instead.
    pub fn put(&self, activity_id: i64, text: &str) {
        let terms = SaleTerms::parse(text);
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        match terms {
            Some(terms) => {
                if seen.len() >= Self::MAX && !seen.contains_key(&activity_id) {
                    seen.clear();
                }
                seen.insert(activity_id, Arc::new(terms));
            }
            None => {
                seen.remove(&activity_id);
            }
        }
    }

    /// Forgets the sale's terms: its next purchase reads them from the meta.
    pub fn forget(&self, activity_id: i64) {
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        seen.remove(&activity_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST: &str = "6f1c1a2e-0000-4000-8000-000000000001";

    /// Each value as a script writes it (`lua/prelude.lua`), read and written back unchanged.
    fn round_trips<T: fmt::Display>(written: &str, read: Option<T>) -> T {
        let read = read.unwrap_or_else(|| panic!("{written} does not read"));
        assert_eq!(read.to_string(), written);
        read
    }

    #[test]
    fn a_reservation_reads_back() {
        let v = format!("r|{REQUEST}|2|1700");
        let r = round_trips(&v, LedgerEntry::parse("alice", &v));
        assert_eq!(
            (r.kind, r.quantity, r.at_ms, r.user_id.as_str()),
            (EntryKind::Reservation, 2, 1700, "alice")
        );
        assert_eq!(r.request_id(), Some(REQUEST.parse().unwrap()));
        assert_eq!(r.cancel_id(), None);
    }

    #[test]
    fn a_cancel_reads_back_with_its_order() {
        let v = format!("c|{REQUEST}|1|1800|17");
        let c = round_trips(&v, LedgerEntry::parse("bob", &v));
        assert_eq!(
            (c.kind, c.order_id, c.at_ms),
            (EntryKind::Cancel, Some(17), 1800)
        );
        assert!(c.cancel_id().is_some() && c.request_id().is_none());
    }

    #[test]
    fn a_check_mark_reads_back() {
        let x = round_trips("x|tok|0|1900", LedgerEntry::parse("carol", "x|tok|0|1900"));
        assert_eq!(
            (x.kind, x.id.as_str(), x.quantity),
            (EntryKind::Check, "tok", 0)
        );
    }

    #[test]
    fn a_transfer_reads_back_with_its_home_and_epoch() {
        let v = format!("t|{REQUEST}|4|2000|2|7");
        let t = round_trips(&v, LedgerEntry::parse(" transfer:x", &v));
        assert_eq!(
            (t.kind, t.quantity, t.transfer),
            (EntryKind::Transfer, 4, Some((2, 7)))
        );
        assert!(t.transfer_id().is_some() && t.request_id().is_none());
    }

    #[test]
    fn what_is_no_ledger_entry_does_not_read() {
        for v in [
            "garbage",
            "-",
            "",
            "r|id|two|1",
            "c|id|1|2",
            "t|id|1|2|3",
            "z|id|1|2",
        ] {
            assert_eq!(LedgerEntry::parse("u", v), None, "{v}");
        }
    }

    #[test]
    fn a_pool_entry_reads_back_and_a_tombstone_is_none() {
        let w = round_trips(
            &format!("{REQUEST}|2|17|w"),
            PoolEntry::parse(&format!("{REQUEST}|2|17|w")),
        );
        assert_eq!((w.quantity, w.rank, w.won), (2, 17, true));
        let q = round_trips(
            &format!("{REQUEST}|1|3|q"),
            PoolEntry::parse(&format!("{REQUEST}|1|3|q")),
        );
        assert!(!q.won);
        let tombstone = format!("{REQUEST}|0|0|x");
        assert_eq!(PoolEntry::parse(&tombstone), None);
        assert!(PoolEntry::is_tombstone(&tombstone));
        assert!(!PoolEntry::is_tombstone(&q.to_string()));
        assert_eq!(PoolEntry::parse("-"), None);
    }

    #[test]
    fn a_winner_entry_reads_back_whatever_its_user_id_holds() {
        let o = round_trips("alice|2|7", WinnerEntry::parse("alice|2|7"));
        assert_eq!((o.user_id.as_str(), o.quantity, o.epoch), ("alice", 2, 7));
        let odd = round_trips("a|b|1|0", WinnerEntry::parse("a|b|1|0"));
        assert_eq!(odd.user_id, "a|b");
        assert_eq!(WinnerEntry::parse("-"), None);
        assert_eq!(WinnerEntry::parse("10|0"), None);
    }

    #[test]
    fn a_sales_terms_read_as_their_six_fields_and_nothing_else_does() {
        let t = SaleTerms::parse("3:1700000000000:1700003600000:2:0:5").expect("terms");
        assert_eq!(t.text(), "3:1700000000000:1700003600000:2:0:5");
        assert_eq!(
            t.parts().collect::<Vec<_>>(),
            ["3", "1700000000000", "1700003600000", "2", "0", "5"]
        );
        for bad in ["", "1:2:3:4:5", "1:2:3:4:5:6:7", "1::3:4:5:6", "1:2:3:4:5:"] {
            assert_eq!(SaleTerms::parse(bad), None, "{bad:?}");
        }
        let some = |v: &str| Some(v.to_string());
        let fields = [some("3"), some("10"), some("20"), some("2"), None, None];
        assert_eq!(
            SaleTerms::of_fields(&fields).as_deref(),
            Some("3:10:20:2:0:0")
        );
        let unloaded = [None, some("10"), some("20"), some("2"), None, None];
        assert_eq!(SaleTerms::of_fields(&unloaded), None);
    }

    #[test]
    fn the_memory_of_terms_keeps_what_reads_and_forgets_what_does_not() {
        let seen = TermsSeen::default();
        seen.put(7, "1:1:2:3:0:0");
        assert_eq!(seen.get(7).unwrap().text(), "1:1:2:3:0:0");
        seen.put(7, "garbage");
        assert_eq!(seen.get(7), None);
        for id in 0..TermsSeen::MAX as i64 + 5 {
            seen.put(id, "1:1:2:3:0:0");
        }
        assert!(seen.seen.read().unwrap().len() <= TermsSeen::MAX);
        seen.forget(TermsSeen::MAX as i64 + 4);
        assert_eq!(seen.get(TermsSeen::MAX as i64 + 4), None);
    }
}
