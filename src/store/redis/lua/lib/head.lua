-- head: the front of the queue and the order of the room. Reads and
-- writes `queue`, `polls` and meta's `last_seq`, `sweep` and `abandoned`.
--
-- A place at the head is an entry of `queue` (visitor -> seq). Places
-- past the first HEAD_WINDOW are in the tail (tail.lua) until the head
-- empties toward them.
--
-- Invariants (checked by check.lua):
--   H1 meta `last_seq` is at least every seq handed out: in `queue`, in the
--      tail, and every ticket's (`next_seq` never reuses or undercuts it);
--   H2 every seq in `queue` is below the tail's first seq (newcomers go to
--      the tail whenever it is not empty; a place put back goes where its
--      seq says);
--   H3 `polls` holds SINCE and the last poll of visitors who polled; a
--      new place has no record (its seq says when it arrived).
--
-- When a visitor was last seen: by their poll record or, failing one, by
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
local function gone_of(c, entries)
    local gone, keep = {}, {}
    local n = #entries / 2
    local abandon_ms = c.p.abandon_ms
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
    local polled = redis.call('HMGET', c.k.polls, unpack(fields))
    local since = tonumber(polled[1])
    if not since then
        redis.call('HSET', c.k.polls, SINCE, c.now_s)
        since = c.now
    end
    local cutoff = c.now - abandon_ms
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
local function drop(c, gone)
    if #gone > 0 then
        redis.call('ZREM', c.k.queue, unpack(gone))
        redis.call('HDEL', c.k.polls, unpack(gone))
        redis.call('HINCRBY', c.k.meta, 'abandoned', #gone)
    end
end

-- Records a poll. (Instances' clocks may differ by a few ms; abandonment
-- is measured in minutes.)
local function touch_poll(c, visitor)
    redis.call('HSET', c.k.polls, visitor, c.now_s)
end

-- The highest seq handed out so far.
local function read_last_seq(c)
    if not c.last_seq then
        c.last_seq = tonumber(c.last_seq_read or redis.call('HGET', c.k.meta, 'last_seq') or '0')
        c.stored_last_seq = c.last_seq
    end
    return c.last_seq
end

-- The first of `count` (default 1) consecutive new seqs.
local function next_seq(c, count)
    local seq = math.max(math.max(c.now - SEQ_EPOCH_MS, 0) * SEQ_PER_MS, read_last_seq(c) + 1)
    c.last_seq = seq + (count or 1) - 1
    return seq
end

-- Writes `last_seq` back if this call raised it.
local function save_last_seq(c)
    if c.last_seq and c.last_seq ~= c.stored_last_seq then
        redis.call('HSET', c.k.meta, 'last_seq', int(c.last_seq))
        c.stored_last_seq = c.last_seq
    end
end
