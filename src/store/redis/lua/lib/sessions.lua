-- sessions: who is inside. Reads and writes `sessions` and `batches`.
--
-- A session is either
--   * an entry of `sessions` (visitor -> expiry): sessions made one at a
--     time (promotion, passthrough, a renewal, a session a ticket brought
--     back after a loss), or
--   * an id inside a member of `batches`: newcomers admitted by one arrive
--     call share their session's expiry, and their sessions are one member,
--     their ids joined, scored by that expiry. One sorted-set entry per
--     visitor costs Redis more than the whole rest of the decision; one per
--     call costs a string copy per visitor.
--
-- Invariants (checked by check.lua):
--   B1 the member BATCHED (scored minus a count, below every expiry, so
--      first) holds minus the number of batched sessions: the ids of every
--      batch less one per LEFT mark;
--   B2 a session that leaves its batch early (renewed: it is one of its own
--      then; or released) leaves a mark LEFT .. id scored half a
--      millisecond below its batch, so the two end together; an id is in
--      at most one batch and `sessions` never holds a batched id that has
--      no LEFT mark;
--   B3 a batch is never written again (only the count member is).
-- Only the daemon's new visitors (`arrive` with flag 'n') are batched: their
-- ids were just made, so no later `arrive` can bring them back (that looks
-- them up in `sessions` only).
--
-- Nothing looks a batch up by visitor without its session's expiry, which
-- the visitor's ticket carries (check_in, and release from the origin's
-- revoke), or a bound on it (the release of an arrival whose caller gave
-- up), but `release` knowing neither (the admin API's), which reads the
-- batches BATCH_SCAN members a call (`batch_scan`).

local BATCHED = '#'
local LEFT = '-'
-- Batch members a ticketless release reads per call.
local BATCH_SCAN = 256

-- Sessions in `batches`, as its count member says (0 without one).
local function batched(c)
    if not c.batched_n then
        c.batched_n = -tonumber(redis.call('ZSCORE', c.k.batches, BATCHED) or '0')
    end
    return c.batched_n
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
local function batch_add(c, expiry_s, ids, k)
    c.batched_n = batched(c) + k
    redis.call('ZADD', c.k.batches, expiry_s, ids, '-' .. int(c.batched_n), BATCHED)
end

-- Whether `visitor`'s id is one of the ids joined in batch member `m`.
local function batch_holds(m, visitor)
    local at = string.find(m, visitor, 1, true)
    -- (Only a match at an id's start is the visitor: another place would
    -- be two ids' halves.)
    while at and at % ID_LEN ~= 1 do
        at = string.find(m, visitor, at + 1, true)
    end
    return at ~= nil
end

-- The expiry (a string) of `visitor`'s session if one of `found` (batch
-- members and scores, as ZRANGEBYSCORE WITHSCORES gives them) holds it and
-- it has not left, else nil.
local function batch_in(c, found, visitor)
    for i = 1, #found, 2 do
        local m = found[i]
        if string.sub(m, 1, 1) ~= LEFT and batch_holds(m, visitor) then
            if redis.call('ZSCORE', c.k.batches, LEFT .. visitor) then
                return nil
            end
            return found[i + 1]
        end
    end
    return nil
end

-- The expiry (a string) of `visitor`'s session if a batch holds it, else
-- nil. Only batches ending within `min`..`max` (ZRANGEBYSCORE bounds) are
-- read: the ticket's expiry at check-in, or no earlier than an arrival.
local function batch_find(c, visitor, min, max)
    return batch_in(c, redis.call('ZRANGEBYSCORE', c.k.batches, min, max, 'WITHSCORES'), visitor)
end

-- `batch_find` over every batch, BATCH_SCAN members a call: the expiry if
-- found, else nil and where the next call starts (nil: nothing is left).
local function batch_scan(c, visitor, from)
    local found = redis.call('ZRANGEBYSCORE', c.k.batches, '(0', '+inf', 'WITHSCORES',
        'LIMIT', from, BATCH_SCAN)
    local expiry = batch_in(c, found, visitor)
    if expiry or #found < 2 * BATCH_SCAN then
        return expiry, nil
    end
    return nil, from + BATCH_SCAN
end

-- `visitor`'s session leaves its batch (whose expiry is `expiry`).
local function batch_leave(c, visitor, expiry)
    c.batched_n = batched(c) - 1
    redis.call('ZADD', c.k.batches, int(tonumber(expiry) - 1) .. '.5', LEFT .. visitor,
        int(-c.batched_n), BATCHED)
    if c.active_n then
        c.active_n = c.active_n - 1
    end
end

-- Every batched session as (expiry, visitor) pairs, for `reset`.
local function batched_sessions(c)
    local all = redis.call('ZRANGEBYSCORE', c.k.batches, '(0', '+inf', 'WITHSCORES')
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

-- Sessions that expired by `now` leave: `sessions` entries, and batches
-- (and marks) with the count member kept right. A count member lost alone
-- (by hand: every write here keeps it) is counted again.
local function expire_sessions(c)
    redis.call('ZREMRANGEBYSCORE', c.k.sessions, '-inf', c.now_s)
    -- The count member first, then the batch (or mark) that ends first.
    local front = redis.call('ZRANGE', c.k.batches, 0, 1, 'WITHSCORES')
    if #front > 0 then
        if front[1] ~= BATCHED then
            local n = sessions_in(redis.call('ZRANGEBYSCORE', c.k.batches, '(0', '+inf'))
            redis.call('ZADD', c.k.batches, int(-n), BATCHED)
            -- (Now first, before what was.)
            front = { BATCHED, int(-n), front[1], front[2] }
        end
        c.batched_n = -tonumber(front[2])
        if front[4] and tonumber(front[4]) <= c.now then
            local n = sessions_in(redis.call('ZRANGEBYSCORE', c.k.batches, '(0', c.now_s))
            redis.call('ZREMRANGEBYSCORE', c.k.batches, '(0', c.now_s)
            redis.call('ZINCRBY', c.k.batches, int(n), BATCHED)
            c.batched_n = c.batched_n - n
        end
    else
        c.batched_n = 0
    end
end

-- The visitor's live session expiry in `sessions`, or nil. Call after
-- housekeep().
local function session_of(c, visitor)
    local expiry = redis.call('ZSCORE', c.k.sessions, visitor)
    if expiry then
        return tonumber(expiry)
    end
    return nil
end
