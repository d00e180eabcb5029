-- ctx: the call's context, and the room's keys.
--
-- Every room function starts with `begin(keys, args)`, which returns the
-- call's context `c`: its keys, its time, the room's policy and the figures
-- the call reads as it goes. Every helper takes `c`; nothing about a call
-- lives in the library between calls. (What does live there is pure:
-- parsed policies and key sets by their text, number formatting tables.)
--
-- KEYS (one hash tag, so one cluster slot; `c.k.<name>`):
--   1 sessions  ZSET visitor -> session expiry (ms): sessions made one at a
--               time (promotion, passthrough, renewal, ...); newcomers
--               admitted together are in `batches` instead (sessions.lua)
--   2 queue     ZSET visitor -> seq: the head of the queue (head.lua)
--   3 polls     HASH visitor -> time of last poll (ms) (head.lua)
--   4 admits    ZSET "<last admission id>:<count>" -> time (ms): the rate
--               window, one member per call that admitted (window.lua)
--   5 meta      HASH layout, o_rev, last_seq, reset_floor, window, sweep,
--               ttl_slot, admitted, queued, rejected, abandoned, event,
--               stale_lo, stale_hi, epoch, hold_for, hold_until (epoch.lua),
--               and region mode's g_* and r_* fields
--   6 ended     ZSET visitor -> until when its session, or the queue place
--               that became a session, stays ended (room.lua)
--   7 places    ZSET visitor -> until when a released queue place stays
--               ended (room.lua)
--   8 tail      ZSET first seq -> packed member: the back of a long queue
--               (tail.lua)
--   9 tail_ids  the name the tail's chunks "tail_ids:<n>" start with (tail.lua)
--  10 batches   ZSET of sessions made together (sessions.lua)
-- (their names, in this order, are ROOM_KEYS: store/redis/keys.rs) and,
-- not passed, formed beside them in the same hash tag from the names
-- keys.rs declares: the priority lanes' keys LANE_PREFIX .. <n>
-- (lanes.lua), the tail's chunks TAIL_CHUNK_PREFIX .. <n> (tail.lua), and
-- TAIL_SEQS, a HASH visitor -> seq of the tail places of visitors who
-- arrived by a stable id (not one just made), so that their next arrival
-- by id finds the place with one member read instead of reading the tail
-- (tail.lua, `tail_seqs_of`).
-- ARGV (positions generated from wire.rs: ARG_<NAME>):
--   ARG_NOW       now (ms, from the caller's clock; never Redis TIME, so
--                 tests move time)
--   ARG_POLICY    the room's policy: the fields of POLICY_FIELDS (wire.rs)
--                 joined by '|', parsed once per distinct string (`policy_of`)
--   ARG_DEADLINE  Redis server time (microseconds) after which this call
--                 must do nothing, because its caller has given up on it
--                 (0 = none)
--   then the function's own arguments, each ARG_<NAME> in its function
--   (store/redis/calls.rs names them; library.rs defines the constants at
--   the top of each function)
--
-- begin() refuses a call (an error reply, nothing written) when
--   * its deadline has passed (DEADLINE);
--   * the room's keys were written by a layout this build does not read
--     (LAYOUT <version>: above LAYOUT_NEWEST or below LAYOUT_OLDEST): it
--     must not decide on what it cannot read;
--   * the room's runtime settings have a newer revision than the policy
--     the caller passes (STALE <revision>): the caller reads them and
--     calls again, so no instance decides on limits an operator has
--     changed.
-- A room without a layout mark (new, or written by a build before layouts
-- were marked: layout 0, the same keys as 1) gets this build's.

-- Parsed policies by their text (at most 256 kept).
local policies, policies_n = {}, 0
local function policy_of(s)
    local p = policies[s]
    if not p then
        local f = {}
        for v in string.gmatch(s .. '|', '([^|]*)|') do
            f[#f + 1] = v
        end
        p = {}
        for i, name in ipairs(POLICY_FIELDS) do
            p[name] = f[i]
        end
        p.cap = tonumber(p.cap)
        p.rate = tonumber(p.rate)
        p.session_ms = tonumber(p.session_ms)
        p.renewal = p.renewal == '1'
        p.max_queue = tonumber(p.max_queue)
        p.abandon_ms = tonumber(p.abandon_ms)
        p.grace_ms = tonumber(p.grace_ms)
        p.revision = tonumber(p.revision or '0')
        -- Priority lanes (lanes.lua): nil without, else the count and each
        -- lane's share in thousandths, the general queue's at [0].
        if p.lanes and p.lanes ~= '' then
            local shares, i = {}, 0
            for v in string.gmatch(p.lanes, '[^,]+') do
                shares[i] = tonumber(v)
                i = i + 1
            end
            p.lanes = { count = i - 1, shares = shares }
        else
            p.lanes = nil
        end
        -- The presale window's end (ms; 0: none): before it only the lanes
        -- are let in (lanes.lua, `general_held`).
        p.lanes_until = tonumber(p.lanes_until or '0') or 0
        if policies_n >= 256 then
            policies, policies_n = {}, 0
        end
        policies[s] = p
        policies_n = policies_n + 1
    end
    return p
end

-- The room's keys by name, by the first key's text (at most 1024 kept).
local key_sets, key_sets_n = {}, 0
local function keys_of(keys)
    local k = key_sets[keys[1]]
    if not k then
        k = {}
        for i, name in ipairs(ROOM_KEYS) do
            k[name] = keys[i]
        end
        -- The keys formed beside them: "wr:{<room>}:" is the first key
        -- without its name.
        local room = string.sub(keys[1], 1, #keys[1] - #ROOM_KEYS[1])
        -- The lanes' keys (lanes.lua).
        k.lane_prefix = room .. LANE_PREFIX
        -- The tail's chunks and the tail places of stable ids (tail.lua).
        k.tail_chunk_prefix = room .. TAIL_CHUNK_PREFIX
        k.tail_seqs = room .. TAIL_SEQS
        if key_sets_n >= 1024 then
            key_sets, key_sets_n = {}, 0
        end
        key_sets[keys[1]] = k
        key_sets_n = key_sets_n + 1
    end
    return k
end

-- Whether the server time is past `deadline_us` (decimal microseconds).
local function too_late(deadline_us)
    if deadline_us == '0' or string.sub(deadline_us, 1, 1) == '-' then
        return false
    end
    local t = redis.call('TIME')
    -- Both in decimal microseconds: of one length (16 digits until the
    -- year 2286), the later is the greater string, without parsing.
    local us = t[2]
    local server_us = t[1] .. string.sub('000000', #us + 1) .. us
    if #server_us == #deadline_us then
        return server_us > deadline_us
    end
    return tonumber(server_us) > tonumber(deadline_us)
end

-- The call's context, or an error reply (see the header) as `refused`.
local function begin(keys, args)
    local p = policy_of(args[ARG_POLICY])
    local c = {
        k = keys_of(keys), keys = keys, argv = args,
        now_s = args[ARG_NOW], now = tonumber(args[ARG_NOW]), p = p,
        -- In region mode the cap is a grant instead (`cap_kind`, below).
        cap = p.cap, rate = p.rate,
        -- Figures read once per call and kept up to date by the helpers
        -- that change them (nil until read): active sessions, admissions
        -- in the window, places waiting, sessions in batches.
        active_n = nil, window_n = nil, queue_n = nil, batched_n = nil,
        -- The highest seq handed out (nil until read; `last_seq_read` is
        -- meta's text as counts() read it), as read (`stored_last_seq`).
        last_seq = nil, last_seq_read = nil, stored_last_seq = nil,
        -- The ten seconds in which the room's keys last had their expiry
        -- moved (room.lua, keep_alive).
        ttl_slot = nil,
        -- The tail's first and last members (false: empty; nil: unread).
        tail_first = nil, tail_last = nil,
    }
    -- A call that waited in a frozen or overloaded Redis past its caller's
    -- timeout must not land later: the caller has already answered the
    -- visitor (by the fail mode), so an admission or queue place made now
    -- would be a ghost holding a slot. The caller converts its deadline to
    -- the server's clock with a measured offset.
    if too_late(args[ARG_DEADLINE]) then
        return { refused = redis.error_reply('DEADLINE the caller gave up on this call') }
    end
    local m = redis.call('HMGET', c.k.meta, 'layout', 'o_rev')
    local layout = m[1]
    if layout ~= LAYOUT_VERSION_S then
        local v = tonumber(layout or '0')
        if v > LAYOUT_NEWEST or v < LAYOUT_OLDEST then
            return { refused = redis.error_reply('LAYOUT ' .. (layout or '0')) }
        end
        -- (A room's first call marks it, before it writes anything; the
        -- meta key then lives as the room's keys do. A newer mark this
        -- build reads stays: an expand release never lowers it.)
        if v < LAYOUT_VERSION then
            redis.call('HSET', c.k.meta, 'layout', LAYOUT_VERSION_S)
            redis.call('PEXPIRE', c.k.meta, p.key_ttl_ms)
        end
    end
    if m[2] and tonumber(m[2]) > p.revision then
        return { refused = redis.error_reply('STALE ' .. m[2]) }
    end
    -- Whether `cap` limits anything (0 = unlimited in the central mode).
    c.capped = c.cap ~= nil and c.cap > 0
    -- Whether the room has a rate limit (`rate` may become a grant of 0).
    c.rated = c.rate > 0
    c.room_rate = c.rate
    -- Region mode (src/region, store/redis/region.rs): the policy's
    -- cap_kind is CAP_GRANT and the cap is the region's grant, kept in meta as
    -- two totals that only grow (g_raised: slots the global store granted,
    -- g_lowered: slots the region gave back), so a grant of 0 admits
    -- nobody. `region_bound` is the oldest waiting seq in the other
    -- regions, as of the last sync, until g_bound_until (nil: none): FIFO
    -- promotion stops before it and newcomers do not jump it.
    --
    -- The rate limit works the same way (I2 across regions): an admission
    -- holds one of the region's admission tokens for the rate window
    -- after it was made, and the region holds at most its rate grant of
    -- them, kept as r_raised and r_lowered. So in region mode a rated room
    -- admits while the window holds fewer admissions than the rate grant,
    -- not the room's rate; `room_rate` keeps the room's (an upper bound on
    -- any grant). A cap_kind of CAP_RATE_GRANT is region mode for a room
    -- without a capacity limit: only its rate is a grant.
    c.region_mode = p.cap_kind ~= CAP_ROOM
    if c.region_mode then
        local g = redis.call('HMGET', c.k.meta, 'g_raised', 'g_lowered', 'g_bound',
            'g_bound_until', 'r_raised', 'r_lowered')
        if p.cap_kind == CAP_GRANT then
            c.cap = math.max(0, tonumber(g[1] or '0') - tonumber(g[2] or '0'))
            c.capped = true
        else
            c.cap = 0
        end
        if c.rated then
            c.rate = math.max(0, tonumber(g[5] or '0') - tonumber(g[6] or '0'))
        end
        local b, b_until = tonumber(g[3] or '0'), tonumber(g[4] or '0')
        if b > 0 and b_until > c.now then
            c.region_bound = b
        end
    end
    return c
end

-- Numbers. tonumber() and string.format() each cost about as much as a
-- small Redis command, so the hot paths avoid them where they can.

-- Integers go to Redis as strings: a Lua number would be printed with
-- %.17g (and above 1e14 in exponent form), which costs more than the
-- command it is an argument of.
local function int(n)
    return string.format('%d', n)
end

-- "000" to "999", so that a run of consecutive integers (a batch's seqs)
-- is written as a shared prefix and one of these; COUNTS the same without
-- leading zeros. (Made by the first call that needs them: a library's
-- loading code cannot use `string`.)
local DIGITS3, COUNTS
-- The thousands int_next() last wrote, and how (a cache of a pure function).
local last_thousands, last_prefix = -1, ''

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

-- Scratch tables for arrive's ZADD arguments (arrive.lua): refilled by each
-- call, never read past what it wrote.
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

-- A visitor id's length (hex).
local ID_LEN = 32
