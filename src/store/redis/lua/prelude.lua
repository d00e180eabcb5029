-- Prelude of every room script that decides: the room policy read from ARGV,
-- housekeeping and promotion. The Rust side (library.rs) loads this file
-- once as the head of a Redis function library, each room script after it
-- as one function that starts with begin(); every script therefore applies
-- the same rules in the same atomic run, and the helpers below are built
-- once per server, not once per call.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 sessions  ZSET visitor -> session expiry (ms): sessions made one at a
--               time (promotion, passthrough, renewal, ...); newcomers
--               admitted together are in `batches` instead
--   2 queue     ZSET visitor -> seq
--   3 polls     HASH visitor -> time of last poll (ms), for abandonment
--               (none before a place's first poll: see `gone_of`), and
--               SINCE -> since when the hash keeps them
--   4 admits    ZSET "<last admission id>:<count>" -> time (ms): the rate
--               window, one member per call that admitted (not per visitor)
--   5 meta      HASH last_seq, reset_floor, window (admissions in the
--               window), sweep (where the abandonment sweep goes on),
--               ttl_slot (see `keep_alive`), admitted, queued, rejected,
--               abandoned
--   6 ended     ZSET visitor -> expiry of a session that was released,
--               revoked or reset: its ticket must not re-create it; and of
--               a queue place that became a session, until its ticket
--               lapses (`used_places`): the ticket must not put it back
--   7 places    ZSET visitor -> until when a released queue place stays
--               ended (abandon_after): its ticket must not put it back
--   8 tail      ZSET first seq -> (first seq, count, cum, offset): the back
--               of a long queue, one member per batch of newcomers (see
--               "The tail" below)
--   9 tail_ids  the prefix of the keys "tail_ids:<n>": STRINGs of the
--               tail's visitor ids, 32 characters each (see "The tail")
--  10 batches   ZSET of sessions made together: one member per arrive call
--               that admitted newcomers, their ids joined, scored by their
--               common expiry (ms); and BATCHED, scored minus how many
--               sessions the other members hold (see "Session batches")
-- ARGV:
--   1 now (ms, from the caller's clock; never Redis TIME, so tests move time)
--   2 the room's policy, one string of ten fields joined by '|':
--     total_active_users (0 = unlimited), new_users_per_minute (0 =
--     unlimited), session_duration_ms, session_renewal (1/0), method,
--     max_queue_length (0 = unbounded), abandon_after_ms, arrival_grace_ms,
--     state, key TTL (ms). One argument instead of ten: every argument is a
--     string Redis makes for the call, and the same policy string is parsed
--     once (`policy_of`).
--   3 deadline: Redis server time (microseconds) after which this call
--      must do nothing, because its caller has given up on it (0 = none)
--   4.. operation arguments
--
-- What every call must do before deciding (`housekeep`) is kept to what
-- the decision depends on: expired sessions leave (capacity) and old
-- admissions leave the rate window (rate). What only needs doing now and
-- then (`maintain`: abandonment, forgetting old ended marks, key expiry)
-- runs in the scripts the daemon calls periodically (stats, frontier), so
-- the per-visitor scripts stay short.

-- The call's keys and arguments, and everything read from them: set by
-- begin() at the start of every call (Redis runs one call at a time, so
-- these library-level locals are the call's own while it runs).
local KEYS, ARGV
local K_SESSIONS, K_QUEUE, K_POLLS, K_ADMITS, K_META, K_ENDED, K_PLACES, K_TAIL, K_TAIL_IDS
local K_BATCHES
local now, now_s, cap, capped, rate, session_ms, renewal, method, max_queue
local abandon_ms, grace_ms, state, key_ttl_ms
-- Region mode (src/region, store/redis/region.rs): the policy's cap field
-- is 'grant' and the cap is the region's grant, kept in meta as two totals
-- that only grow (g_raised: slots the global store granted, g_lowered:
-- slots the region gave back), so a grant of 0 admits nobody.
-- `region_bound` is the oldest waiting seq in the other regions, as of the
-- last sync, until g_bound_until (nil: none): FIFO promotion stops before
-- it and newcomers do not jump it.
--
-- The rate limit works the same way (I2 across regions): an admission
-- holds one of the region's *admission tokens* for the rate window (60 s)
-- after it was made, and the region holds at most its rate grant of them,
-- kept as r_raised and r_lowered. So in region mode a rated room admits
-- while the window holds fewer admissions than the rate grant, not the
-- room's rate; `room_rate` keeps the room's (an upper bound on any grant).
-- A cap field of 'rate_grant' is region mode for a room without a
-- capacity limit: only its rate is a grant.
local region_mode, region_bound, rated, room_rate
-- Active sessions and admissions in the window, read once per call and
-- kept up to date by admit() and promote(); the queue's length as
-- promote() left it (nil if it did not look). `batched_n` is the part of
-- `active_n` in `batches` (nil until read).
local active_n, window_n, queue_n, batched_n
-- The highest seq handed out so far (nil until read; `last_seq_read` is
-- meta's field as counts() read it, parsed only if a seq is needed), and
-- the ten seconds in which the room's keys last had their expiry moved
-- (see `keep_alive`).
local last_seq, last_seq_read, ttl_slot
-- last_seq as read from meta, so save_last_seq() writes only a change.
local stored_last_seq
-- The tail's ends as tail_ends() read them this call (false: empty; nil:
-- not read yet).
local tail_first, tail_last

-- tonumber() and string.format() each cost about as much as a small Redis
-- command, so the hot paths avoid them where they can.
--
-- The policy (ARGV[2]) comes as the same string call after call: each
-- distinct one is parsed once, into a table kept for the next call.
local policies, policies_n = {}, 0
local function policy_of(s)
    local p = policies[s]
    if not p then
        local f = {}
        for v in string.gmatch(s .. '|', '([^|]*)|') do
            f[#f + 1] = v
        end
        p = {
            cap_field = f[1],
            cap = tonumber(f[1]),
            rate = tonumber(f[2]),
            session_ms = tonumber(f[3]),
            renewal = f[4] == '1',
            method = f[5],
            max_queue = tonumber(f[6]),
            abandon_ms = tonumber(f[7]),
            grace_ms = tonumber(f[8]),
            state = f[9],
            key_ttl_ms = f[10],
        }
        if policies_n >= 256 then
            policies, policies_n = {}, 0
        end
        policies[s] = p
        policies_n = policies_n + 1
    end
    return p
end

-- Reads the call's policy; returns an error reply if the call must not run.
local function begin(keys, args)
    KEYS, ARGV = keys, args
    K_SESSIONS, K_QUEUE, K_POLLS, K_ADMITS, K_META, K_ENDED, K_PLACES, K_TAIL, K_TAIL_IDS =
        keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7], keys[8], keys[9]
    K_BATCHES = keys[10]
    now_s = args[1]
    now = tonumber(now_s)
    local p = policy_of(args[2])
    -- In region mode the cap field is 'grant' or 'rate_grant' (below).
    cap = p.cap
    -- Whether `cap` limits anything (0 = unlimited in the central mode).
    capped = cap ~= nil and cap > 0
    rate = p.rate
    session_ms = p.session_ms
    renewal = p.renewal
    method = p.method
    max_queue = p.max_queue
    abandon_ms = p.abandon_ms
    grace_ms = p.grace_ms
    state = p.state
    key_ttl_ms = p.key_ttl_ms
    active_n, window_n, queue_n, batched_n = nil, nil, nil, nil
    last_seq, last_seq_read, ttl_slot, stored_last_seq = nil, nil, nil, nil
    tail_first, tail_last = nil, nil

    -- A call that waited in a frozen or overloaded Redis past its caller's
    -- timeout must not land later: the caller has already answered the
    -- visitor (by the fail mode), so an admission or queue place made now
    -- would be a ghost holding a slot. TIME is the server's clock; the
    -- caller converts its deadline to it with a measured offset.
    local deadline_us = args[3]
    -- (0 or less: none.)
    if deadline_us ~= '0' and string.sub(deadline_us, 1, 1) ~= '-' then
        local t = redis.call('TIME')
        -- Both in decimal microseconds: of one length (16 digits until the
        -- year 2286), the later is the greater string, without parsing.
        local us = t[2]
        local server_us = t[1] .. string.sub('000000', #us + 1) .. us
        local late
        if #server_us == #deadline_us then
            late = server_us > deadline_us
        else
            late = tonumber(server_us) > tonumber(deadline_us)
        end
        if late then
            return redis.error_reply('DEADLINE the caller gave up on this call')
        end
    end

    region_mode = p.cap_field == 'grant' or p.cap_field == 'rate_grant'
    region_bound = nil
    -- Whether the room has a rate limit (`rate` may be a grant of 0).
    rated = rate > 0
    room_rate = rate
    if region_mode then
        local g = redis.call('HMGET', K_META, 'g_raised', 'g_lowered', 'g_bound', 'g_bound_until',
            'r_raised', 'r_lowered')
        if p.cap_field == 'grant' then
            cap = math.max(0, tonumber(g[1] or '0') - tonumber(g[2] or '0'))
            capped = true
        else
            cap = 0
        end
        if rated then
            rate = math.max(0, tonumber(g[5] or '0') - tonumber(g[6] or '0'))
        end
        local b, b_until = tonumber(g[3] or '0'), tonumber(g[4] or '0')
        if b > 0 and b_until > now then
            region_bound = b
        end
    end
    return nil
end

-- Must match `RATE_WINDOW_MS`, `SEQ_EPOCH_MS` and `SEQ_PER_MS` in store/mod.rs.
local RATE_WINDOW_MS = 60000
local SEQ_EPOCH_MS = 1577836800000
local SEQ_PER_MS = 1024

-- Bounds on the work of one run, so a burst of expiries or a huge free
-- capacity never blocks Redis for long; the next run carries on. Both stay
-- well under Lua's unpack() limit (about 8000 values).
local PROMOTE_MAX = 1000
-- Queue places the abandonment sweep looks at per run; a shorter queue is
-- looked at whole every run.
local SWEEP_MAX = 2000

-- A visitor id's length (hex).
local ID_LEN = 32

-- Verdict tags and reject reasons; must match the decoding in redis.rs.
local ADMITTED, QUEUED, REJECTED, ENDED = 1, 2, 3, 4
local R_CLOSED, R_QUEUE_FULL, R_OVER_LIMIT = 1, 2, 3

-- Integers go to Redis as strings: a Lua number would be printed with
-- %.17g (and above 1e14 in exponent form), which costs more than the
-- command it is an argument of.
local function int(n)
    return string.format('%d', n)
end

-- "000" to "999", so that a run of consecutive integers (a batch's seqs)
-- is written as a shared prefix and one of these: int() is a string.format,
-- which costs more than the ZADD member it numbers. (Made by the first
-- call that needs them: a library's loading code cannot use `string`.)
local DIGITS3
-- The thousands int_next() last wrote, and how.
local last_thousands, last_prefix = -1, ''

-- The same without leading zeros: the counts a batch adds (at most 256).
local COUNTS

local function make_digits()
    DIGITS3, COUNTS = {}, {}
    for i = 0, 999 do
        DIGITS3[i] = string.format('%03d', i)
        COUNTS[i] = string.format('%d', i)
    end
end

-- int(n) for a count (a non-negative integer, usually below 1000).
local function count_string(n)
    if n < 1000 then
        if not COUNTS then
            make_digits()
        end
        return COUNTS[n]
    end
    return int(n)
end

-- int(n) for a non-negative integer, cheap when `n` has the same thousands
-- as the `n` of the call before.
local function int_next(n)
    local ones = n % 1000
    local thousands = (n - ones) / 1000
    if thousands == 0 then
        return count_string(ones)
    end
    if not DIGITS3 then
        make_digits()
    end
    if thousands ~= last_thousands then
        last_thousands, last_prefix = thousands, int(thousands)
    end
    return last_prefix .. DIGITS3[ones]
end

-- Scratch tables for arrive's ZADD arguments (see there).
local ZADD_SESSIONS, ZADD_PLACES = {}, {}

-- ZADD of the first `n` entries of `args` (score, member, ...), 15 members
-- a command: Redis keeps the objects of a script command's first 32
-- arguments for the next one and makes the rest anew (script_lua.c,
-- LUA_CMD_OBJCACHE_SIZE), so short commands cost less than one long one.
local function zadd_all(key, args, n)
    for first = 1, n, 30 do
        redis.call('ZADD', key, unpack(args, first, math.min(first + 29, n)))
    end
end

-- How many admissions a window member stands for ("<id>:<count>").
local function admissions_in(member)
    return tonumber(string.match(member, ':(%d+)$') or '1')
end

-- Admissions in `members`, summed.
local function admissions(members)
    local n = 0
    for _, m in ipairs(members) do
        n = n + admissions_in(m)
    end
    return n
end

-- Session batches. Newcomers admitted by one arrive call share their
-- session's expiry, and their sessions are one member of `batches`: their
-- ids joined, scored by that expiry. One sorted-set entry per visitor (as
-- in `sessions`) costs Redis more than the whole rest of the decision; one
-- per call costs a string copy per visitor.
--
-- Nothing looks a batch up by visitor without its session's expiry, which
-- the visitor's ticket carries (check_in, and release from the origin's
-- revoke), or a bound on it (the release of an arrival whose caller gave
-- up: no earlier than its arrival's), but `release` knowing neither (the
-- admin API's, or a place's that may be in the tail), which reads every
-- batch.
-- A session that leaves its batch early (renewed: it is one of its own
-- then; or released) leaves a mark: LEFT and its id, scored half a
-- millisecond below its batch. So the two end together (`now` is whole
-- milliseconds), but a lookup by the ticket's expiry reads only batches.
-- A batch is never written again (only the count member is).
--
-- The member BATCHED, scored minus how many sessions the others hold
-- (below every expiry, so first), is the count: it lives and dies with
-- them, in the one key. Only the daemon's new visitors (`arrive` with
-- flag 'n') are batched: their ids were just made, so no later `arrive`
-- can bring them back (that looks them up in `sessions` only).
local BATCHED = '#'
local LEFT = '-'

-- Sessions in `batches`, as its count member says (0 without one).
local function batched()
    if not batched_n then
        batched_n = -tonumber(redis.call('ZSCORE', K_BATCHES, BATCHED) or '0')
    end
    return batched_n
end

-- Sessions the members in `members` hold: a batch its ids, a mark minus one.
-- (Every read of batches starts above 0, which leaves BATCHED out.)
local function sessions_in(members)
    local n = 0
    for _, m in ipairs(members) do
        if string.sub(m, 1, 1) == LEFT then
            n = n - 1
        else
            n = n + #m / ID_LEN
        end
    end
    return n
end

-- Adds `k` sessions (`ids`, joined) ending at `expiry_s` as one batch.
-- (The count is written whole, in the same command: this call knows it.)
local function batch_add(expiry_s, ids, k)
    batched_n = batched() + k
    redis.call('ZADD', K_BATCHES, expiry_s, ids, '-' .. int(batched_n), BATCHED)
end

-- The expiry (a string) of `visitor`'s session if a batch holds it, else
-- nil. Only batches ending within `min`..`max` (ZRANGEBYSCORE bounds) are
-- read: the ticket's expiry at check-in, every batch ('(0', '+inf') for a
-- release that knows nothing.
local function batch_find(visitor, min, max)
    local found = redis.call('ZRANGEBYSCORE', K_BATCHES, min, max, 'WITHSCORES')
    for i = 1, #found, 2 do
        local m = found[i]
        if string.sub(m, 1, 1) ~= LEFT then
            local at = string.find(m, visitor, 1, true)
            -- (Only a match at an id's start is the visitor: another place
            -- would be two ids' halves.)
            while at and at % ID_LEN ~= 1 do
                at = string.find(m, visitor, at + 1, true)
            end
            if at then
                if redis.call('ZSCORE', K_BATCHES, LEFT .. visitor) then
                    return nil
                end
                return found[i + 1]
            end
        end
    end
    return nil
end

-- `visitor`'s session leaves its batch (whose expiry is `expiry`).
local function batch_leave(visitor, expiry)
    batched_n = batched() - 1
    redis.call('ZADD', K_BATCHES, int(tonumber(expiry) - 1) .. '.5', LEFT .. visitor,
        int(-batched_n), BATCHED)
    if active_n then
        active_n = active_n - 1
    end
end

-- Every batched session as (expiry, visitor) pairs, for `reset`.
local function batched_sessions()
    local all = redis.call('ZRANGEBYSCORE', K_BATCHES, '(0', '+inf', 'WITHSCORES')
    local left = {}
    for i = 1, #all, 2 do
        if string.sub(all[i], 1, 1) == LEFT then
            left[string.sub(all[i], 2)] = true
        end
    end
    local out = {}
    for i = 1, #all, 2 do
        local m, expiry = all[i], all[i + 1]
        if string.sub(m, 1, 1) ~= LEFT then
            for at = 1, #m, ID_LEN do
                local id = string.sub(m, at, at + ID_LEN - 1)
                if not left[id] then
                    out[#out + 1] = expiry
                    out[#out + 1] = id
                end
            end
        end
    end
    return out
end

-- What every decision depends on: expired sessions and admissions outside
-- the window are gone.
local function housekeep()
    redis.call('ZREMRANGEBYSCORE', K_SESSIONS, '-inf', now_s)
    -- The count member first, then the batch (or mark) that ends first.
    local front = redis.call('ZRANGE', K_BATCHES, 0, 1, 'WITHSCORES')
    if #front > 0 then
        if front[1] ~= BATCHED then
            -- The count member was lost alone (by hand: every write here
            -- keeps it): counted again.
            local n = sessions_in(redis.call('ZRANGEBYSCORE', K_BATCHES, '(0', '+inf'))
            redis.call('ZADD', K_BATCHES, int(-n), BATCHED)
            -- (Now first, before what was.)
            front = { BATCHED, int(-n), front[1], front[2] }
        end
        batched_n = -tonumber(front[2])
        if front[4] and tonumber(front[4]) <= now then
            local n = sessions_in(redis.call('ZRANGEBYSCORE', K_BATCHES, '(0', now_s))
            redis.call('ZREMRANGEBYSCORE', K_BATCHES, '(0', now_s)
            redis.call('ZINCRBY', K_BATCHES, int(n), BATCHED)
            batched_n = batched_n - n
        end
    else
        batched_n = 0
    end
    local cutoff = int(now - RATE_WINDOW_MS)
    local old = redis.call('ZRANGEBYSCORE', K_ADMITS, '-inf', cutoff)
    if #old > 0 then
        redis.call('ZREMRANGEBYSCORE', K_ADMITS, '-inf', cutoff)
        redis.call('HINCRBY', K_META, 'window', -admissions(old))
    end
end

-- When a visitor was last seen, by their poll record or, failing one, by
-- their arrival: a new place gets no record (the seq says when it was
-- handed out, to the millisecond: `seq_arrival`), only a poll writes one.
-- The hash's own field SINCE says since when it has kept records: should
-- the hash be lost (evicted, say) while the queue is not, the visitors it
-- no longer knows are counted from its loss, not from their arrival, so
-- nobody is dropped for polls the store forgot (I5).
local SINCE = '~since'

-- When the visitor holding `seq` arrived (store/mod.rs seq_arrival_ms).
local function seq_arrival(seq)
    return math.floor(seq / SEQ_PER_MS) + SEQ_EPOCH_MS
end

-- Of `entries` (visitor, seq, visitor, seq, ... in queue order, as ZRANGE
-- WITHSCORES gives them), the visitors who have not been seen for
-- abandon_after ("older than" is strict), and the visitors who stay.
local function gone_of(entries)
    local gone, keep = {}, {}
    local n = #entries / 2
    if abandon_ms == 0 or n == 0 then
        for i = 1, n do
            keep[i] = entries[2 * i - 1]
        end
        return gone, keep
    end
    local fields = { SINCE }
    for i = 1, n do
        fields[i + 1] = entries[2 * i - 1]
    end
    local polled = redis.call('HMGET', K_POLLS, unpack(fields))
    local since = tonumber(polled[1])
    if not since then
        redis.call('HSET', K_POLLS, SINCE, now_s)
        since = now
    end
    local cutoff = now - abandon_ms
    for i = 1, n do
        local t = tonumber(polled[i + 1])
        if not t or t < cutoff then
            -- A record older than the place (left over from the visitor's
            -- earlier place) does not count against it.
            t = math.max(t or 0, seq_arrival(tonumber(entries[2 * i])), since)
        end
        if t < cutoff then
            gone[#gone + 1] = fields[i + 1]
        else
            keep[#keep + 1] = fields[i + 1]
        end
    end
    return gone, keep
end

-- Drops visitors who stopped polling from the queue.
local function drop(gone)
    if #gone > 0 then
        redis.call('ZREM', K_QUEUE, unpack(gone))
        redis.call('HDEL', K_POLLS, unpack(gone))
        redis.call('HINCRBY', K_META, 'abandoned', #gone)
    end
end

-- The tail: the back of a long queue, written one member per batch.
--
-- A queue place in `queue` is a sorted-set entry per visitor, and writing
-- it is most of what a queued newcomer costs Redis (README, "The floor of
-- this design"). Once `queue` holds HEAD_WINDOW places, newcomers go to
-- the tail instead: a batch of k queued newcomers, who get consecutive
-- seqs, is one member (first seq, k, cum, offset) scored by its first seq,
-- and their ids (32 characters each) are written in arrival order to the
-- room's ids, the first at id number <offset>: id number o is at byte
-- 32 * (o % CHUNK) of the string key `tail_ids:<o // CHUNK>`.
-- `cum` is how many places the tail had taken in before it (the last
-- member's cum plus its k), so the places ahead of a member in the tail
-- are its cum minus the first member's. Every seq in the tail is above
-- every seq in `queue`: a newcomer goes to the tail whenever the tail is
-- not empty. Members and the string's header hold their numbers as 8-byte
-- doubles (`struct`): reading a number from its decimal digits (strtod)
-- costs Redis more than the command that fetched it.
--
-- The ids are in chunks of CHUNK (2 MB), not one string, so that ids that
-- moved up go with their chunk (a `DEL`), and nothing is ever copied to
-- cut them off. (The chunks' keys are made here from the ninth key, which
-- is their common prefix: they share its `{room}` tag, so its slot.) Ids
-- are written where their number says (`SETRANGE`), so whatever a chunk
-- held before cannot shift them, and read back only by a member that wrote
-- them; a chunk lost reads as bytes that are no visitor's id.
--
-- Nobody is looked up in the tail by visitor: a poll brings its ticket's
-- seq, which finds the member; its visitor must be at its offset there.
-- Places move from the tail's front into `queue` as the head nears them
-- (`refill`, in whole members): who left while in the tail (released,
-- admitted in passthrough, stopped polling, or before a reset) is left
-- out then, so until then the tail counts them in positions and lengths
-- (a position shown far back may be too high by the visitors ahead who
-- left; never too low, so nobody is admitted early and nobody overtaken).
--
-- A place put back inside the tail
-- (a poll of a place the store lost, I5) is a member of its own that
-- carries its id, and the tail's end cum as it was put back (which a last
-- member's cum plus its k would otherwise give): (seq, 1, cum, end) and
-- then the id.
-- So offsets grow with seqs, and a member's ids are never behind an
-- earlier member's.
local HEAD_WINDOW = 2000
local CHUNK = 65536
-- (Numbers given to redis.call are formatted as floats, which costs as much
-- as a small command: the hot paths pass strings.)
-- A member's four numbers; a member longer than MEMBER_LEN carries its ids.
local MEMBER = '>dddd'
local MEMBER_LEN = 32
-- How long a queue place released while it may be in the tail stays
-- marked beyond abandon_after: longer than any queue description lives,
-- so a poll answered from one after the release cannot keep it (refill
-- drops it as abandoned once the mark is gone).
local TAIL_MARK_MS = 60000

-- A tail member's first seq, count, cum, the tail's end cum if it is the
-- last (`stop`), and its ids' offset (or, for a member that carries its
-- ids, where they start in it).
local function tail_member(m)
    local first, k, cum, x = struct.unpack(MEMBER, m)
    if #m > MEMBER_LEN then
        return {
            first = first, k = k, cum = cum, stop = x, off = false, inline = MEMBER_LEN + 1, m = m,
        }
    end
    return { first = first, k = k, cum = cum, stop = cum + k, off = x, inline = false, m = m }
end

-- The key of ids chunk `c`.
local function chunk_key(c)
    return K_TAIL_IDS .. ':' .. int(c)
end

-- The ids of places i .. i+n-1 (0-based) of member `t`, joined: always n
-- ids long, where the ids a chunk lost read as '?'s or zero bytes (no
-- visitor's id: `is_id`).
local function tail_ids(t, i, n)
    if t.inline then
        local at = t.inline + ID_LEN * i
        return string.sub(t.m, at, at + ID_LEN * n - 1)
    end
    local parts = {}
    local o = t.off + i
    while n > 0 do
        local c = math.floor(o / CHUNK)
        local within = o - c * CHUNK
        local take = math.min(n, CHUNK - within)
        local got = redis.call('GETRANGE', chunk_key(c), int(ID_LEN * within),
            int(ID_LEN * (within + take) - 1))
        if #got < ID_LEN * take then
            got = got .. string.rep('?', ID_LEN * take - #got)
        end
        parts[#parts + 1] = got
        o, n = o + take, n - take
    end
    return #parts == 1 and parts[1] or table.concat(parts)
end

-- Whether `s` (ID_LEN characters) can be a visitor id: hex digits only.
local function is_id(s)
    return string.find(s, '^%x+$') ~= nil
end

-- Writes `ids` (joined) as id numbers o, o+1, ...; a chunk new to the
-- room gets its expiry at once.
local function ids_write(o, ids)
    local n, from = #ids / ID_LEN, 1
    while n > 0 do
        local c = math.floor(o / CHUNK)
        local within = o - c * CHUNK
        local take = math.min(n, CHUNK - within)
        local key = chunk_key(c)
        local part = ids
        if take * ID_LEN ~= #ids then
            part = string.sub(ids, from, from + ID_LEN * take - 1)
        end
        if redis.call('SETRANGE', key, int(ID_LEN * within), part) == ID_LEN * take then
            redis.call('PEXPIRE', key, key_ttl_ms)
        end
        o, n, from = o + take, n - take, from + ID_LEN * take
    end
end

-- The tail's first and last members (false, false when it is empty).
local function tail_ends()
    if tail_first == nil then
        local a = redis.call('ZRANGE', K_TAIL, '0', '0')
        if #a == 0 then
            tail_first, tail_last = false, false
        else
            tail_first = tail_member(a[1])
            tail_last = tail_member(redis.call('ZRANGE', K_TAIL, '-1', '-1')[1])
        end
    end
    return tail_first, tail_last
end

-- The id number after the tail's last ids: one past the offset and count of
-- the last member that has an offset (offsets grow with seqs), 0 if none.
local function ids_end()
    local _, last = tail_ends()
    if not last then
        return 0
    end
    if last.off then
        return last.off + last.k
    end
    local from = 0
    while true do
        local ms = redis.call('ZRANGE', K_TAIL, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', from, 64)
        for _, m in ipairs(ms) do
            local t = tail_member(m)
            if t.off then
                return t.off + t.k
            end
        end
        if #ms < 64 then
            return 0
        end
        from = from + 64
    end
end

-- The chunks that hold the ids from number `lo` to number `hi` - 1, for
-- `f` (at most 64: a queue of four million).
local function each_chunk(lo, hi, f)
    local c, last = math.floor(lo / CHUNK), math.floor((hi - 1) / CHUNK)
    for i = c, math.min(last, c + 63) do
        f(chunk_key(i))
    end
end

-- Places in the tail (counting those that left it unseen, see above).
local function tail_length()
    local first, last = tail_ends()
    if not first then
        return 0
    end
    return math.max(last.stop - first.cum, 0)
end

-- Places waiting: in `queue` and in the tail.
local function queue_length()
    return redis.call('ZCARD', K_QUEUE) + tail_length()
end

-- Whether `k` new places (seqs above every seq handed out) go to the tail
-- (only in FIFO rooms: a random pick is over the whole queue).
local function to_tail(k)
    if method ~= 'fifo' then
        return false
    end
    local first = tail_ends()
    return first ~= false or redis.call('ZCARD', K_QUEUE) + k > HEAD_WINDOW
end

-- Writes `ids` (k ids joined) as the tail's places at seqs first..first+k-1.
-- `first_s` is `first` as a string; `back` is true for a place put back
-- (its seq was handed out before), false for newcomers (above every seq).
local function tail_add(first, first_s, k, ids, back)
    if #ids ~= ID_LEN * k then
        error('visitor ids in the tail must be ' .. ID_LEN .. ' characters')
    end
    local _, last = tail_ends()
    local cum, member = 0, nil
    if last and (back or first < last.first + last.k) then
        -- Put back inside the tail (by a poll, I5), or newcomers whose seqs
        -- are not above the tail's (after a lost last_seq, with clocks
        -- apart): the member carries its ids and takes the cum of the place
        -- it follows, so positions behind it are too low until it moves to
        -- `queue`, and it counts in no length.
        local before = redis.call('ZRANGE', K_TAIL, first_s, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
        if #before == 1 then
            local b = tail_member(before[1])
            cum = b.cum + math.min(b.k, first - b.first)
        else
            cum = tail_first.cum
        end
        -- (Put back past the end, it extends the end: counted too many,
        -- never too few.)
        member = struct.pack(MEMBER, first, k, cum, math.max(last.stop, cum + k)) .. ids
    else
        if last then
            cum = last.stop
        end
        local off = ids_end()
        ids_write(off, ids)
        member = struct.pack(MEMBER, first, k, cum, off)
    end
    redis.call('ZADD', K_TAIL, first_s, member)
    tail_first, tail_last = nil, nil
end

-- The tail member holding `visitor` at `seq` (`seq_s` as a string), or nil.
local function tail_find(visitor, seq, seq_s)
    if not tail_ends() or seq < tail_first.first then
        return nil
    end
    -- The member that starts at or last before `seq`; a few more only if
    -- its id there is not the visitor's (more than one member can start
    -- at a seq after a lost last_seq, or a place put back inside one).
    local from, n = '0', '1'
    while true do
        local found = redis.call('ZRANGE', K_TAIL, seq_s, '-inf', 'BYSCORE', 'REV', 'LIMIT', from, n)
        for _, m in ipairs(found) do
            local t = tail_member(m)
            local i = seq - t.first
            if i < t.k and tail_ids(t, i, 1) == visitor then
                return t
            end
        end
        if from ~= '0' or #found == 0 then
            return nil
        end
        from, n = '1', '3'
    end
end

-- The place at `seq` in tail member `t` as a Queued verdict.
local function tail_place(t, seq)
    local ahead = redis.call('ZCARD', K_QUEUE)
    local position = math.max(ahead + t.cum - tail_first.cum + seq - t.first + 1, 1)
    return { QUEUED, seq, position, math.max(ahead + tail_length(), position) }
end

-- The seq of the place at `rank` (0-based) in the tail, or nil. `hint`
-- (optional, a table kept by the caller between calls with ranks that do
-- not decrease) starts the search where the last one ended.
local function tail_seq_at(rank, hint)
    local first, last = tail_ends()
    if not first then
        return nil
    end
    local want = first.cum + rank
    if want >= last.stop then
        return nil
    end
    -- The last member whose cum is at most `want`: lo's cum <= want < hi's
    -- (hi = the member count: the end). Batches are of similar sizes, so
    -- interpolating finds it in a step or two; halving after four steps
    -- bounds the rest.
    if hint and not hint.n then
        hint.n = redis.call('ZCARD', K_TAIL)
    end
    local lo, lo_t = 0, first
    local hi = hint and hint.n or redis.call('ZCARD', K_TAIL)
    local hi_cum = last.stop
    if hint and hint.t and hint.t.cum <= want then
        lo, lo_t = hint.i, hint.t
    end
    local steps = 0
    while hi - lo > 1 do
        steps = steps + 1
        local mid
        if steps <= 4 then
            mid = lo + math.floor((want - lo_t.cum) * (hi - lo) / (hi_cum - lo_t.cum))
            mid = math.max(lo + 1, math.min(hi - 1, mid))
        else
            mid = math.floor((lo + hi) / 2)
        end
        local at = int(mid)
        local t = tail_member(redis.call('ZRANGE', K_TAIL, at, at)[1])
        if t.cum <= want then
            lo, lo_t = mid, t
        else
            hi, hi_cum = mid, t.cum
        end
    end
    if hint then
        hint.i, hint.t = lo, lo_t
    end
    return lo_t.first + math.min(want - lo_t.cum, lo_t.k - 1)
end

-- The seq of the place at `rank` (0-based) in the whole queue, or nil
-- (`hint` as for tail_seq_at).
local function seq_at(rank, hint)
    local in_queue = hint and hint.q or redis.call('ZCARD', K_QUEUE)
    if hint then
        hint.q = in_queue
    end
    if rank < in_queue then
        local at = int(rank)
        local e = redis.call('ZRANGE', K_QUEUE, at, at, 'WITHSCORES')
        return tonumber(e[2])
    end
    return tail_seq_at(rank - in_queue, hint)
end

-- Moves whole members from the tail's front into `queue` until `want`
-- places have moved or the tail is empty; leaves out (and counts) who
-- left while in the tail. Returns how many places moved.
local function refill(want)
    local moved = 0
    local floor = nil
    -- The ids the moved members had (their chunks go once passed).
    local ids_lo, ids_hi = nil, nil
    while moved < want do
        local front = redis.call('ZRANGE', K_TAIL, '0', '0')
        if #front == 0 then
            break
        end
        local t = tail_member(front[1])
        floor = floor or tonumber(redis.call('HGET', K_META, 'reset_floor') or '0')
        local joined = tail_ids(t, 0, t.k)
        -- Places whose ids a chunk lost come back when they poll (I5).
        local ids, seqs = {}, {}
        for i = 0, t.k - 1 do
            local id = string.sub(joined, ID_LEN * i + 1, ID_LEN * (i + 1))
            if is_id(id) then
                ids[#ids + 1] = id
                seqs[#ids] = t.first + i
            end
        end
        local stay, left_ids = {}, {}
        if #ids > 0 then
            local sessions = redis.call('ZMSCORE', K_SESSIONS, unpack(ids))
            local ended = redis.call('ZMSCORE', K_ENDED, unpack(ids))
            local places = redis.call('ZMSCORE', K_PLACES, unpack(ids))
            for i, id in ipairs(ids) do
                local seq = seqs[i]
                local left = seq <= floor or sessions[i]
                    or (ended[i] and tonumber(ended[i]) > now)
                    or (places[i] and tonumber(places[i]) > now)
                if left then
                    left_ids[#left_ids + 1] = id
                else
                    stay[#stay + 1] = id
                    stay[#stay + 1] = seq
                end
            end
        end
        if #left_ids > 0 then
            redis.call('HDEL', K_POLLS, unpack(left_ids))
        end
        local gone, keep = gone_of(stay)
        drop(gone)
        if #keep > 0 then
            -- gone_of keeps the order: `stay` pairs for the kept, in order.
            local args, j = {}, 1
            local is_gone = {}
            for _, v in ipairs(gone) do
                is_gone[v] = true
            end
            for i = 1, #stay, 2 do
                if not is_gone[stay[i]] then
                    args[j], args[j + 1] = int(stay[i + 1]), stay[i]
                    j = j + 2
                end
            end
            zadd_all(K_QUEUE, args, #args)
        end
        redis.call('ZREM', K_TAIL, t.m)
        if t.off then
            ids_lo, ids_hi = ids_lo or t.off, t.off + t.k
        end
        moved = moved + t.k
    end
    if moved > 0 then
        tail_first, tail_last = nil, nil
        if ids_lo then
            -- Every chunk the moved ids passed, and the last one too if the
            -- tail is now empty (its numbers start again at 0).
            local hi = ids_hi - ids_hi % CHUNK
            if not tail_ends() then
                hi = ids_hi
            end
            if hi > ids_lo then
                each_chunk(ids_lo, hi, function(key)
                    redis.call('DEL', key)
                end)
            end
        end
    end
    return moved
end

-- The ids chunks the tail's members point into, for `f` (as each_chunk).
local function each_tail_chunk(f)
    local first = tail_ends()
    if first then
        local hi = ids_end()
        local lo = first.off or math.max(hi - tail_length(), 0)
        if hi > lo then
            each_chunk(lo, hi, f)
        end
    end
end

-- Keeps `queue` at HEAD_WINDOW / 2 places at least while the tail has more,
-- so polls near the head read exact positions.
local function refill_head()
    if tail_ends() then
        local short = HEAD_WINDOW / 2 - redis.call('ZCARD', K_QUEUE)
        if short > 0 then
            refill(math.min(short, PROMOTE_MAX))
        end
    end
end

-- Moves every room key's expiry forward, so a room nobody uses any more
-- disappears on its own instead of leaking memory.
local function expire_all()
    -- (The ninth key is the ids chunks' prefix, not a key of its own.)
    for i = 1, 8 do
        redis.call('PEXPIRE', KEYS[i], key_ttl_ms)
    end
    redis.call('PEXPIRE', K_BATCHES, key_ttl_ms)
    each_tail_chunk(function(key)
        redis.call('PEXPIRE', key, key_ttl_ms)
    end)
end

-- The periodic part: visitors who stopped polling lose their place (the
-- sweep moves through the queue SWEEP_MAX places a run; promotion checks
-- whoever it is about to admit, so nobody gone is ever admitted), marks
-- of ended sessions and places are forgotten once they can no longer
-- matter, and the room's keys stay alive while the room is in use.
local function maintain()
    redis.call('ZREMRANGEBYSCORE', K_ENDED, '-inf', now_s)
    redis.call('ZREMRANGEBYSCORE', K_PLACES, '-inf', now_s)
    if abandon_ms > 0 then
        local from = tonumber(redis.call('HGET', K_META, 'sweep') or '0')
        local len = redis.call('ZCARD', K_QUEUE)
        if from >= len or len <= SWEEP_MAX then
            from = 0
        end
        local look = redis.call('ZRANGE', K_QUEUE, from, from + SWEEP_MAX - 1, 'WITHSCORES')
        local gone = gone_of(look)
        drop(gone)
        local next_from = from + #look / 2 - #gone
        if next_from >= len - #gone then
            next_from = 0
        end
        redis.call('HSET', K_META, 'sweep', int(next_from))
        -- Polls written for visitors no longer waiting (they left between
        -- a poll and its write): a few random ones a run are checked. (Not
        -- while there is a tail: its places are not in `queue`; refill
        -- clears the records of those who left it.)
        local sampled = {}
        if not tail_ends() then
            sampled = redis.call('HRANDFIELD', K_POLLS, 16)
        end
        if #sampled > 0 then
            local waiting = redis.call('ZMSCORE', K_QUEUE, unpack(sampled))
            local stale = {}
            for i, v in ipairs(sampled) do
                if not waiting[i] and v ~= SINCE then
                    stale[#stale + 1] = v
                end
            end
            if #stale > 0 then
                redis.call('HDEL', K_POLLS, unpack(stale))
            end
        end
    end
    refill_head()
    expire_all()
end

local function counts()
    if not active_n then
        active_n = redis.call('ZCARD', K_SESSIONS) + batched()
        local m = redis.call('HMGET', K_META, 'window', 'last_seq', 'ttl_slot')
        window_n = tonumber(m[1] or '0')
        last_seq_read = m[2] or '0'
        ttl_slot = m[3]
        -- The count lives beside the window; should the window key be gone
        -- alone (evicted), the count goes too rather than block admissions.
        -- (Before this call admits anyone: an admission makes the key again.)
        if window_n ~= 0 and redis.call('EXISTS', K_ADMITS) == 0 then
            window_n = 0
            redis.call('HDEL', K_META, 'window')
        end
    end
end

-- For runs that write the room's keys: the keys in `created` (those this
-- run may have created) get their expiry at once, and once in every ten
-- seconds of the clock all of them do (maintain() does it too, but a room
-- must expire even if nothing calls maintain any more). Far cheaper than
-- an expiry per key per run.
local function keep_alive(created)
    counts()
    -- The ten seconds `now` is in, as a string (now_s without its last
    -- four digits): a new one means a refresh.
    local slot = string.sub(now_s, 1, -5)
    if slot ~= ttl_slot then
        redis.call('HSET', K_META, 'ttl_slot', slot)
        ttl_slot = slot
        expire_all()
    else
        for _, key in ipairs(created) do
            redis.call('PEXPIRE', key, key_ttl_ms)
        end
    end
end

-- How many more admissions the limits allow right now (math.huge if none).
local function free_room()
    counts()
    local free = math.huge
    if capped then
        free = math.min(free, cap - active_n)
    end
    if rated then
        free = math.min(free, rate - window_n)
    end
    return free
end

-- One window member for `n` admissions made now. Its id comes from the
-- `admitted` counter, which only grows, so members never collide.
local function record_admissions(n)
    local n_s = count_string(n)
    local last = redis.call('HINCRBY', K_META, 'admitted', n_s)
    redis.call('ZADD', K_ADMITS, now_s, int(last) .. ':' .. n_s)
    redis.call('HINCRBY', K_META, 'window', n_s)
    counts()
    window_n = window_n + n
end

local function admit(visitor)
    local expiry = now + session_ms
    redis.call('ZADD', K_SESSIONS, int(expiry), visitor)
    record_admissions(1)
    active_n = active_n + 1
    return { ADMITTED, expiry }
end

local function reject(reason)
    redis.call('HINCRBY', K_META, 'rejected', 1)
    return { REJECTED, reason }
end

-- Queue places that became sessions are used up: each is marked ended as
-- long as its ticket could poll (abandon_after from now; the ticket was
-- last issued at or before now), so that once the session is over (by
-- expiry included) the ticket makes its holder a newcomer instead of
-- putting the place back at its seq (see poll). `args` are ZADD's (score,
-- visitor) pairs; the scores are overwritten.
local function used_places(args)
    local until_ms = int(now + abandon_ms)
    for i = 1, #args, 2 do
        args[i] = until_ms
    end
    redis.call('ZADD', K_ENDED, 'GT', unpack(args))
end

-- Admits waiting visitors while there is room. A promoted visitor gets its
-- session now, with the arrival grace so it outlives the wait until the
-- visitor's next poll collects it. Whoever stopped polling is dropped
-- instead of admitted. `passthrough` has no queue of its own: a visitor
-- left over from another method is admitted when it next polls.
local function promote()
    if (state ~= 'open' and state ~= 'queue_all') or method == 'passthrough' then
        return
    end
    if method == 'random' and tail_ends() then
        -- A random pick is over the whole queue: a room that turned random
        -- with a tail moves it over once (as long as the queue, as the
        -- event's shuffle).
        refill(math.huge)
    end
    local chosen = {}
    for _ = 1, 4 do
        local want = math.min(free_room() - #chosen, PROMOTE_MAX - #chosen)
        if want <= 0 then
            break
        end
        local waiting = redis.call('ZCARD', K_QUEUE)
        -- Only places ahead of the tail may go in (in `queue`, places at or
        -- past the tail's first seq were written by an instance of an
        -- earlier version that does not know the tail: README,
        -- "Upgrading"). A refill may move up only places whose visitors
        -- left, so it goes on until enough are ahead or the tail is empty.
        local ahead = waiting
        while tail_ends() do
            ahead = redis.call('ZCOUNT', K_QUEUE, '-inf', '(' .. int(tail_first.first))
            if ahead >= want then
                break
            end
            refill(want - ahead)
            waiting = redis.call('ZCARD', K_QUEUE)
            ahead = waiting
        end
        local in_tail = tail_length()
        queue_n = waiting + in_tail
        local n = math.min(want, ahead)
        if n <= 0 then
            break
        end
        local candidates
        if method == 'random' then
            candidates = redis.call('ZRANDMEMBER', K_QUEUE, n, 'WITHSCORES')
        elseif region_bound then
            -- Visitors who arrived after another region's oldest waiter wait
            -- for it (I3 across regions). Equal seqs arrived in the same
            -- millisecond: both regions may go, or neither ever would.
            candidates = redis.call('ZRANGEBYSCORE', K_QUEUE, '-inf', int(region_bound),
                'WITHSCORES', 'LIMIT', 0, n)
        else
            candidates = redis.call('ZRANGE', K_QUEUE, 0, n - 1, 'WITHSCORES')
        end
        local gone, keep = gone_of(candidates)
        drop(gone)
        queue_n = waiting - #gone - #keep + in_tail
        if #keep > 0 then
            redis.call('ZREM', K_QUEUE, unpack(keep))
            redis.call('HDEL', K_POLLS, unpack(keep))
            for _, v in ipairs(keep) do
                chosen[#chosen + 1] = v
            end
        end
        if #gone == 0 then
            break
        end
    end
    if #chosen == 0 then
        return
    end
    local expiry = int(now + session_ms + grace_ms)
    local args = {}
    for i, visitor in ipairs(chosen) do
        args[2 * i - 1] = expiry
        args[2 * i] = visitor
    end
    redis.call('ZADD', K_SESSIONS, unpack(args))
    used_places(args)
    record_admissions(#chosen)
    active_n = active_n + #chosen
end

-- The visitor's live session expiry, or nil. Call after housekeep().
local function session_of(visitor)
    local expiry = redis.call('ZSCORE', K_SESSIONS, visitor)
    if expiry then
        return tonumber(expiry)
    end
    return nil
end

-- Whether a mark in `key` (ended sessions or places) is still in force.
local function marked(key, visitor)
    local until_ms = redis.call('ZSCORE', key, visitor)
    return until_ms ~= false and until_ms ~= nil and tonumber(until_ms) > now
end

-- The visitor's place as a Queued verdict, or nil.
local function place_of(visitor)
    local seq = redis.call('ZSCORE', K_QUEUE, visitor)
    if not seq then
        return nil
    end
    local rank = redis.call('ZRANK', K_QUEUE, visitor)
    return { QUEUED, tonumber(seq), rank + 1, queue_length() }
end

-- The highest seq handed out so far.
local function read_last_seq()
    if not last_seq then
        last_seq = tonumber(last_seq_read or redis.call('HGET', K_META, 'last_seq') or '0')
        stored_last_seq = last_seq
    end
    return last_seq
end

-- The first of `count` (default 1) consecutive new seqs.
local function next_seq(count)
    local seq = math.max(math.max(now - SEQ_EPOCH_MS, 0) * SEQ_PER_MS, read_last_seq() + 1)
    last_seq = seq + (count or 1) - 1
    return seq
end

-- Puts the visitor in the queue at `seq` and keeps `last_seq` the highest seq
-- ever handed out, so a later next_seq() never reuses or undercuts it.
-- (Written back by save_last_seq().)
local function enqueue(visitor, seq)
    local first = tail_ends()
    if first and seq >= first.first then
        tail_add(seq, int(seq), 1, visitor, true)
    else
        redis.call('ZADD', K_QUEUE, int(seq), visitor)
    end
    redis.call('HSET', K_POLLS, visitor, now_s)
    if seq > read_last_seq() then
        last_seq = seq
    end
end

local function save_last_seq()
    if last_seq and last_seq ~= stored_last_seq then
        redis.call('HSET', K_META, 'last_seq', int(last_seq))
    end
end

-- Records a poll. (Instances' clocks may differ by a few ms; abandonment
-- is measured in minutes.)
local function touch_poll(visitor)
    redis.call('HSET', K_POLLS, visitor, now_s)
end
