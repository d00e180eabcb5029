//! The room functions as one Redis function library (Redis 7 `FUNCTION
//! LOAD`, called with `FCALL`).
//!
//! The library is the wire's constants (`wire::lua_constants`), then the
//! shared code in `lua/lib/` (each file names, in its header, the keys it
//! reads and writes and the invariants it keeps), then each room function
//! from `lua/*.lua`, registered as a function that begins with `begin`
//! (its context `c`, or a refusal) and the positions of its own arguments
//! (`ARG_<NAME>`, named in `calls.rs`). Sent as scripts, Redis would build the
//! helpers again before every call, which cost about 60,000 instructions a
//! call: more than a whole batch of admissions. In a library they are
//! built once, when the library is loaded.
//!
//! The library's name and its functions' names carry a hash of the code, so
//! instances running different versions never replace each other's
//! functions, as with `EVALSHA`. A server without the library (restarted
//! without persistence, `FUNCTION FLUSH`, a new cluster node) answers
//! "Function not found"; the call then loads the library (on every primary
//! of a cluster) and is sent again.

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Value};

use super::calls::{self, Call};
use super::wire::{arg_constant, lua_constants, Layout, COMMON_ARGS};
use crate::store::StoreError;

/// What a writing call waits for: `replicas` acknowledgements of its
/// writes (`WAIT`), for at most `timeout_ms`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Acks {
    pub(crate) replicas: u32,
    pub(crate) timeout_ms: u64,
}

impl Acks {
    /// The `WAIT` that follows a writing call on its connection.
    pub(crate) fn wait(&self) -> Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(self.timeout_ms);
        wait
    }

    /// Whether `acked` replicas are enough. A call whose writes too few
    /// replicas hold decided nothing the caller may act on: a failover
    /// could take it back (what it wrote still counts against the limits).
    pub(crate) fn check(&self, acked: i64) -> Result<(), StoreError> {
        if acked >= i64::from(self.replicas) {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "{acked} of {} replicas acknowledged the decision within {} ms",
                self.replicas, self.timeout_ms
            )))
        }
    }
}

/// The shared code, in the order each file's helpers are needed.
const LIB: [(&str, &str); 7] = [
    ("ctx", include_str!("lua/lib/ctx.lua")),
    ("sessions", include_str!("lua/lib/sessions.lua")),
    ("window", include_str!("lua/lib/window.lua")),
    ("head", include_str!("lua/lib/head.lua")),
    ("tail", include_str!("lua/lib/tail.lua")),
    ("lanes", include_str!("lua/lib/lanes.lua")),
    ("room", include_str!("lua/lib/room.lua")),
];

/// One room function: its name, its own arguments' names (`calls.rs`),
/// and its file (run with the call's context `c`).
type RoomScript = (RoomFn, &'static str, &'static [&'static str], &'static str);

const ROOM_SCRIPTS: [RoomScript; 12] = [
    (
        RoomFn::Arrive,
        "arrive",
        calls::Arrive::ARGS,
        include_str!("lua/arrive_many.lua"),
    ),
    (
        RoomFn::Poll,
        "poll",
        calls::Poll::ARGS,
        include_str!("lua/poll.lua"),
    ),
    (
        RoomFn::Lane,
        "lane",
        calls::Lane::ARGS,
        include_str!("lua/lane.lua"),
    ),
    (
        RoomFn::CheckIn,
        "check_in",
        calls::CheckIn::ARGS,
        include_str!("lua/check_in.lua"),
    ),
    (
        RoomFn::Release,
        "release",
        calls::Release::ARGS,
        include_str!("lua/release.lua"),
    ),
    (
        RoomFn::Stats,
        "stats",
        calls::Stats::ARGS,
        include_str!("lua/stats.lua"),
    ),
    (
        RoomFn::Frontier,
        "frontier",
        calls::Frontier::ARGS,
        include_str!("lua/frontier.lua"),
    ),
    (
        RoomFn::StartEvent,
        "start_event",
        calls::StartEvent::ARGS,
        include_str!("lua/start_event.lua"),
    ),
    (
        RoomFn::RegionBegin,
        "region_begin",
        calls::RegionBegin::ARGS,
        include_str!("lua/region_begin.lua"),
    ),
    (
        RoomFn::RegionApply,
        "region_apply",
        calls::RegionApply::ARGS,
        include_str!("lua/region_apply.lua"),
    ),
    (
        RoomFn::Reset,
        "reset",
        calls::Reset::ARGS,
        include_str!("lua/reset.lua"),
    ),
    (
        RoomFn::Check,
        "check",
        calls::Check::ARGS,
        include_str!("lua/check.lua"),
    ),
];

/// The positions of a function's own arguments, `ARG_<NAME>`, from the
/// first after the common ones (`wire::COMMON_ARGS`).
fn arg_positions(args: &[&str]) -> String {
    let first = COMMON_ARGS.len() + 1;
    args.iter()
        .enumerate()
        .map(|(i, name)| format!("local {} = {}\n", arg_constant(name), first + i))
        .collect()
}

/// The room functions.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RoomFn {
    Arrive,
    Poll,
    Lane,
    CheckIn,
    Release,
    Stats,
    Frontier,
    StartEvent,
    RegionBegin,
    RegionApply,
    Reset,
    Check,
}

/// The library's code and its functions' versioned names.
pub(crate) struct Library {
    code: String,
    names: Vec<String>,
}

impl Library {
    /// The library of this build, with the sizes of `layout` (its
    /// constants come first: `wire::lua_constants`).
    pub(crate) fn new(layout: &Layout) -> Self {
        let mut shared = lua_constants(layout);
        for (_, file) in LIB {
            shared.push_str(file);
        }
        let mut source = shared.clone();
        for (_, _, args, body) in ROOM_SCRIPTS {
            source.push_str(&arg_positions(args));
            source.push_str(body);
        }
        // A short hash is enough to tell versions apart; the code is ours.
        let hash = redis::Script::new(&source).get_hash().to_string();
        let version = &hash[..12];
        let mut code = format!("#!lua name=waitroom_{version}\n{shared}\n");
        let mut names = Vec::with_capacity(ROOM_SCRIPTS.len());
        for (i, (f, name, args, body)) in ROOM_SCRIPTS.into_iter().enumerate() {
            debug_assert_eq!(f as usize, i);
            let name = format!("waitroom_{version}_{name}");
            // `begin` refuses a call whose caller gave up on it, or that
            // would decide on a layout or settings this call cannot trust.
            let positions = arg_positions(args);
            code.push_str(&format!(
                "redis.register_function('{name}', function(keys, args)\n\
                 local c = begin(keys, args)\n\
                 if c.refused then return c.refused end\n\
                 {positions}{body}\nend)\n"
            ));
            names.push(name);
        }
        Self { code, names }
    }

    /// An `FCALL` of `f` on `keys`; the caller adds the arguments.
    pub(crate) fn call(&self, f: RoomFn, keys: &[String]) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.names[f as usize]).arg(keys.len()).arg(keys);
        cmd
    }

    /// Runs `call`; loads the library first if the server does not have
    /// it. With `acks`, the call is followed by `WAIT` in the same round
    /// trip (on a Cluster, both go to the primary of the room's slot: the
    /// pipeline takes the route of its one keyed command), and a call too
    /// few replicas acknowledged is an error inside the result.
    pub(crate) async fn run<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        call: &Cmd,
        acks: Option<Acks>,
    ) -> Result<Result<Value, StoreError>, RedisError> {
        match send(conn, call, acks).await {
            Err(e) if missing_function(&e) => {
                redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&self.code)
                    .query_async::<Value>(conn)
                    .await?;
                send(conn, call, acks).await
            }
            result => result,
        }
    }

    #[cfg(test)]
    pub(crate) fn code(&self) -> &str {
        &self.code
    }
}

/// The room functions' library exactly as Redis loads it (`FUNCTION LOAD`),
/// with the sizes of `layout`: for tools that check the Lua
/// (`tests/lint.rs` runs luacheck on it).
pub fn function_library(layout: &Layout) -> String {
    Library::new(layout).code
}

async fn send<C: ConnectionLike + Send>(
    conn: &mut C,
    call: &Cmd,
    acks: Option<Acks>,
) -> Result<Result<Value, StoreError>, RedisError> {
    let Some(acks) = acks else {
        return Ok(Ok(call.query_async::<Value>(conn).await?));
    };
    let mut pipe = redis::pipe();
    // The errors come back as values: the call's own (a refusal, a missing
    // library) is returned as it is, not folded into a pipeline error.
    pipe.add_command(call.clone())
        .add_command(acks.wait())
        .ignore_errors();
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    let (Some(wait), Some(value), None) = (replies.pop(), replies.pop(), replies.pop()) else {
        return Err((redis::ErrorKind::UnexpectedReturnType, "not two replies").into());
    };
    let value = value.extract_error()?;
    match wait.extract_error()? {
        Value::Int(acked) => Ok(acks.check(acked).map(|()| value)),
        _ => Err((
            redis::ErrorKind::UnexpectedReturnType,
            "WAIT: not an integer",
        )
            .into()),
    }
}

/// "ERR Function not found": the server does not have this version loaded.
fn missing_function(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.starts_with("Function not found"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_function_is_registered_under_its_versioned_name() {
        let lib = Library::new(&Layout::production());
        assert!(lib.code().starts_with("#!lua name=waitroom_"));
        for (f, name, _, _) in ROOM_SCRIPTS {
            let full = &lib.names[f as usize];
            assert!(full.ends_with(&format!("_{name}")), "{full}");
            assert!(lib.code().contains(&format!("register_function('{full}'")));
        }
    }

    #[test]
    fn every_function_reads_its_arguments_by_name() {
        let code = |text: &str| crate::store::redis::wire::tests::code_of(text);
        let lib: Vec<&str> = LIB.iter().map(|(_, text)| *text).collect();
        let bodies = ROOM_SCRIPTS.iter().map(|(_, _, _, body)| *body);
        for text in lib.iter().copied().chain(bodies) {
            let code = code(text);
            for read in ["argv[", "ARGV["] {
                for (at, _) in code.match_indices(read) {
                    let next = code[at + read.len()..].chars().next();
                    assert!(
                        !next.is_some_and(|c| c.is_ascii_digit()),
                        "an argument read by number: {}",
                        &code[at..(at + 20).min(code.len())]
                    );
                }
            }
        }
        for (_, name, args, body) in ROOM_SCRIPTS {
            let code = code(body);
            for arg in args {
                let constant = arg_constant(arg);
                assert!(code.contains(&constant), "{name} never reads {constant}");
            }
        }
    }

    /// The functions `text` defines (`local function name` / `function name`).
    fn defined(text: &str) -> BTreeSet<&str> {
        text.lines()
            .filter_map(|l| {
                l.strip_prefix("local function ")
                    .or_else(|| l.strip_prefix("function "))
            })
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect()
    }

    /// Whether `code` calls `name` (not a field or method of that name).
    fn calls(code: &str, name: &str) -> bool {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        code.match_indices(name).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + name.len()..].trim_start();
            !before.is_some_and(|c| ident(c) || c == '.' || c == ':') && after.starts_with('(')
        })
    }

    #[test]
    fn each_function_names_the_lib_helpers_it_calls() {
        let helpers: BTreeSet<&str> = LIB.iter().flat_map(|(_, text)| defined(text)).collect();
        for (_, name, _, body) in ROOM_SCRIPTS {
            let named: BTreeSet<&str> = body
                .lines()
                .filter_map(|l| l.strip_prefix("-- uses:"))
                .flat_map(|l| l.split(','))
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect();
            let own = defined(body);
            let code = crate::store::redis::wire::tests::code_of(body);
            let called: BTreeSet<&str> = helpers
                .iter()
                .copied()
                .filter(|h| !own.contains(h) && calls(&code, h))
                .collect();
            assert_eq!(
                named, called,
                "{name}: its header's `-- uses:` lines must name the lib helpers it calls"
            );
        }
    }

    #[test]
    fn a_call_sends_its_key_count_keys_then_arguments() {
        let lib = Library::new(&Layout::production());
        let keys = ["a".to_string(), "b".to_string(), "c".to_string()];
        let mut call = lib.call(RoomFn::Poll, &keys);
        call.arg(7).arg("x");
        let packed = String::from_utf8(call.get_packed_command()).unwrap();
        let parts: Vec<&str> = packed
            .split("\r\n")
            .filter(|p| !p.starts_with(['*', '$']))
            .collect();
        assert_eq!(
            parts,
            [
                "FCALL",
                lib.names[RoomFn::Poll as usize].as_str(),
                "3",
                "a",
                "b",
                "c",
                "7",
                "x",
                ""
            ]
        );
    }
}
