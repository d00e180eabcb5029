-- Prelude of every room script that decides: the room policy read from ARGV,
-- housekeeping and promotion. Redis has no `require`, so the Rust side
-- concatenates this file in front of each script; every script therefore
-- applies the same rules in the same atomic run.
--
-- KEYS (one hash tag, so one cluster slot):
--   1 sessions  ZSET visitor -> session expiry (ms)
--   2 queue     ZSET visitor -> seq
--   3 polls     ZSET visitor -> time of last poll (ms), for abandonment
--   4 admits    ZSET admission id -> admission time (ms), the rate window
--   5 meta      HASH last_seq, reset_floor, admitted, queued, rejected,
--               abandoned
--   6 ended     ZSET visitor -> until when its ticket is void: a session
--               released, revoked or reset (until it would have expired),
--               or a released queue place (for abandon_after)
-- ARGV:
--   1 now (ms, from the caller's clock; never Redis TIME, so tests move time)
--   2 total_active_users (0 = unlimited)   3 new_users_per_minute (0 = unlimited)
--   4 session_duration_ms   5 session_renewal (1/0)   6 method
--   7 max_queue_length (0 = unbounded)   8 abandon_after_ms
--   9 arrival_grace_ms   10 state   11 key TTL (ms)
--   12 deadline: Redis server time (microseconds) after which this call
--      must do nothing, because its caller has given up on it (0 = none)
--   13.. operation arguments

local K_SESSIONS, K_QUEUE, K_POLLS, K_ADMITS, K_META, K_ENDED =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

local now = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local session_ms = tonumber(ARGV[4])
local renewal = ARGV[5] == '1'
local method = ARGV[6]
local max_queue = tonumber(ARGV[7])
local abandon_ms = tonumber(ARGV[8])
local grace_ms = tonumber(ARGV[9])
local state = ARGV[10]
local key_ttl_ms = ARGV[11]
local deadline_us = tonumber(ARGV[12])

-- A call that waited in a frozen or overloaded Redis past its caller's
-- timeout must not land later: the caller has already answered the visitor
-- (by the fail mode), so an admission or queue place made now would be a
-- ghost holding a slot. TIME is the server's clock; the caller converts its
-- deadline to it with a measured offset.
if deadline_us > 0 then
    local t = redis.call('TIME')
    if tonumber(t[1]) * 1000000 + tonumber(t[2]) > deadline_us then
        return redis.error_reply('DEADLINE the caller gave up on this call')
    end
end

-- Must match `RATE_WINDOW_MS`, `SEQ_EPOCH_MS` and `SEQ_PER_MS` in store/mod.rs.
local RATE_WINDOW_MS = 60000
local SEQ_EPOCH_MS = 1577836800000
local SEQ_PER_MS = 1024

-- Bounds on the work of one run, so a burst of expiries or a huge free
-- capacity never blocks Redis for long; the next run carries on. Both stay
-- well under Lua's unpack() limit (about 8000 values).
local PROMOTE_MAX = 1000
local ABANDON_MAX = 1000

-- Verdict tags and reject reasons; must match the decoding in redis.rs.
local ADMITTED, QUEUED, REJECTED, ENDED = 1, 2, 3, 4
local R_CLOSED, R_QUEUE_FULL, R_OVER_LIMIT = 1, 2, 3

-- Integers above 1e14 would print in exponent form with tostring().
local function int(n)
    return string.format('%d', n)
end

local function housekeep()
    redis.call('ZREMRANGEBYSCORE', K_SESSIONS, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', K_ENDED, '-inf', now)
    redis.call('ZREMRANGEBYSCORE', K_ADMITS, '-inf', now - RATE_WINDOW_MS)
    if abandon_ms == 0 then
        return
    end
    -- "Older than abandon_after" is strict, hence the exclusive bound.
    local gone = redis.call('ZRANGEBYSCORE', K_POLLS, '-inf', '(' .. int(now - abandon_ms),
        'LIMIT', 0, ABANDON_MAX)
    if #gone > 0 then
        redis.call('ZREM', K_QUEUE, unpack(gone))
        redis.call('ZREM', K_POLLS, unpack(gone))
        redis.call('HINCRBY', K_META, 'abandoned', #gone)
    end
end

-- How many more admissions the limits allow right now (math.huge if none).
local function free_room()
    local free = math.huge
    if cap > 0 then
        free = math.min(free, cap - redis.call('ZCARD', K_SESSIONS))
    end
    if rate > 0 then
        free = math.min(free, rate - redis.call('ZCARD', K_ADMITS))
    end
    return free
end

-- Admission ids come from the `admitted` counter, which only grows, so two
-- admissions in the same millisecond stay two members of the window.
local function record_admissions(n)
    local last = redis.call('HINCRBY', K_META, 'admitted', n)
    local args = {}
    for i = 1, n do
        args[2 * i - 1] = now
        args[2 * i] = int(last - n + i)
    end
    redis.call('ZADD', K_ADMITS, unpack(args))
end

local function admit(visitor)
    local expiry = now + session_ms
    redis.call('ZADD', K_SESSIONS, expiry, visitor)
    record_admissions(1)
    return { ADMITTED, expiry }
end

local function reject(reason)
    redis.call('HINCRBY', K_META, 'rejected', 1)
    return { REJECTED, reason }
end

-- Admits waiting visitors while there is room. A promoted visitor gets its
-- session now, with the arrival grace so it outlives the wait until the
-- visitor's next poll collects it. `passthrough` has no queue of its own: a
-- visitor left over from another method is admitted when it next polls.
local function promote()
    if (state ~= 'open' and state ~= 'queue_all') or method == 'passthrough' then
        return
    end
    local waiting = redis.call('ZCARD', K_QUEUE)
    if waiting == 0 then
        return
    end
    local n = math.min(free_room(), waiting, PROMOTE_MAX)
    if n <= 0 then
        return
    end
    local chosen
    if method == 'random' then
        chosen = redis.call('ZRANDMEMBER', K_QUEUE, n)
        redis.call('ZREM', K_QUEUE, unpack(chosen))
    else
        local popped = redis.call('ZPOPMIN', K_QUEUE, n)
        chosen = {}
        for i = 1, #popped, 2 do
            chosen[#chosen + 1] = popped[i]
        end
    end
    redis.call('ZREM', K_POLLS, unpack(chosen))
    local expiry = now + session_ms + grace_ms
    local args = {}
    for i, visitor in ipairs(chosen) do
        args[2 * i - 1] = expiry
        args[2 * i] = visitor
    end
    redis.call('ZADD', K_SESSIONS, unpack(args))
    record_admissions(#chosen)
end

-- The visitor's live session expiry, or nil. Call after housekeep().
local function session_of(visitor)
    local expiry = redis.call('ZSCORE', K_SESSIONS, visitor)
    if expiry then
        return tonumber(expiry)
    end
    return nil
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

local function next_seq()
    local last = tonumber(redis.call('HGET', K_META, 'last_seq') or '0')
    return math.max(math.max(now - SEQ_EPOCH_MS, 0) * SEQ_PER_MS, last + 1)
end

-- Puts the visitor in the queue at `seq` and keeps `last_seq` the highest seq
-- ever handed out, so a later next_seq() never reuses or undercuts it.
local function enqueue(visitor, seq)
    redis.call('ZADD', K_QUEUE, seq, visitor)
    redis.call('ZADD', K_POLLS, now, visitor)
    local last = tonumber(redis.call('HGET', K_META, 'last_seq') or '0')
    if seq > last then
        redis.call('HSET', K_META, 'last_seq', int(seq))
    end
end

-- Records a poll. GT: a caller whose clock read is older than another's must
-- not make a live visitor look abandoned.
local function touch_poll(visitor)
    redis.call('ZADD', K_POLLS, 'GT', now, visitor)
end

-- Every write pushes the expiry of all room keys forward, so a room nobody
-- uses any more disappears on its own instead of leaking memory.
local function touch()
    for i = 1, 6 do
        redis.call('PEXPIRE', KEYS[i], key_ttl_ms)
    end
end
