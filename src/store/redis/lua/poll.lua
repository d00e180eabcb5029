-- poll: a queued visitor polls. ARGV[4] = visitor, ARGV[5] = the seq its
-- ticket carries. Returns a verdict like arrive, or {4} when the place was
-- ended (released, or the room reset since the ticket was issued).
local visitor = ARGV[4]
local seq = tonumber(ARGV[5])

housekeep()
promote()

local function decide()
    -- A place in the tail (see the prelude) is found by the ticket's seq:
    -- from the tail's first seq on, a place is there and not in `queue`.
    -- One released there, or admitted in passthrough, is only marked until
    -- it moves to `queue`; a visitor found there has no session otherwise.
    local first = tail_ends()
    local tail = first and seq >= first.first and tail_find(visitor, seq, ARGV[5])
    local expiry
    if tail then
        if marked(K_PLACES, visitor) or marked(K_ENDED, visitor) then
            expiry = session_of(visitor)
            return expiry and { ADMITTED, expiry } or { ENDED }
        end
    else
        expiry = session_of(visitor)
        if expiry then
            return { ADMITTED, expiry }
        end
    end
    local queued = not tail and redis.call('ZSCORE', K_QUEUE, visitor)
    if state == 'closed' then
        if queued or tail then
            -- Keep the place: a room that reopens finds its queue as it was.
            touch_poll(visitor)
        end
        return { REJECTED, R_CLOSED }
    end
    if method == 'passthrough' and state ~= 'paused' then
        -- No limits to wait for: whoever waits in line goes in.
        if queued then
            redis.call('ZREM', K_QUEUE, visitor)
            redis.call('HDEL', K_POLLS, visitor)
            used_places({ 0, visitor })
        elseif tail then
            -- Left out when its member moves to `queue` (its session, then
            -- this mark, then its last poll say it left); marked while the
            -- session lasts, since a poll from the tail finds the mark
            -- before the session.
            redis.call('ZADD', K_PLACES,
                int(now + math.max(abandon_ms + TAIL_MARK_MS, session_ms + grace_ms)), visitor)
        end
        return admit(visitor)
    end
    if queued then
        touch_poll(visitor)
        return place_of(visitor)
    end
    if tail then
        touch_poll(visitor)
        return tail_place(tail, seq)
    end
    -- An ended place stays ended: released, or issued before a reset. So
    -- does the place of a session that was ended (released or revoked):
    -- the admission used it up, and putting it back would admit again.
    local floor = tonumber(redis.call('HGET', K_META, 'reset_floor') or '0')
    if seq <= floor or marked(K_PLACES, visitor) or marked(K_ENDED, visitor) then
        return { ENDED }
    end
    -- The store lost the entry (flush, failover, expired keys) but the ticket
    -- still holds the visitor's order: put it back where it was (I5). The
    -- visitor may now be at the head, so promotion runs again.
    enqueue(visitor, seq)
    save_last_seq()
    promote()
    expiry = session_of(visitor)
    if expiry then
        return { ADMITTED, expiry }
    end
    tail = tail_find(visitor, seq, ARGV[5])
    if tail then
        return tail_place(tail, seq)
    end
    return place_of(visitor)
end

return decide()
