//! The wire between Rust and the room functions, owned in one place: the
//! layout version and sizes, the policy argument and its cap kind, the
//! verdict tags and reject reasons, the arrival flags and lane ops, the
//! positions of the arguments every call starts with, the names of the
//! keys the Lua forms (`keys.rs`), and the constants the Lua shares with
//! the rest of the store (rate window, `seq` epoch). The Lua library gets
//! them from [`lua_constants`], generated here and put before its code
//! (`library.rs`), so nothing in the `.lua` files restates a number or a
//! word this side decodes or sends. Each function's own arguments and
//! its reply are in `calls.rs`.

use std::collections::HashSet;

use redis::Value;

use super::frontier::Description;
use super::keys;
use crate::clock::Millis;
use crate::store::{
    QueuePlace, QueueingMethod, RejectReason, RoomPolicy, RoomState, StoreError, Verdict,
    VisitorId, MAX_LANES, PASS_LIMIT, RATE_WINDOW_MS, SEQ_EPOCH_MS, SEQ_PER_MS, STRIDE,
};

/// The version of the room's key layout this build reads and writes. Every
/// room function checks the version its room's keys carry (meta field
/// `layout`) and refuses to decide on one it does not know (see
/// `docs/redis-layout.md`, "Upgrades").
pub const LAYOUT_VERSION: u64 = 1;

/// The oldest layout this build reads: 0, the unmarked layout of the
/// builds before versions (the same keys and formats as 1).
pub(super) const LAYOUT_OLDEST: u64 = 0;

/// The newest layout this build reads. Above `LAYOUT_VERSION` only in an
/// "expand" release, which reads the next layout before any build writes
/// it (`docs/redis-layout.md`, "Upgrades").
pub(super) const LAYOUT_NEWEST: u64 = LAYOUT_VERSION;

/// The sizes of the layout. The production sizes are those the cost
/// figures were measured with; tests build the library with small ones so
/// that tens of visitors reach the tail, cross chunks and fill a run's
/// bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Places in `queue` before newcomers go to the tail.
    pub head_window: u64,
    /// Ids per `tail_ids:<n>` chunk key.
    pub chunk: u64,
    /// Most visitors one run promotes.
    pub promote_max: u64,
    /// Queue places one maintenance run looks at for abandonment.
    pub sweep_max: u64,
    /// The version written and expected (tests bump it to play a newer build).
    pub version: u64,
    /// The oldest version this build still reads (and marks as its own
    /// when it meets it): see `docs/redis-layout.md`, "Upgrades".
    pub oldest: u64,
    /// The newest version this build reads (a room marked newer than
    /// `version` keeps its mark).
    pub newest: u64,
}

impl Layout {
    /// What the daemon runs with.
    pub const fn production() -> Self {
        Self {
            head_window: 2000,
            chunk: 65536,
            promote_max: 1000,
            sweep_max: 2000,
            version: LAYOUT_VERSION,
            oldest: LAYOUT_OLDEST,
            newest: LAYOUT_NEWEST,
        }
    }

    /// Test size: a head of 8 places, chunks of 16 ids, runs of 5.
    pub const fn small() -> Self {
        Self {
            head_window: 8,
            chunk: 16,
            promote_max: 5,
            sweep_max: 6,
            version: LAYOUT_VERSION,
            oldest: LAYOUT_OLDEST,
            newest: LAYOUT_NEWEST,
        }
    }
}

impl Default for Layout {
    fn default() -> Self {
        Self::production()
    }
}

/// Verdict tags, the first number of a verdict the functions return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(super) enum Tag {
    Admitted = 1,
    Queued = 2,
    Rejected = 3,
    Ended = 4,
    /// Held back for the Anywhere pool (region mode's `arrive`).
    Held = 5,
    /// Promotion went as far as one call may (`PROMOTE_MAX`) and the
    /// visitor waits within the free room: ask again (`poll`).
    More = 6,
}

impl Tag {
    const ALL: [Tag; 6] = [
        Tag::Admitted,
        Tag::Queued,
        Tag::Rejected,
        Tag::Ended,
        Tag::Held,
        Tag::More,
    ];

    fn lua_name(self) -> &'static str {
        match self {
            Tag::Admitted => "ADMITTED",
            Tag::Queued => "QUEUED",
            Tag::Rejected => "REJECTED",
            Tag::Ended => "ENDED",
            Tag::Held => "HELD",
            Tag::More => "MORE",
        }
    }
}

/// Reject reasons, the second number of a `Rejected` verdict.
fn reason_code(r: RejectReason) -> u64 {
    match r {
        RejectReason::Closed => 1,
        RejectReason::QueueFull => 2,
        RejectReason::OverLimit => 3,
    }
}

fn reason_of(code: u64) -> Option<RejectReason> {
    [
        RejectReason::Closed,
        RejectReason::QueueFull,
        RejectReason::OverLimit,
    ]
    .into_iter()
    .find(|r| reason_code(*r) == code)
}

/// The policy's fields in the order the `|`-joined policy argument carries
/// them (`policy_arg`), named as the Lua reads them (`ctx.lua`'s
/// `policy_of`).
pub(super) const POLICY_FIELDS: [&str; 14] = [
    "cap",
    "cap_kind",
    "rate",
    "session_ms",
    "renewal",
    "method",
    "max_queue",
    "abandon_ms",
    "grace_ms",
    "state",
    "key_ttl_ms",
    "revision",
    "lanes",
    "lanes_until",
];

/// What the policy's `cap` means (its `cap_kind` field; `lua/lib/ctx.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CapKind {
    /// The room's capacity (0: unlimited).
    Room,
    /// Region mode: the region's grants of sessions and admission tokens,
    /// kept in the regional store, limit instead (`region.rs`).
    Grant,
    /// Region mode for a room without a capacity limit: only its rate is a
    /// grant.
    RateGrant,
}

impl CapKind {
    const ALL: [CapKind; 3] = [CapKind::Room, CapKind::Grant, CapKind::RateGrant];

    fn text(self) -> &'static str {
        match self {
            CapKind::Room => "room",
            CapKind::Grant => "grant",
            CapKind::RateGrant => "rate_grant",
        }
    }

    fn lua_name(self) -> &'static str {
        match self {
            CapKind::Room => "CAP_ROOM",
            CapKind::Grant => "CAP_GRANT",
            CapKind::RateGrant => "CAP_RATE_GRANT",
        }
    }
}

/// One of the flags of an `arrive` call (`lua/arrive_many.lua`): each set
/// flag is one letter of the flags argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ArriveFlag {
    /// Hold back whoever finds the region's grant used up (region mode).
    Hold,
    /// Every id was just made ([`Arrival::New`](crate::store::Arrival)):
    /// look nobody up.
    Fresh,
    /// Every id was just made or not seen lately
    /// ([`Arrival::Unseen`](crate::store::Arrival)): the tail is not read.
    Unseen,
}

impl ArriveFlag {
    const ALL: [ArriveFlag; 3] = [ArriveFlag::Hold, ArriveFlag::Fresh, ArriveFlag::Unseen];

    fn letter(self) -> char {
        match self {
            ArriveFlag::Hold => 'h',
            ArriveFlag::Fresh => 'n',
            ArriveFlag::Unseen => 'u',
        }
    }

    fn lua_name(self) -> &'static str {
        match self {
            ArriveFlag::Hold => "ARRIVE_HOLD",
            ArriveFlag::Fresh => "ARRIVE_FRESH",
            ArriveFlag::Unseen => "ARRIVE_UNSEEN",
        }
    }
}

/// The flags of one `arrive` call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ArriveFlags {
    pub hold: bool,
    pub fresh: bool,
    pub unseen: bool,
}

impl ArriveFlags {
    /// The flags argument: the letters of the flags set (`unseen` is
    /// implied by `fresh`, so not sent with it), `-` for none.
    pub(super) fn encode(self) -> String {
        let set = [
            (ArriveFlag::Hold, self.hold),
            (ArriveFlag::Fresh, self.fresh),
            (ArriveFlag::Unseen, self.unseen && !self.fresh),
        ];
        let out: String = set
            .into_iter()
            .filter(|&(_, on)| on)
            .map(|(flag, _)| flag.letter())
            .collect();
        if out.is_empty() {
            "-".into()
        } else {
            out
        }
    }
}

/// What a `lane` call does (`lua/lane.lua`, its `op` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LaneOp {
    /// A visitor arrives.
    Arrive,
    /// A visitor arrives with an id just made: nobody to look up.
    ArriveNew,
    /// A visitor arrives with a stable id not seen lately: the tail is not read.
    ArriveUnseen,
    /// A queued visitor polls.
    Poll,
}

impl LaneOp {
    const ALL: [LaneOp; 4] = [
        LaneOp::Arrive,
        LaneOp::ArriveNew,
        LaneOp::ArriveUnseen,
        LaneOp::Poll,
    ];

    pub(super) fn letter(self) -> &'static str {
        match self {
            LaneOp::Arrive => "a",
            LaneOp::ArriveNew => "n",
            LaneOp::ArriveUnseen => "u",
            LaneOp::Poll => "p",
        }
    }

    fn lua_name(self) -> &'static str {
        match self {
            LaneOp::Arrive => "LANE_OP_ARRIVE",
            LaneOp::ArriveNew => "LANE_OP_NEW",
            LaneOp::ArriveUnseen => "LANE_OP_UNSEEN",
            LaneOp::Poll => "LANE_OP_POLL",
        }
    }
}

/// The arguments every room function starts with, in order (`ARG_NOW`,
/// ...; `lua/lib/ctx.lua`): the caller's time, the policy
/// ([`policy_arg`]) and the deadline. A function's own follow
/// (`calls.rs`).
pub(super) const COMMON_ARGS: [&str; 3] = ["now", "policy", "deadline"];

/// `ARG_<NAME>`: the Lua constant of argument `name` (without the `..`
/// that marks a variadic last one).
pub(super) fn arg_constant(name: &str) -> String {
    format!("ARG_{}", name.trim_end_matches("..").to_uppercase())
}

pub(super) fn method_name(m: QueueingMethod) -> &'static str {
    match m {
        QueueingMethod::Fifo => "fifo",
        QueueingMethod::Random => "random",
        QueueingMethod::Passthrough => "passthrough",
        QueueingMethod::Reject => "reject",
    }
}

pub(super) fn state_name(s: RoomState) -> &'static str {
    match s {
        RoomState::Open => "open",
        RoomState::QueueAll => "queue_all",
        RoomState::Paused => "paused",
        RoomState::Closed => "closed",
    }
}

/// The policy as one argument (parsed once per distinct string by the
/// Lua): the fields of [`POLICY_FIELDS`] joined by `|`.
pub(super) fn policy_arg(room: &RoomPolicy, cap_kind: CapKind, key_ttl_ms: Millis) -> String {
    format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{key_ttl_ms}|{}|{}|{}",
        room.total_active_users,
        cap_kind.text(),
        room.new_users_per_minute,
        room.session_duration_ms,
        u8::from(room.session_renewal),
        method_name(room.method),
        room.max_queue_length,
        room.abandon_after_ms,
        room.arrival_grace_ms,
        state_name(room.state),
        room.revision,
        lanes_arg(room),
        lanes_until_arg(room),
    )
}

/// The policy's `lanes_until` field: the end of the presale window (ms),
/// 0 without lanes or without a window.
fn lanes_until_arg(room: &RoomPolicy) -> Millis {
    if room.lanes.any() {
        room.lanes.only_until_ms
    } else {
        0
    }
}

/// The policy's `lanes` field: empty without lanes, else every lane's
/// share, the general queue's first (`s0,s1,...`).
fn lanes_arg(room: &RoomPolicy) -> String {
    if !room.lanes.any() {
        return String::new();
    }
    let n = usize::from(room.lanes.count);
    let shares: Vec<String> = room.lanes.shares[..=n]
        .iter()
        .map(|s| s.to_string())
        .collect();
    shares.join(",")
}

/// The Lua constants of `layout`: what the library's code starts with.
pub(super) fn lua_constants(layout: &Layout) -> String {
    let mut out =
        String::from("-- Generated by store/redis/wire.rs: the wire and the layout's sizes.\n");
    let mut line = |name: &str, value: String| out.push_str(&format!("local {name} = {value}\n"));
    line("LAYOUT_VERSION", layout.version.to_string());
    line("LAYOUT_VERSION_S", format!("'{}'", layout.version));
    line("LAYOUT_OLDEST", layout.oldest.to_string());
    line(
        "LAYOUT_NEWEST",
        layout.newest.max(layout.version).to_string(),
    );
    line("HEAD_WINDOW", layout.head_window.to_string());
    line("CHUNK", layout.chunk.to_string());
    line("PROMOTE_MAX", layout.promote_max.to_string());
    line("SWEEP_MAX", layout.sweep_max.to_string());
    line("RATE_WINDOW_MS", RATE_WINDOW_MS.to_string());
    line("SEQ_EPOCH_MS", SEQ_EPOCH_MS.to_string());
    line("SEQ_PER_MS", SEQ_PER_MS.to_string());
    line("MAX_LANES", MAX_LANES.to_string());
    line("STRIDE", STRIDE.to_string());
    line("PASS_LIMIT", PASS_LIMIT.to_string());
    for tag in Tag::ALL {
        line(tag.lua_name(), (tag as u64).to_string());
    }
    for (name, r) in [
        ("R_CLOSED", RejectReason::Closed),
        ("R_QUEUE_FULL", RejectReason::QueueFull),
        ("R_OVER_LIMIT", RejectReason::OverLimit),
    ] {
        line(name, reason_code(r).to_string());
    }
    let list = |items: &[&str]| {
        let quoted: Vec<String> = items.iter().map(|f| format!("'{f}'")).collect();
        format!("{{\n    {},\n}}", quoted.join(",\n    "))
    };
    line("POLICY_FIELDS", list(&POLICY_FIELDS));
    for (i, name) in COMMON_ARGS.iter().enumerate() {
        line(&arg_constant(name), (i + 1).to_string());
    }
    for (name, word) in named_words() {
        line(name, format!("'{word}'"));
    }
    line("ROOM_KEYS", list(&keys::PASSED));
    out
}

/// The words the Lua compares with or builds keys from, by the names it
/// knows them by: the arrival flags, the lane ops, the cap kinds and the
/// names of the keys it forms. No `.lua` file spells one itself.
fn named_words() -> Vec<(&'static str, String)> {
    let flags = ArriveFlag::ALL.map(|f| (f.lua_name(), f.letter().to_string()));
    let ops = LaneOp::ALL.map(|op| (op.lua_name(), op.letter().to_string()));
    let caps = CapKind::ALL.map(|k| (k.lua_name(), k.text().to_string()));
    let keys = [
        ("LANE_PREFIX", keys::LANE_PREFIX),
        ("TAIL_CHUNK_PREFIX", keys::TAIL_CHUNK_PREFIX),
        ("TAIL_SEQS", keys::TAIL_SEQS),
    ]
    .map(|(name, key)| (name, key.to_string()));
    flags
        .into_iter()
        .chain(ops)
        .chain(caps)
        .chain(keys)
        .collect()
}

pub(super) fn protocol(what: &str, v: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {v:?}"))
}

pub(super) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// One hour of a room's report (`lua/report_add.lua`'s fields, as a flat
/// field/value list): its minutes (0..59) that hold anything and are kept
/// past `now`. `None` for a list it cannot read.
pub(super) fn report_hour(
    fields: &Value,
    now: Millis,
) -> Option<Vec<(u64, crate::store::ReportMinute)>> {
    let Value::Array(items) = fields else {
        return None;
    };
    if items.len() % 2 != 0 {
        return None;
    }
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut minutes: std::collections::BTreeMap<u64, (Millis, crate::store::ReportMinute)> =
        std::collections::BTreeMap::new();
    for pair in items.chunks(2) {
        let field = text(&pair[0])?;
        let value: u64 = text(&pair[1])?.parse().ok()?;
        let (minute, rest) = field.split_once(':')?;
        let minute: u64 = minute.parse().ok()?;
        let entry = minutes.entry(minute).or_default();
        match rest.split_once(':') {
            None if rest == "k" => entry.0 = value,
            Some(("s", name)) => {
                entry.1.sums.insert(name.to_owned(), value);
            }
            Some(("p", name)) => {
                entry.1.peaks.insert(name.to_owned(), value);
            }
            _ => return None,
        }
    }
    Some(
        minutes
            .into_iter()
            .filter(|(_, (until, minute))| *until > now && !minute.is_empty())
            .map(|(m, (_, minute))| (m, minute))
            .collect(),
    )
}

/// A flat array of non-negative integers of exactly `N` elements.
pub(super) fn ints<const N: usize>(what: &str, v: &Value) -> Result<[u64; N], StoreError> {
    let Value::Array(items) = v else {
        return Err(protocol(what, v));
    };
    if items.len() != N {
        return Err(protocol(what, v));
    }
    let mut out = [0u64; N];
    for (o, item) in out.iter_mut().zip(items) {
        *o = as_u64(item).ok_or_else(|| protocol(what, v))?;
    }
    Ok(out)
}

/// One verdict from its numbers: `{ADMITTED, expiry}`, `{QUEUED, seq,
/// position, length}`, `{REJECTED, reason}`, `{ENDED}`; `Ok(None)` for
/// `{HELD}`.
fn verdict_of(nums: &[u64]) -> Option<Option<Verdict>> {
    let tag = *nums.first()?;
    Some(Some(match tag {
        t if t == Tag::Admitted as u64 => Verdict::Admitted {
            session_expires_ms: *nums.get(1)?,
        },
        t if t == Tag::Queued as u64 => Verdict::Queued(QueuePlace {
            seq: *nums.get(1)?,
            position: *nums.get(2)?,
            queue_length: *nums.get(3)?,
        }),
        t if t == Tag::Rejected as u64 => Verdict::Rejected(reason_of(*nums.get(1)?)?),
        t if t == Tag::Ended as u64 => Verdict::Ended,
        t if t == Tag::Held as u64 => return Some(None),
        _ => return None,
    }))
}

/// Whether a reply is `{MORE}`: the call must be made again.
pub(super) fn is_more(v: &Value) -> bool {
    matches!(v, Value::Array(items) if items.len() == 1 && as_u64(&items[0]) == Some(Tag::More as u64))
}

/// Decodes one function's verdict (exactly its numbers).
pub(super) fn decode_verdict(v: &Value) -> Result<Verdict, StoreError> {
    let Value::Array(items) = v else {
        return Err(protocol("verdict", v));
    };
    let nums: Option<Vec<u64>> = items.iter().map(as_u64).collect();
    // Each tag's exact length (a held or `MORE` reply is no verdict here).
    let length_ok = nums.as_deref().is_some_and(|x| {
        [
            (Tag::Admitted, 2),
            (Tag::Queued, 4),
            (Tag::Rejected, 2),
            (Tag::Ended, 1),
        ]
        .iter()
        .any(|&(tag, n)| x.first() == Some(&(tag as u64)) && x.len() == n)
    });
    match nums.as_deref().filter(|_| length_ok).and_then(verdict_of) {
        Some(Some(verdict)) => Ok(verdict),
        _ => Err(protocol("verdict", v)),
    }
}

/// Decodes a batch's verdicts: four integers each, or the seven of the
/// common case (see `lua/arrive_many.lua`); `None` for a visitor held back
/// for the Anywhere pool.
pub(super) fn decode_verdicts(v: &Value, n: usize) -> Result<Vec<Option<Verdict>>, StoreError> {
    let Value::Array(items) = v else {
        return Err(protocol("verdicts", v));
    };
    if items.len() == 7 && as_u64(&items[0]) == Some(0) {
        return decode_compact(v, n);
    }
    if items.len() != 4 * n {
        return Err(protocol("verdicts", v));
    }
    items
        .chunks(4)
        .map(|c| {
            let nums: Option<Vec<u64>> = c.iter().map(as_u64).collect();
            nums.as_deref()
                .and_then(verdict_of)
                .ok_or_else(|| protocol("verdicts", v))
        })
        .collect()
}

/// The common case's seven integers: `admitted` visitors admitted, `held`
/// held, `queued` queued at consecutive seqs and positions from the first.
fn decode_compact(v: &Value, n: usize) -> Result<Vec<Option<Verdict>>, StoreError> {
    let [_, admitted, expiry, held, queued, seq, position] = ints::<7>("verdicts", v)?;
    let counts = [admitted, held, queued].map(|c| usize::try_from(c).unwrap_or(usize::MAX));
    if counts.iter().try_fold(0usize, |sum, c| sum.checked_add(*c)) != Some(n) {
        return Err(protocol("verdicts", v));
    }
    let admitted = std::iter::repeat_n(
        Some(Verdict::Admitted {
            session_expires_ms: expiry,
        }),
        counts[0],
    );
    let held = std::iter::repeat_n(None, counts[1]);
    let queued = (0..queued).map(|k| {
        Some(Verdict::Queued(QueuePlace {
            seq: seq + k,
            position: position + k,
            queue_length: position + k,
        }))
    });
    Ok(admitted.chain(held).chain(queued).collect())
}

/// Decodes `lua/frontier.lua`'s answer.
pub(super) fn decode_description(v: &Value, made_ms: Millis) -> Result<Description, StoreError> {
    let bad = || protocol("frontier", v);
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let int = |i: usize| items.get(i).and_then(as_u64).ok_or_else(bad);
    let length = int(0)?;
    let bound = match items.get(1) {
        Some(Value::Int(b)) => *b,
        _ => return Err(bad()),
    };
    let reset_floor = int(2)?;
    let stale = int(3)?..int(4)?;
    let places = usize::try_from(int(5)?).map_err(|_| bad())?;
    let mut ended = HashSet::with_capacity(places);
    for item in items.iter().skip(6).take(places) {
        let hex = match item {
            Value::BulkString(b) => std::str::from_utf8(b).ok(),
            Value::SimpleString(s) => Some(s.as_str()),
            _ => None,
        };
        ended.insert(hex.and_then(VisitorId::from_hex).ok_or_else(bad)?);
    }
    let rest = &items[(6 + places).min(items.len())..];
    if rest.len() % 2 != 0 {
        return Err(bad());
    }
    let samples: Vec<(u64, u64)> = rest
        .chunks(2)
        .map(|p| Some((as_u64(&p[0])?, as_u64(&p[1])?)))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let frontier = if bound >= 0 {
        samples.first().map(|&(_, seq)| seq)
    } else {
        None
    };
    Ok(Description {
        made_ms,
        length,
        frontier,
        reset_floor,
        stale,
        ended,
        samples,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::domain::Lanes;

    #[test]
    fn every_verdict_decodes_from_the_numbers_lua_sends() {
        let v = |n: &[i64]| Value::Array(n.iter().map(|x| Value::Int(*x)).collect());
        assert_eq!(
            decode_verdict(&v(&[1, 7])).unwrap(),
            Verdict::Admitted {
                session_expires_ms: 7
            }
        );
        assert_eq!(
            decode_verdict(&v(&[2, 9, 3, 4])).unwrap(),
            Verdict::Queued(QueuePlace {
                seq: 9,
                position: 3,
                queue_length: 4
            })
        );
        for r in [
            RejectReason::Closed,
            RejectReason::QueueFull,
            RejectReason::OverLimit,
        ] {
            assert_eq!(
                decode_verdict(&v(&[3, reason_code(r) as i64])).unwrap(),
                Verdict::Rejected(r)
            );
        }
        assert_eq!(decode_verdict(&v(&[4])).unwrap(), Verdict::Ended);
        for bad in [&[][..], &[9], &[1], &[2, 1, 1], &[3, 9], &[4, 1], &[5]] {
            assert!(decode_verdict(&v(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_lua_constants_name_every_tag_reason_and_size() {
        let lua = lua_constants(&Layout::small());
        for name in [
            "ADMITTED = 1",
            "QUEUED = 2",
            "REJECTED = 3",
            "ENDED = 4",
            "HELD = 5",
            "MORE = 6",
            "R_CLOSED = 1",
            "R_QUEUE_FULL = 2",
            "R_OVER_LIMIT = 3",
            "HEAD_WINDOW = 8",
            "CHUNK = 16",
            "LAYOUT_VERSION = 1",
            "RATE_WINDOW_MS = 60000",
            "ARG_NOW = 1",
            "ARG_DEADLINE = 3",
            "ARRIVE_HOLD = 'h'",
            "LANE_OP_NEW = 'n'",
            "CAP_GRANT = 'grant'",
            "TAIL_SEQS = 'tail_seqs'",
        ] {
            assert!(lua.contains(&format!("local {name}\n")), "{name}");
        }
    }

    /// Every `.lua` file of the store, with its code (comments left out).
    pub(in crate::store::redis) fn lua_files() -> Vec<(std::path::PathBuf, String)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/redis/lua");
        let lib = format!("{dir}/lib");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .chain(std::fs::read_dir(&lib).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "lua"))
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                (p, code_of(&text))
            })
            .collect();
        files.sort();
        files
    }

    /// Lua code without its comments (no `.lua` file here has a `--` in a
    /// string or a block comment).
    pub(in crate::store::redis) fn code_of(text: &str) -> String {
        let lines = text.lines().map(|l| l.split("--").next().unwrap_or(""));
        lines.collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn no_lua_file_restates_a_generated_constant() {
        let generated = lua_constants(&Layout::production());
        for (path, code) in lua_files() {
            for line in generated.lines().skip(1) {
                let Some((name, _)) = line.strip_prefix("local ").and_then(|l| l.split_once(' '))
                else {
                    continue;
                };
                assert!(
                    !code.contains(&format!("local {name} =")),
                    "{} defines {name}, which wire.rs generates",
                    path.display()
                );
            }
            // A flag, a lane op, a cap kind or a key name is spelled by its name.
            for (name, word) in named_words() {
                for quoted in [format!("'{word}'"), format!("\"{word}\"")] {
                    assert!(
                        !code.contains(&quoted),
                        "{} spells {quoted}: use {name}, which wire.rs generates",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn arrival_flags_are_one_letter_each() {
        let flags = |hold, fresh, unseen| {
            ArriveFlags {
                hold,
                fresh,
                unseen,
            }
            .encode()
        };
        assert_eq!(flags(false, false, false), "-");
        assert_eq!(flags(true, false, false), "h");
        assert_eq!(flags(false, true, true), "n");
        assert_eq!(flags(true, true, false), "hn");
        assert_eq!(flags(false, false, true), "u");
        assert_eq!(flags(true, false, true), "hu");
    }

    #[test]
    fn the_policy_names_its_cap_kind() {
        let room = RoomPolicy {
            room: "r".into(),
            total_active_users: 5,
            new_users_per_minute: 60,
            session_duration_ms: 1_000,
            session_renewal: true,
            method: QueueingMethod::Fifo,
            max_queue_length: 0,
            abandon_after_ms: 2_000,
            arrival_grace_ms: 3_000,
            state: RoomState::Open,
            revision: 7,
            lanes: Default::default(),
        };
        let arg = policy_arg(&room, CapKind::Grant, 9);
        assert_eq!(arg, "5|grant|60|1000|1|fifo|0|2000|3000|open|9|7||0");
        assert_eq!(arg.split('|').count(), POLICY_FIELDS.len());
        // A presale window travels with the lanes, and only with them.
        let presale = RoomPolicy {
            lanes: Lanes::with_shares(&[300]).only_until(1_234),
            ..room.clone()
        };
        let arg = policy_arg(&presale, CapKind::Room, 9);
        assert!(arg.ends_with("|7|700,300|1234"), "{arg}");
        let no_lanes = RoomPolicy {
            lanes: Lanes::NONE.only_until(1_234),
            ..room
        };
        assert!(policy_arg(&no_lanes, CapKind::Room, 9).ends_with("|7||0"));
    }

    #[test]
    fn verdicts_decode() {
        let v = |xs: &[i64]| Value::Array(xs.iter().map(|x| Value::Int(*x)).collect());
        assert_eq!(
            decode_verdict(&v(&[1, 5])).ok(),
            Some(Verdict::Admitted {
                session_expires_ms: 5
            })
        );
        assert_eq!(
            decode_verdict(&v(&[2, 9, 1, 3])).ok(),
            Some(Verdict::Queued(QueuePlace {
                seq: 9,
                position: 1,
                queue_length: 3
            }))
        );
        assert_eq!(
            decode_verdict(&v(&[3, 2])).ok(),
            Some(Verdict::Rejected(RejectReason::QueueFull))
        );
        assert!(decode_verdict(&v(&[3, 9])).is_err());
        assert!(decode_verdict(&v(&[1, -5])).is_err());
        assert!(decode_verdict(&Value::Nil).is_err());
    }
}
