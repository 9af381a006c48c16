//! A script call's argument (`ARGV[1]`): a header and groups of numbers, each a big-endian
//! double (`decide.lua` reads them with `struct.unpack`), so the script parses no decimal
//! text. Every number sent is a whole number below 2^53, so each double is exact; a larger
//! one (a record of more units than any state can owe) is sent as 2^53.
#![deny(clippy::arithmetic_side_effects)]

/// How the script treats a call's groups (`decide.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Each group on its own, in order.
    Independent,
    /// All or nothing: writes happen only if every enforced group admits.
    AllOrNothing,
    /// Units given back.
    Refund,
    /// Leases taken and returned.
    Lease,
}

impl Mode {
    fn code(self) -> u64 {
        match self {
            Mode::Independent => 0,
            Mode::AllOrNothing => 1,
            Mode::Refund => 2,
            Mode::Lease => 3,
        }
    }
}

/// What a group of modes 0 and 1 does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupKind {
    /// Enforced: blocks an all-or-nothing batch when denied.
    Enforced,
    /// Shadow: decided and written like an enforced group, but never blocks a batch.
    Shadow,
    /// A record of usage that already happened: written whatever it finds.
    Record,
}

impl GroupKind {
    fn code(self) -> u64 {
        match self {
            GroupKind::Shadow => 0,
            GroupKind::Enforced => 1,
            GroupKind::Record => 2,
        }
    }
}

/// Bytes of one number.
const NUMBER: usize = 8;
/// Bytes of the header: now, slack, groups, mode, whether the keys are distinct.
const HEADER: usize = 5 * NUMBER;
/// Bytes of a group's head in modes 0 and 1 (cost, kind, limits).
const GROUP_HEAD: usize = 3 * NUMBER;
/// Bytes of a limit in modes 0 to 2: its `KEYS` index, then its algorithm and parameters.
const LIMIT: usize = NUMBER + WIRE;
/// Bytes of a limit's algorithm and parameters.
pub(crate) const WIRE: usize = 5 * NUMBER;

/// The largest number sent exactly.
const EXACT: u64 = 1 << 53;

/// `value` as the script reads it: a big-endian double, capped at 2^53.
pub(crate) fn number(value: u64) -> [u8; NUMBER] {
    // Below 2^53 the conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    (value.min(EXACT) as f64).to_be_bytes()
}

/// A call being written: the header's time and slack are filled in when it is sent
/// ([`finish`](Self::finish)).
#[derive(Clone, Debug)]
pub(crate) struct Call {
    bytes: Vec<u8>,
    groups: u64,
    mode: Mode,
    distinct: bool,
}

impl Call {
    pub(crate) fn new(mode: Mode) -> Self {
        let mut bytes = Vec::with_capacity(128);
        bytes.resize(HEADER, 0);
        Self {
            bytes,
            groups: 0,
            mode,
            distinct: false,
        }
    }

    /// Notes whether `keys` (the call's, in `KEYS` order) are all distinct: then no key
    /// appears in two groups, and the script keeps no state between them.
    pub(crate) fn note_keys(&mut self, keys: &[String]) {
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        self.distinct = keys.iter().all(|k| seen.insert(k.as_str()));
    }

    fn push(&mut self, value: u64) {
        self.bytes.extend_from_slice(&number(value));
    }

    /// Starts a group of modes 0 and 1: `cost` units, of `kind`, on `limits` limits (each
    /// appended next by [`limit`](Self::limit)).
    pub(crate) fn group(&mut self, cost: u64, kind: GroupKind, limits: usize) {
        self.groups = self.groups.saturating_add(1);
        self.push(cost);
        self.push(kind.code());
        self.push(limits as u64);
    }

    /// Starts a refund group (mode 2): `units` back, taken at `granted_us` (`None`: taken now,
    /// without a grant), on `limits` limits.
    pub(crate) fn refund_group(&mut self, units: u64, granted_us: Option<u64>, limits: usize) {
        self.groups = self.groups.saturating_add(1);
        self.push(units);
        match granted_us {
            Some(us) => self.push(us),
            None => self.bytes.extend_from_slice(&(-1.0f64).to_be_bytes()),
        }
        self.push(limits as u64);
    }

    /// Starts a lease group (mode 3): the cost, the units wanted ahead, the units refunded,
    /// the lease's time to live, on `limits` limits (each then [`limit`](Self::limit) and
    /// [`ledger`](Self::ledger)).
    pub(crate) fn lease_group(&mut self, head: [u64; 4], ttl_ms: u64, limits: usize) {
        self.groups = self.groups.saturating_add(1);
        for value in head {
            self.push(value);
        }
        self.push(ttl_ms);
        self.push(limits as u64);
    }

    /// A limit of the current group: its state at `KEYS[key]` (counting from 1), `wire` its
    /// algorithm and parameters as the script reads them (`RedisLimit`'s, encoded once).
    pub(crate) fn limit(&mut self, key: usize, wire: &[u8; WIRE]) {
        self.push(key as u64);
        self.bytes.extend_from_slice(wire);
    }

    /// A lease limit's ledger, at `KEYS[key]`, and its slack in units.
    pub(crate) fn ledger(&mut self, key: usize, slack: u64) {
        self.push(key as u64);
        self.push(slack);
    }

    /// Appends a group of modes 0 and 1 written on its own (its keys counted from 1), its
    /// keys now following `offset` others: each limit's `KEYS` index moves past them.
    pub(crate) fn append(&mut self, group: &Call, offset: usize) {
        let own = group.bytes.get(HEADER..).unwrap_or_default();
        let start = self.bytes.len();
        self.bytes.extend_from_slice(own);
        self.groups = self.groups.saturating_add(group.groups);
        let mut at = start.saturating_add(GROUP_HEAD);
        while let Some(field) = self.bytes.get_mut(at..at.saturating_add(NUMBER)) {
            let mut raw = [0u8; NUMBER];
            raw.copy_from_slice(field);
            // Key indexes are small whole numbers: the conversions are exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let index = f64::from_be_bytes(raw) as u64;
            field.copy_from_slice(&number(index.saturating_add(offset as u64)));
            at = at.saturating_add(LIMIT);
        }
    }

    /// The argument to send: the header written with the time (`None`: the server's `TIME`)
    /// and the expiry slack.
    pub(crate) fn finish(mut self, now_us: Option<u64>, slack_ms: u64) -> Vec<u8> {
        let now = match now_us {
            Some(us) => number(us),
            None => (-1.0f64).to_be_bytes(),
        };
        let fields = [
            now,
            number(slack_ms),
            number(self.groups),
            number(self.mode.code()),
            number(u64::from(self.distinct)),
        ];
        for (slot, field) in self.bytes.chunks_exact_mut(NUMBER).zip(fields) {
            slot.copy_from_slice(&field);
        }
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed window's fields as the script reads them: algorithm 3 and four parameters.
    fn wire(fields: [u64; 5]) -> [u8; WIRE] {
        let mut wire = [0; WIRE];
        for (slot, field) in wire.chunks_exact_mut(NUMBER).zip(fields) {
            slot.copy_from_slice(&number(field));
        }
        wire
    }

    fn numbers(bytes: &[u8]) -> Vec<f64> {
        bytes
            .chunks_exact(NUMBER)
            .map(|c| f64::from_be_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_group_is_its_head_then_each_limit_with_its_key() {
        let fields = [3, 10, 1_000_000, 4 + 64 * 4, 40];
        let mut call = Call::new(Mode::Independent);
        call.group(3, GroupKind::Enforced, 1);
        call.limit(1, &wire(fields));
        let bytes = call.finish(Some(1_000), 7);
        let n = numbers(&bytes);
        assert_eq!(&n[..5], &[1_000.0, 7.0, 1.0, 0.0, 0.0]);
        assert_eq!(&n[5..9], &[3.0, 1.0, 1.0, 1.0]);
        assert_eq!(&n[9..], &fields.map(|v| v as f64));
        let server_time = Call::new(Mode::Refund).finish(None, 0);
        assert_eq!(numbers(&server_time)[0], -1.0);
    }

    #[test]
    fn appended_groups_point_past_the_keys_before_them() {
        let limit = wire([1, 1, 100_000, 1_000_000, 0]);
        let mut one = Call::new(Mode::Independent);
        one.group(1, GroupKind::Record, 2);
        one.limit(1, &limit);
        one.limit(2, &limit);
        let mut all = Call::new(Mode::Independent);
        all.append(&one, 0);
        all.append(&one, 2);
        all.note_keys(&[
            "a".to_owned(),
            "b".to_owned(),
            "c".to_owned(),
            "d".to_owned(),
        ]);
        let n = numbers(&all.finish(None, 0));
        assert_eq!((n[2], n[4]), (2.0, 1.0), "two groups, keys distinct");
        // group 1: head at 5, limits at 8 and 14; group 2: head at 20, limits at 23 and 29
        assert_eq!([n[8], n[14], n[23], n[29]], [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(n[21], 2.0, "the kind is kept");
        let mut repeated = Call::new(Mode::Independent);
        repeated.note_keys(&["a".to_owned(), "a".to_owned()]);
        assert_eq!(
            numbers(&repeated.finish(None, 0))[4],
            0.0,
            "a key named twice"
        );
    }

    #[test]
    fn numbers_past_two_to_the_53_are_capped_there() {
        assert_eq!(
            f64::from_be_bytes(number(u64::MAX)),
            9_007_199_254_740_992.0
        );
        assert_eq!(f64::from_be_bytes(number(12_345)), 12_345.0);
    }
}
