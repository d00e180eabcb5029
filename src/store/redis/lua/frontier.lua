-- frontier: what lets an instance answer most queued visitors' polls
-- without a script per poll (see store/redis/frontier.rs). Runs the
-- periodic maintenance, records the polls answered since the last run,
-- promotes, and describes the queue beyond its admission frontier.
--
-- KEYS 1..10 as in lib/ctx.lua, 11 = the room's overrides (JSON).
-- ARG_AHEAD_MS = how far ahead (ms) the answer must hold
-- ARG_PRECISION = one sample per 1/precision of the distance from the
--            frontier (so a position read between samples is off by at most
--            that share of it)
-- ARG_MIN_QUEUE = the shortest queue worth describing (shorter: scripts answer)
-- ARG_POLLS.. = (visitor, time) pairs: polls answered from the last description
--
-- Returns {length, bound, reset_floor, stale_lo, stale_hi, n, place_1 ..
-- place_n, rank_1, seq_1,
-- rank_2, seq_2, ...}: `bound` is the most admissions the rate window allows
-- within ahead_ms (-1: nothing may be answered from this description),
-- [stale_lo, stale_hi) the seqs an event's shuffle renumbered (tickets
-- carrying one go to the scripts for their new seq), the places are queue
-- places released in the meantime (they are ended),
-- and the (rank, seq) samples run from rank `bound` (the frontier: whoever
-- has a higher seq cannot be admitted before ahead_ms have passed) to the
-- last place.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: admissions, counts, housekeep, int, maintain, promote, queue_length,
-- uses: refill, seq_at, tail_ends
local k, ARGV = c.k, c.argv
local ahead_ms = tonumber(ARGV[ARG_AHEAD_MS])
local precision = tonumber(ARGV[ARG_PRECISION])
local min_queue = tonumber(ARGV[ARG_MIN_QUEUE])
local K_OVERRIDES = c.keys[11]

housekeep(c)
-- Polls first: whoever polled must not be dropped as abandoned below.
-- They come as (visitor, time) pairs, ready for HSET. Only visitors beyond
-- the frontier are answered without a script, and they are still waiting;
-- the rare one that left meanwhile is cleaned up by maintain().
for first = ARG_POLLS, #ARGV, 4000 do
    redis.call('HSET', k.polls, unpack(ARGV, first, math.min(first + 3999, #ARGV)))
end
maintain(c)
promote(c)

local len = queue_length(c)
local meta = redis.call('HMGET', k.meta, 'reset_floor', 'stale_lo', 'stale_hi')
local floor = tonumber(meta[1] or '0')

-- The bound holds for FIFO rooms with a rate limit. Another instance may
-- already apply an operator's change this one has not read yet: the
-- stored change counts too (the higher rate, any method but fifo).
local bound = -1
-- (In region mode the room's rate, not the region's grant: a bound on it.)
local eff_rate, eff_method = c.room_rate, c.p.method
local stored = redis.call('GET', K_OVERRIDES)
if stored then
    local ok, o = pcall(cjson.decode, stored)
    if ok and type(o) == 'table' then
        if type(o.new_users_per_minute) == 'number' then
            eff_rate = math.max(eff_rate, o.new_users_per_minute)
        end
        if type(o.queueing_method) == 'string' then
            eff_method = o.queueing_method
        end
    end
end
if c.p.method == 'fifo' and eff_method == 'fifo' and c.rated and len >= min_queue then
    counts(c)
    -- Admissions that leave the window within ahead_ms free as many places.
    local leaving = admissions(redis.call('ZRANGEBYSCORE', k.admits,
        '(' .. int(c.now - RATE_WINDOW_MS), int(c.now - RATE_WINDOW_MS + ahead_ms)))
    local m = math.max(eff_rate - c.window_n, 0) + leaving
    if m < len then
        bound = m
    end
end

-- Ranks in the tail count whoever left it unseen (see lib/tail.lua), so a
-- frontier there would sit too far forward: the places up to it move to
-- `queue` first, where ranks are exact (a few refreshes' worth at a time;
-- none answered from here until they have).
if bound >= 0 and tail_ends(c) then
    local head = redis.call('ZCARD', k.queue)
    if bound >= head then
        refill(c, math.min(bound - head + 1, 4 * PROMOTE_MAX))
        len = queue_length(c)
        if bound >= redis.call('ZCARD', k.queue) then
            bound = -1
        end
    end
end

local places = {}
if bound >= 0 then
    places = redis.call('ZRANGEBYSCORE', k.places, '(' .. c.now_s, '+inf', 'LIMIT', 0, 1001)
    if #places > 1000 then
        bound = -1
        places = {}
    end
end

local out = { len, bound, floor, tonumber(meta[2] or '0'), tonumber(meta[3] or '0'), #places }
for _, p in ipairs(places) do
    out[#out + 1] = p
end
if bound >= 0 then
    local r = bound
    local hint = {}
    while r < len do
        local seq = seq_at(c, r, hint)
        if not seq then
            break
        end
        out[#out + 1] = r
        out[#out + 1] = seq
        if r == len - 1 then
            break
        end
        r = math.min(len - 1, r + math.max(1, math.floor((r - bound) / precision)))
    end
end
return out
