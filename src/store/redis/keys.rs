//! The names of a room's keys, declared once: the keys every room function
//! is passed (in `KEYS` order) and the ones the functions form themselves
//! beside them. All share the room's hash tag (one Cluster slot). The Lua
//! gets the names from `wire::lua_constants` and forms the keys from them
//! (`lua/lib/ctx.lua`, `keys_of`); tests name keys with these functions.

/// The keys every room function is passed, in `KEYS` order, each
/// `wr:{<room>}:<name>` (what each holds: `lua/lib/ctx.lua`).
pub const PASSED: [&str; 10] = [
    "sessions", "queue", "polls", "admits", "meta", "ended", "places", "tail", "tail_ids",
    "batches",
];

/// Priority lane `n`'s queue (1 ..) is `lane:<n>` (`lua/lib/lanes.lua`).
pub const LANE_PREFIX: &str = "lane:";

/// Chunk `n` of the tail's ids is `tail_ids:<n>`: the passed `tail_ids`
/// key's name, a colon, the number (`lua/lib/tail.lua`).
pub const TAIL_CHUNK_PREFIX: &str = "tail_ids:";

/// The tail places of visitors who arrived by a stable id (`lua/lib/tail.lua`).
pub const TAIL_SEQS: &str = "tail_seqs";

/// The key `name` of `room` (one of [`PASSED`], [`TAIL_SEQS`], ...).
pub fn room_key(room: &str, name: &str) -> String {
    format!("wr:{{{room}}}:{name}")
}

/// Priority lane `n`'s queue (1 ..).
pub fn lane(room: &str, n: usize) -> String {
    room_key(room, &format!("{LANE_PREFIX}{n}"))
}

/// Chunk `n` of the tail's ids.
pub fn tail_chunk(room: &str, n: u64) -> String {
    room_key(room, &format!("{TAIL_CHUNK_PREFIX}{n}"))
}

/// A set of `Store::note`; it expires with its last member.
pub fn note(room: &str, set: &str) -> String {
    room_key(room, &format!("note:{set}"))
}

/// Hour `hour` (hours since the Unix epoch) of the room's report: its
/// minutes' fields (`lua/report_add.lua`).
pub fn report(room: &str, hour: u64) -> String {
    room_key(room, &format!("report:{hour}"))
}

/// The operator's runtime changes, kept apart from the room's state:
/// `reset` leaves it alone and it has no TTL.
pub fn overrides(room: &str) -> String {
    room_key(room, "overrides")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formed_keys_sit_beside_the_passed_ones() {
        assert_eq!(lane("shop", 2), "wr:{shop}:lane:2");
        assert_eq!(tail_chunk("shop", 0), "wr:{shop}:tail_ids:0");
        assert_eq!(room_key("shop", TAIL_SEQS), "wr:{shop}:tail_seqs");
        // A chunk's name is the passed `tail_ids` key's, then `:<n>`.
        assert!(PASSED.iter().any(|k| format!("{k}:") == TAIL_CHUNK_PREFIX));
    }
}
