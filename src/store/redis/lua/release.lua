-- release: ends a visitor's session or queue place. ARGV[4] = visitor,
-- ARGV[5] (optional) = the session expiry its ticket carries (end_session).
-- Returns 1 if there was one, else 0. The room it frees goes to the queue
-- in the next operation's promotion, as with every other change.
local visitor = ARGV[4]
local ticket_expiry = ARGV[5]

housekeep()
promote()

-- Remembered until it would have expired, so its ticket cannot bring it
-- back, and as long as the queue ticket that led to it could still poll
-- (see poll).
local function end_session(expiry)
    redis.call('ZADD', K_ENDED, int(math.max(expiry, now + abandon_ms)), visitor)
end

local expiry = session_of(visitor)
local removed = 0
if expiry then
    end_session(expiry)
    removed = redis.call('ZREM', K_SESSIONS, visitor)
else
    removed = redis.call('ZREM', K_QUEUE, visitor)
    redis.call('HDEL', K_POLLS, visitor)
    if removed == 1 then
        -- Remembered as long as its ticket could still poll.
        redis.call('ZADD', K_PLACES, int(now + abandon_ms), visitor)
    else
        -- A newcomer's session in a batch: the one its ticket's expiry
        -- names, or, without the ticket, every batch is read.
        local batch_expiry = batch_find(visitor, ticket_expiry)
        if batch_expiry then
            end_session(tonumber(batch_expiry))
            batch_leave(visitor, batch_expiry)
            removed = 1
        elseif tail_ends() then
            -- It may wait in the tail (see the prelude), which is not looked
            -- up by visitor: the mark ends the place there, and its member's
            -- move to `queue` leaves it out. Answered as released, since it
            -- may have been.
            -- (A room that never abandons keeps the mark as long as its keys.)
            local mark = abandon_ms > 0 and abandon_ms + TAIL_MARK_MS or key_ttl_ms
            redis.call('ZADD', K_PLACES, int(now + mark), visitor)
            removed = 1
        end
    end
end
return removed
