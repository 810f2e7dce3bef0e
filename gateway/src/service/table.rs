//! The published routing table: the fleet core's table (its one owner), kept as ready-to-serve
//! JSON with its generation, which is the ETag (`"<generation>"`) `GET /v1/routing` compares
//! with `If-None-Match`. Re-encoded only when the core's generation moves.
//!
//! It also keeps the generations published before it (at most [`HISTORY_TABLES`] and
//! [`HISTORY_BYTES`] of their encodings), so a filter asking `?since=G` gets core's
//! `table_delta::diff` from generation `G` to this one. Each delta is made on its first ask and
//! kept with the table (every proxy polling each second asks for the same one or two), and only
//! served when it is smaller than the table. A `G` the gateway does not keep — too old, from
//! before a restart, or after the current one — gets the whole table.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use prewarm_core::table_delta::diff;
use prewarm_core::wire::RoutingTable;

use super::Gateway;

/// Most earlier generations kept to make deltas from.
pub const HISTORY_TABLES: usize = 64;

/// Most bytes (of their encodings) the earlier generations kept may take; the oldest go first.
/// A 1,000-pod table is about 180 KB, so 64 of them fit.
pub const HISTORY_BYTES: usize = 16 << 20;

/// Most deltas kept with a table (one per base asked for); past it, deltas are made per ask.
const MAX_CACHED_DELTAS: usize = HISTORY_TABLES;

/// A generation kept to make deltas from.
#[derive(Debug)]
struct Earlier {
    table: Arc<RoutingTable>,
    bytes: usize,
}

/// The table as served.
#[derive(Debug)]
pub struct PublishedTable {
    pub generation: u64,
    pub pods: usize,
    /// The encoded [`RoutingTable`].
    pub json: Arc<[u8]>,
    table: Arc<RoutingTable>,
    /// Earlier generations, oldest first.
    earlier: VecDeque<Earlier>,
    /// Encoded deltas onto this generation by base (`None`: the whole table is smaller).
    deltas: Mutex<BTreeMap<u64, Option<Arc<[u8]>>>>,
}

/// What `GET /v1/routing` sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableReply {
    Whole(Arc<[u8]>),
    Delta(Arc<[u8]>),
}

impl PublishedTable {
    pub fn empty() -> Self {
        let block_tokens = prewarm_core::FingerprintConfig::default().block_tokens;
        Self::of(&RoutingTable::of_pods(0, block_tokens, Vec::new()))
    }

    pub fn of(table: &RoutingTable) -> Self {
        Self {
            generation: table.generation,
            pods: table.pods.len(),
            json: table.encode().into(),
            table: Arc::new(table.clone()),
            earlier: VecDeque::new(),
            deltas: Mutex::new(BTreeMap::new()),
        }
    }

    /// `table`, published after `self`, which joins the earlier generations (the oldest leave
    /// past [`HISTORY_TABLES`] or [`HISTORY_BYTES`]).
    pub fn next(&self, table: &RoutingTable) -> Self {
        let mut next = Self::of(table);
        next.earlier = self
            .earlier
            .iter()
            .map(|e| Earlier {
                table: e.table.clone(),
                bytes: e.bytes,
            })
            .collect();
        if self.generation < next.generation {
            next.earlier.push_back(Earlier {
                table: self.table.clone(),
                bytes: self.json.len(),
            });
        }
        next.earlier
            .retain(|e| e.table.generation < next.generation);
        let mut bytes: usize = next.earlier.iter().map(|e| e.bytes).sum();
        while next.earlier.len() > HISTORY_TABLES || bytes > HISTORY_BYTES {
            match next.earlier.pop_front() {
                Some(gone) => bytes = bytes.saturating_sub(gone.bytes),
                None => break,
            }
        }
        next
    }

    /// The ETag of this generation, quotes included.
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.generation)
    }

    /// The generations a delta can be made from, oldest first.
    pub fn kept_generations(&self) -> impl Iterator<Item = u64> + '_ {
        self.earlier.iter().map(|e| e.table.generation)
    }

    /// What a filter holding generation `since` (`None`: it did not say) gets: the delta from
    /// it when it is kept and the delta is smaller than the table, else the whole table.
    pub fn reply(&self, since: Option<u64>) -> TableReply {
        let whole = || TableReply::Whole(self.json.clone());
        let Some(since) = since.filter(|g| *g < self.generation) else {
            return whole();
        };
        let Some(base) = self.earlier.iter().find(|e| e.table.generation == since) else {
            return whole();
        };
        let mut cached = self.deltas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(delta) = cached.get(&since) {
            return delta.clone().map_or_else(whole, TableReply::Delta);
        }
        let delta: Option<Arc<[u8]>> = diff(&base.table, &self.table)
            .map(|d| d.encode())
            .filter(|bytes| !bytes.is_empty() && bytes.len() < self.json.len())
            .map(Into::into);
        if cached.len() < MAX_CACHED_DELTAS {
            cached.insert(since, delta.clone());
        }
        delta.map_or_else(whole, TableReply::Delta)
    }
}

impl Gateway {
    /// The table filters get now.
    pub fn published_table(&self) -> Arc<PublishedTable> {
        self.table
            .read()
            .map(|t| t.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Rebuilds the core's table; publishes it when its generation moved.
    pub fn republish_table(&self) {
        let published = {
            let mut state = self.state();
            state.fleet.rebuild_table(self.clock.now_ms());
            let gold_pods = state.fleet.tier_pools().gold_pods();
            self.telemetry.gold_pool_pods.set(gold_pods as i64);
            let table = state.fleet.table();
            let before = self.published_table();
            if table.generation == before.generation && table.generation != 0 {
                return;
            }
            before.next(table)
        };
        self.telemetry
            .table_generation
            .set(published.generation as i64);
        self.telemetry.table_pods.set(published.pods as i64);
        tracing::info!(
            generation = published.generation,
            pods = published.pods,
            "routing table published"
        );
        match self.table.write() {
            Ok(mut t) => *t = Arc::new(published),
            Err(p) => *p.into_inner() = Arc::new(published),
        }
    }
}

#[cfg(test)]
mod tests {
    use prewarm_core::table_delta::{apply, TableDelta};
    use prewarm_core::wire::RoutedPod;

    use super::*;

    fn table(generation: u64, load: f64) -> RoutingTable {
        let pods = (0..50)
            .map(|i| RoutedPod {
                load: Some(if i == 7 { load } else { 0.1 }),
                ..RoutedPod::new(&format!("pod-{i:02}"), &format!("10.0.0.{i}:8000"), &[])
            })
            .collect();
        RoutingTable::of_pods(generation, 64, pods)
    }

    fn delta(reply: TableReply) -> TableDelta {
        match reply {
            TableReply::Delta(bytes) => TableDelta::decode(&bytes).unwrap(),
            TableReply::Whole(_) => panic!("a whole table"),
        }
    }

    #[test]
    fn a_kept_generation_gets_a_delta_onto_it_and_others_the_whole_table() {
        let mut published = PublishedTable::of(&table(1, 0.1));
        for g in 2..=5 {
            published = published.next(&table(g, g as f64 / 10.0));
        }
        assert_eq!(
            published.kept_generations().collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        let whole = TableReply::Whole(published.json.clone());
        let d = delta(published.reply(Some(2)));
        assert_eq!((d.base, d.generation), (2, 5));
        assert_eq!(apply(&d, &table(2, 0.2)), Ok(table(5, 0.5)));
        // the same ask is served from the cache
        assert_eq!(delta(published.reply(Some(2))), d);
        for unknown in [None, Some(0), Some(5), Some(6), Some(u64::MAX)] {
            assert_eq!(published.reply(unknown), whole, "{unknown:?}");
        }
    }

    #[test]
    fn history_is_bounded_in_tables() {
        let mut published = PublishedTable::of(&table(1, 0.1));
        for g in 2..=(HISTORY_TABLES as u64 + 10) {
            published = published.next(&table(g, 0.1 + (g % 2) as f64 / 10.0));
        }
        let kept: Vec<u64> = published.kept_generations().collect();
        assert_eq!(kept.len(), HISTORY_TABLES);
        assert_eq!(kept.last(), Some(&(HISTORY_TABLES as u64 + 9)));
        assert_eq!(
            published.reply(Some(1)),
            TableReply::Whole(published.json.clone())
        );
    }

    #[test]
    fn a_delta_no_smaller_than_the_table_is_not_served() {
        let small = RoutingTable::of_pods(1, 64, vec![RoutedPod::new("a", "10.0.0.1:80", &[])]);
        let other = RoutingTable::of_pods(2, 64, vec![RoutedPod::new("b", "10.0.0.2:80", &[])]);
        let published = PublishedTable::of(&small).next(&other);
        assert_eq!(
            published.reply(Some(1)),
            TableReply::Whole(published.json.clone())
        );
    }
}
