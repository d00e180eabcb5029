-- poll: a queued visitor polls. ARGV[4] = visitor, ARGV[5] = the seq its
-- ticket carries. Returns a verdict like arrive, or {4} when the place was
-- ended (released, or the room reset since the ticket was issued).
local visitor = ARGV[4]
local seq = tonumber(ARGV[5])

housekeep()
promote()

local function decide()
    local expiry = session_of(visitor)
    if expiry then
        return { ADMITTED, expiry }
    end
    local queued = redis.call('ZSCORE', K_QUEUE, visitor)
    if state == 'closed' then
        if queued then
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
        end
        return admit(visitor)
    end
    if queued then
        touch_poll(visitor)
        return place_of(visitor)
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
    return place_of(visitor)
end

return decide()
