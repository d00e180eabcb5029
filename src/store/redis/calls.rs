//! Each room function's call: its own arguments, named once in the order
//! its script reads them, and its reply, decoded here and nowhere else.
//!
//! A function's own arguments follow the three every call starts with
//! (`wire::COMMON_ARGS`). [`Call::ARGS`] names them in order; the library
//! defines `ARG_<NAME>` for each at the top of the function
//! (`library.rs`), so the script reads `c.argv[ARG_VISITOR]`, and
//! [`Call::put`] sends the values by the same names (checked in debug
//! builds). A name ending in `..` is the first of the rest of the
//! arguments.

use redis::{Cmd, ToRedisArgs, Value};

use super::frontier::Description;
use super::library::RoomFn;
use super::region::{Applied, Bound, RateGrant, Snapshot};
use super::wire::{
    arg_constant, as_u64, decode_description, decode_verdict, decode_verdicts, ints, is_more,
    protocol, ArriveFlags, LaneOp,
};
use crate::clock::Millis;
use crate::store::{RoomStats, StoreError, Verdict, VisitorId, MAX_LANES};

/// One call of a room function.
pub(super) trait Call {
    /// The function called.
    const FN: RoomFn;
    /// Its own arguments' names, in the order it reads them.
    const ARGS: &'static [&'static str];
    /// What its reply decodes to.
    type Reply;
    /// Puts the arguments, by name, in the order of [`Call::ARGS`].
    fn put(&self, args: &mut Args<'_>);
    /// Decodes the reply: a protocol error for one it cannot read.
    fn decode(&self, v: &Value) -> Result<Self::Reply, StoreError>;
}

/// Where a call puts its arguments: after the common ones, each checked
/// (in debug builds) against the name its position has in the function.
pub(super) struct Args<'a> {
    cmd: &'a mut Cmd,
    names: &'static [&'static str],
    next: usize,
}

impl<'a> Args<'a> {
    pub(super) fn new(cmd: &'a mut Cmd, names: &'static [&'static str]) -> Self {
        Self {
            cmd,
            names,
            next: 0,
        }
    }

    /// Puts argument `name`; a variadic one (`name..`) may be put again.
    pub(super) fn put(&mut self, name: &str, value: impl ToRedisArgs) -> &mut Self {
        let expected = self.names.get(self.next).copied().unwrap_or("(none)");
        debug_assert_eq!(
            arg_constant(expected),
            arg_constant(name),
            "argument {} of {:?}",
            self.next,
            self.names
        );
        if !expected.ends_with("..") {
            self.next += 1;
        }
        self.cmd.arg(value);
        self
    }

    /// Checks (in debug builds) that every argument but a variadic one was put.
    pub(super) fn finish(self) {
        let fixed = self.names.iter().filter(|n| !n.ends_with("..")).count();
        debug_assert!(self.next >= fixed, "arguments missing: {:?}", self.names);
    }
}

/// A poll or a lane call answers a verdict, or says to ask again.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    Done(Verdict),
    /// `{MORE}`: promotion went as far as one call may.
    More,
}

fn step(v: &Value) -> Result<Step, StoreError> {
    if is_more(v) {
        Ok(Step::More)
    } else {
        decode_verdict(v).map(Step::Done)
    }
}

/// `lua/arrive_many.lua`: new visitors, decided together.
pub(super) struct Arrive<'a> {
    pub flags: ArriveFlags,
    pub visitors: &'a [VisitorId],
}

impl Call for Arrive<'_> {
    const FN: RoomFn = RoomFn::Arrive;
    const ARGS: &'static [&'static str] = &["flags", "visitors.."];
    /// A verdict per visitor, `None` for one held back for the Anywhere pool.
    type Reply = Vec<Option<Verdict>>;

    fn put(&self, args: &mut Args<'_>) {
        args.put("flags", self.flags.encode());
        for v in self.visitors {
            args.put("visitors", v.to_hex());
        }
    }

    fn decode(&self, v: &Value) -> Result<Self::Reply, StoreError> {
        decode_verdicts(v, self.visitors.len())
    }
}

/// `lua/poll.lua`: a poll in the general queue.
pub(super) struct Poll {
    pub visitor: VisitorId,
    /// The seq its ticket carries.
    pub seq: u64,
}

impl Call for Poll {
    const FN: RoomFn = RoomFn::Poll;
    const ARGS: &'static [&'static str] = &["visitor", "seq"];
    type Reply = Step;

    fn put(&self, args: &mut Args<'_>) {
        args.put("visitor", self.visitor.to_hex())
            .put("seq", self.seq);
    }

    fn decode(&self, v: &Value) -> Result<Step, StoreError> {
        step(v)
    }
}

/// `lua/lane.lua`: an arrival in, or a poll from, a priority lane.
pub(super) struct Lane {
    pub op: LaneOp,
    pub visitor: VisitorId,
    /// 1 ..
    pub lane: u8,
    /// The seq its ticket carries (a poll's; 0 for an arrival).
    pub seq: u64,
}

impl Call for Lane {
    const FN: RoomFn = RoomFn::Lane;
    const ARGS: &'static [&'static str] = &["op", "visitor", "lane", "seq"];
    type Reply = Step;

    fn put(&self, args: &mut Args<'_>) {
        args.put("op", self.op.letter())
            .put("visitor", self.visitor.to_hex())
            .put("lane", self.lane)
            .put("seq", self.seq);
    }

    fn decode(&self, v: &Value) -> Result<Step, StoreError> {
        step(v)
    }
}

/// `lua/check_in.lua`: an admitted visitor checks in.
pub(super) struct CheckIn {
    pub visitor: VisitorId,
    /// The session expiry its ticket carries.
    pub ticket_expires_ms: Millis,
}

impl Call for CheckIn {
    const FN: RoomFn = RoomFn::CheckIn;
    const ARGS: &'static [&'static str] = &["visitor", "ticket"];
    /// The session's expiry; `None` when it was ended or expired.
    type Reply = Option<Millis>;

    fn put(&self, args: &mut Args<'_>) {
        args.put("visitor", self.visitor.to_hex())
            .put("ticket", self.ticket_expires_ms);
    }

    fn decode(&self, v: &Value) -> Result<Self::Reply, StoreError> {
        match v {
            Value::Nil => Ok(None),
            v => as_u64(v).map(Some).ok_or_else(|| protocol("check_in", v)),
        }
    }
}

/// `lua/release.lua`: one bounded part of ending a session or a place.
pub(super) struct Release<'a> {
    /// The visitor (hex).
    pub visitor: &'a str,
    /// The bounds of its session's expiry, if known (empty if not).
    pub expiry_min: &'a str,
    pub expiry_max: &'a str,
    /// Where the search by visitor goes on.
    pub cursor: &'a str,
}

/// What one part of a release found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Released {
    /// Done: whether there was anything to end.
    Done(bool),
    /// Not found yet: go on from this cursor.
    Next(String),
}

impl Call for Release<'_> {
    const FN: RoomFn = RoomFn::Release;
    const ARGS: &'static [&'static str] = &["visitor", "expiry_min", "expiry_max", "cursor"];
    type Reply = Released;

    fn put(&self, args: &mut Args<'_>) {
        args.put("visitor", self.visitor)
            .put("expiry_min", self.expiry_min)
            .put("expiry_max", self.expiry_max)
            .put("cursor", self.cursor);
    }

    fn decode(&self, v: &Value) -> Result<Released, StoreError> {
        match v {
            Value::Int(0) => Ok(Released::Done(false)),
            Value::Int(1) => Ok(Released::Done(true)),
            Value::Array(next) => match next.as_slice() {
                [Value::BulkString(b)] => Ok(Released::Next(String::from_utf8_lossy(b).into())),
                [Value::SimpleString(s)] => Ok(Released::Next(s.clone())),
                _ => Err(protocol("release", v)),
            },
            v => Err(protocol("release", v)),
        }
    }
}

/// `lua/stats.lua`: the room's live figures.
pub(super) struct Stats;

impl Call for Stats {
    const FN: RoomFn = RoomFn::Stats;
    const ARGS: &'static [&'static str] = &[];
    type Reply = RoomStats;

    fn put(&self, _: &mut Args<'_>) {}

    fn decode(&self, reply: &Value) -> Result<RoomStats, StoreError> {
        let bad = || protocol("stats", reply);
        let Value::Array(items) = reply else {
            return Err(bad());
        };
        let [active, queued, admitted, oldest, lanes @ ..] = items.as_slice() else {
            return Err(bad());
        };
        let mut lane_queued = [0; MAX_LANES];
        for (n, v) in lane_queued.iter_mut().zip(lanes) {
            *n = as_u64(v).ok_or_else(bad)?;
        }
        let count = |v: &Value| as_u64(v).ok_or_else(bad);
        // -1 stands for an empty window.
        let oldest_admission_ms = match oldest {
            Value::Int(-1) => None,
            v => Some(count(v)?),
        };
        Ok(RoomStats {
            active: count(active)?,
            queued: count(queued)?,
            admitted_last_minute: count(admitted)?,
            oldest_admission_ms,
            lane_queued,
        })
    }
}

/// `lua/frontier.lua`: a new description of the queue, writing the polls
/// answered since the last one.
pub(super) struct Frontier<'a> {
    /// How far ahead (ms) the answer must hold.
    pub ahead_ms: Millis,
    /// One sample per 1/`precision` of the distance from the frontier.
    pub precision: u64,
    /// The shortest queue worth describing.
    pub min_queue: u64,
    /// Visitors whose polls were answered from the last description, at `now_ms`.
    pub polls: &'a [VisitorId],
    pub now_ms: Millis,
}

impl Call for Frontier<'_> {
    const FN: RoomFn = RoomFn::Frontier;
    const ARGS: &'static [&'static str] = &["ahead_ms", "precision", "min_queue", "polls.."];
    type Reply = Description;

    fn put(&self, args: &mut Args<'_>) {
        args.put("ahead_ms", self.ahead_ms)
            .put("precision", self.precision)
            .put("min_queue", self.min_queue);
        let at = self.now_ms.to_string();
        for v in self.polls {
            args.put("polls", v.to_hex()).put("polls", at.as_str());
        }
    }

    fn decode(&self, v: &Value) -> Result<Description, StoreError> {
        decode_description(v, self.now_ms)
    }
}

/// `lua/start_event.lua`: starts an event's admissions.
pub(super) struct StartEvent<'a> {
    /// The event's key (name@start).
    pub key: &'a str,
    pub prequeue_seq: u64,
    pub start_seq: u64,
    pub shuffle: bool,
    /// The MINSTD state the shuffle starts from.
    pub seed: u64,
}

impl Call for StartEvent<'_> {
    const FN: RoomFn = RoomFn::StartEvent;
    const ARGS: &'static [&'static str] =
        &["event", "prequeue_seq", "start_seq", "shuffle", "seed"];
    /// How many visitors were shuffled (0: already started).
    type Reply = u64;

    fn put(&self, args: &mut Args<'_>) {
        args.put("event", self.key)
            .put("prequeue_seq", self.prequeue_seq)
            .put("start_seq", self.start_seq)
            .put("shuffle", u8::from(self.shuffle))
            .put("seed", self.seed);
    }

    fn decode(&self, v: &Value) -> Result<u64, StoreError> {
        as_u64(v).ok_or_else(|| protocol("start_event", v))
    }
}

/// `lua/reset.lua`: empties the room.
pub(super) struct Reset {
    /// The first seq the reset room may hand out.
    pub floor: u64,
}

impl Call for Reset {
    const FN: RoomFn = RoomFn::Reset;
    const ARGS: &'static [&'static str] = &["floor"];
    type Reply = ();

    fn put(&self, args: &mut Args<'_>) {
        args.put("floor", self.floor);
    }

    fn decode(&self, v: &Value) -> Result<(), StoreError> {
        match v {
            Value::Int(1) => Ok(()),
            v => Err(protocol("reset", v)),
        }
    }
}

/// `lua/check.lua`: the room's invariants, checked as its keys stand.
pub(super) struct Check;

impl Call for Check {
    const FN: RoomFn = RoomFn::Check;
    const ARGS: &'static [&'static str] = &[];
    /// What is violated, one sentence each.
    type Reply = Vec<String>;

    fn put(&self, _: &mut Args<'_>) {}

    fn decode(&self, v: &Value) -> Result<Vec<String>, StoreError> {
        match v {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
                    Value::SimpleString(s) => Ok(s.clone()),
                    _ => Err(protocol("check", v)),
                })
                .collect(),
            v => Err(protocol("check", v)),
        }
    }
}

/// `lua/region_begin.lua`: the start of a region's sync of the room.
pub(super) struct RegionBegin {
    /// How long this instance holds the sync turn.
    pub turn_ms: Millis,
    /// Take the turn even if another instance holds it.
    pub force: bool,
}

impl Call for RegionBegin {
    const FN: RoomFn = RoomFn::RegionBegin;
    const ARGS: &'static [&'static str] = &["turn_ms", "force"];
    /// `None` when another instance holds the turn.
    type Reply = Option<Snapshot>;

    fn put(&self, args: &mut Args<'_>) {
        args.put("turn_ms", self.turn_ms)
            .put("force", u8::from(self.force));
    }

    fn decode(&self, reply: &Value) -> Result<Option<Snapshot>, StoreError> {
        // The nine figures, then (rank, seq) pairs.
        const FIGURES: usize = 9;
        if matches!(reply, Value::Nil) {
            return Ok(None);
        }
        let bad = || protocol("region_begin", reply);
        let Value::Array(items) = reply else {
            return Err(bad());
        };
        let nums: Vec<u64> = items
            .iter()
            .map(as_u64)
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        if nums.len() < FIGURES || (nums.len() - FIGURES) % 2 != 0 {
            return Err(bad());
        }
        let (figures, samples) = nums.split_at(FIGURES);
        let &[active, raised, lowered, queued, head_seq, arrivals, window, rate_raised, rate_lowered] =
            figures
        else {
            return Err(bad());
        };
        Ok(Some(Snapshot {
            active,
            raised,
            lowered,
            queued,
            head_seq,
            arrivals,
            window,
            rate_raised,
            rate_lowered,
            samples: samples.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
        }))
    }
}

/// `lua/region_apply.lua`: applies the global store's answer to the grants.
pub(super) struct RegionApply {
    /// The global store's totals for this region (slots).
    pub raised: u64,
    pub returned: u64,
    /// The grant to lower toward (`None`: keep).
    pub target: Option<u64>,
    pub bound: Bound,
    /// The same for admission tokens.
    pub rate: RateGrant,
}

impl Call for RegionApply {
    const FN: RoomFn = RoomFn::RegionApply;
    const ARGS: &'static [&'static str] = &[
        "raised",
        "lowered",
        "target",
        "bound",
        "bound_until",
        "rate_raised",
        "rate_lowered",
        "rate_target",
    ];
    type Reply = Applied;

    fn put(&self, args: &mut Args<'_>) {
        // -1: keep (a target; a bound), 0: nobody waits elsewhere (a bound).
        let keep = |t: Option<u64>| t.map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX));
        let (bound, until) = match self.bound {
            Bound::Keep => (-1, 0),
            Bound::None => (0, 0),
            Bound::Seq { seq, until_ms } => (i64::try_from(seq).unwrap_or(i64::MAX), until_ms),
        };
        args.put("raised", self.raised)
            .put("lowered", self.returned)
            .put("target", keep(self.target))
            .put("bound", bound)
            .put("bound_until", until)
            .put("rate_raised", self.rate.raised)
            .put("rate_lowered", self.rate.returned)
            .put("rate_target", keep(self.rate.target));
    }

    fn decode(&self, v: &Value) -> Result<Applied, StoreError> {
        let [raised, lowered, given, rate_raised, rate_lowered, rate_given] =
            ints::<6>("region_apply", v)?;
        Ok(Applied {
            raised,
            lowered,
            given,
            rate_raised,
            rate_lowered,
            rate_given,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints_of(xs: &[i64]) -> Value {
        Value::Array(xs.iter().map(|x| Value::Int(*x)).collect())
    }

    /// The arguments `call` sends after the common ones.
    fn sent<C: Call>(call: &C) -> Vec<String> {
        let mut cmd = redis::cmd("FCALL");
        let mut args = Args::new(&mut cmd, C::ARGS);
        call.put(&mut args);
        args.finish();
        cmd.args_iter()
            .skip(1)
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn region_apply_sends_keep_and_nobody_as_the_script_reads_them() {
        let rate = RateGrant {
            raised: 7,
            returned: 1,
            target: None,
        };
        let call = |target, bound| RegionApply {
            raised: 10,
            returned: 2,
            target,
            bound,
            rate,
        };
        assert_eq!(
            sent(&call(Some(5), Bound::Keep)),
            ["10", "2", "5", "-1", "0", "7", "1", "-1"]
        );
        let seq = Bound::Seq {
            seq: 99,
            until_ms: 1234,
        };
        assert_eq!(
            sent(&call(None, seq)),
            ["10", "2", "-1", "99", "1234", "7", "1", "-1"]
        );
        assert_eq!(sent(&call(None, Bound::None))[3..5], ["0", "0"]);
    }

    #[test]
    fn a_variadic_argument_takes_the_rest() {
        let visitors = [VisitorId([1; 16]), VisitorId([2; 16])];
        let arrive = Arrive {
            flags: ArriveFlags::default(),
            visitors: &visitors,
        };
        let sent = sent(&arrive);
        assert_eq!(sent.len(), 3);
        assert_eq!(sent[0], "-");
        assert_eq!(sent[2], visitors[1].to_hex());
    }

    #[test]
    fn region_begin_refuses_a_short_or_odd_reply() {
        let call = RegionBegin {
            turn_ms: 1,
            force: false,
        };
        assert_eq!(call.decode(&Value::Nil).unwrap(), None);
        let snap = call
            .decode(&ints_of(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 42]))
            .unwrap()
            .unwrap();
        assert_eq!((snap.active, snap.rate_lowered), (1, 9));
        assert_eq!(snap.samples, [(0, 42)]);
        for bad in [
            &[][..],
            &[1, 2, 3],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 0],
            &[-1; 9],
        ] {
            assert!(call.decode(&ints_of(bad)).is_err(), "{bad:?}");
        }
        assert!(call.decode(&Value::Int(1)).is_err());
    }

    #[test]
    fn region_apply_refuses_a_short_reply() {
        let call = RegionApply {
            raised: 0,
            returned: 0,
            target: None,
            bound: Bound::Keep,
            rate: RateGrant::default(),
        };
        assert!(call.decode(&ints_of(&[1, 2, 3, 4, 5])).is_err());
        let applied = call.decode(&ints_of(&[1, 2, 3, 4, 5, 6])).unwrap();
        assert_eq!((applied.raised, applied.rate_given), (1, 6));
    }

    #[test]
    fn a_release_goes_on_from_its_cursor_or_ends() {
        let call = Release {
            visitor: "v",
            expiry_min: "",
            expiry_max: "",
            cursor: "b:0",
        };
        assert_eq!(call.decode(&Value::Int(1)).unwrap(), Released::Done(true));
        assert_eq!(call.decode(&Value::Int(0)).unwrap(), Released::Done(false));
        let next = Value::Array(vec![Value::BulkString(b"t:3".to_vec())]);
        assert_eq!(call.decode(&next).unwrap(), Released::Next("t:3".into()));
        assert!(call.decode(&Value::Int(2)).is_err());
        assert!(call.decode(&Value::Array(vec![])).is_err());
    }
}
