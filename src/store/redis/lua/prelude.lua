-- Prelude of every room script that decides: the room policy read from ARGV,
-- housekeeping and promotion. The Rust side (library.rs) loads this file
-- once as the head of a Redis function library, each room script after it
-- as one function that starts with begin(); every script therefore applies
-- the same rules in the same atomic run, and the helpers below are built
-- once per server, not once per call.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 sessions  ZSET visitor -> session expiry (ms)
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
--               revoked or reset: its ticket must not re-create it
--   7 places    ZSET visitor -> until when a released queue place stays
--               ended (abandon_after): its ticket must not put it back
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
local K_SESSIONS, K_QUEUE, K_POLLS, K_ADMITS, K_META, K_ENDED, K_PLACES
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
-- promote() left it (nil if it did not look).
local active_n, window_n, queue_n
-- The highest seq handed out so far (nil until read; `last_seq_read` is
-- meta's field as counts() read it, parsed only if a seq is needed), and
-- the ten seconds in which the room's keys last had their expiry moved
-- (see `keep_alive`).
local last_seq, last_seq_read, ttl_slot
-- last_seq as read from meta, so save_last_seq() writes only a change.
local stored_last_seq

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
    K_SESSIONS, K_QUEUE, K_POLLS, K_ADMITS, K_META, K_ENDED, K_PLACES =
        keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]
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
    active_n, window_n, queue_n = nil, nil, nil
    last_seq, last_seq_read, ttl_slot, stored_last_seq = nil, nil, nil, nil

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

-- What every decision depends on: expired sessions and admissions outside
-- the window are gone.
local function housekeep()
    redis.call('ZREMRANGEBYSCORE', K_SESSIONS, '-inf', now_s)
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

-- Moves every room key's expiry forward, so a room nobody uses any more
-- disappears on its own instead of leaking memory.
local function expire_all()
    for i = 1, 7 do
        redis.call('PEXPIRE', KEYS[i], key_ttl_ms)
    end
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
        -- a poll and its write): a few random ones a run are checked.
        local sampled = redis.call('HRANDFIELD', K_POLLS, 16)
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
    expire_all()
end

local function counts()
    if not active_n then
        active_n = redis.call('ZCARD', K_SESSIONS)
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

-- Admits waiting visitors while there is room. A promoted visitor gets its
-- session now, with the arrival grace so it outlives the wait until the
-- visitor's next poll collects it. Whoever stopped polling is dropped
-- instead of admitted. `passthrough` has no queue of its own: a visitor
-- left over from another method is admitted when it next polls.
local function promote()
    if (state ~= 'open' and state ~= 'queue_all') or method == 'passthrough' then
        return
    end
    local chosen = {}
    for _ = 1, 4 do
        local waiting = redis.call('ZCARD', K_QUEUE)
        queue_n = waiting
        local n = math.min(free_room() - #chosen, waiting, PROMOTE_MAX - #chosen)
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
        queue_n = waiting - #gone - #keep
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
    return { QUEUED, tonumber(seq), rank + 1, redis.call('ZCARD', K_QUEUE) }
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
    redis.call('ZADD', K_QUEUE, int(seq), visitor)
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
