-- release: ends a visitor's session or queue place. ARGV[4] = visitor.
-- Returns 1 if there was one, else 0. The room it frees goes to the queue
-- in the next operation's promotion, as with every other change.
local visitor = ARGV[4]

housekeep()
promote()
local expiry = session_of(visitor)
local removed = 0
if expiry then
    -- Remembered until it would have expired, so its ticket cannot bring it
    -- back, and as long as the queue ticket that led to it could still poll
    -- (see poll).
    redis.call('ZADD', K_ENDED, int(math.max(expiry, now + abandon_ms)), visitor)
    removed = redis.call('ZREM', K_SESSIONS, visitor)
else
    removed = redis.call('ZREM', K_QUEUE, visitor)
    redis.call('HDEL', K_POLLS, visitor)
    if removed == 1 then
        -- Remembered as long as its ticket could still poll.
        redis.call('ZADD', K_PLACES, int(now + abandon_ms), visitor)
    elseif tail_ends() then
        -- It may wait in the tail (see the prelude), which is not looked up
        -- by visitor: the mark ends the place there, and its member's move
        -- to `queue` leaves it out. Answered as released, since it may
        -- have been.
        -- (A room that never abandons keeps the mark as long as its keys.)
        local mark = abandon_ms > 0 and abandon_ms + TAIL_MARK_MS or key_ttl_ms
        redis.call('ZADD', K_PLACES, int(now + mark), visitor)
        removed = 1
    end
end
return removed
