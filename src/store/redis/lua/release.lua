-- release: ends a visitor's session or queue place. ARGV[4] = visitor;
-- optional ARGV[5], ARGV[6] = the bounds of its session's expiry, if known:
-- equal for the expiry its ticket carries (end_session), ARGV[5] alone for
-- an arrival whose caller gave up (release_arrival: no earlier than that).
-- Returns 1 if there was one, else 0. The room it frees goes to the queue
-- in the next operation's promotion, as with every other change.
local visitor = ARGV[4]
local expiry_min, expiry_max = ARGV[5] or '(0', ARGV[6] or '+inf'
local ticket_expiry = ARGV[5] and ARGV[5] == ARGV[6] and tonumber(ARGV[5])

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
        -- A newcomer's session in a batch: those within the bounds are
        -- read (without them, every batch).
        local batch_expiry = batch_find(visitor, expiry_min, expiry_max)
        if batch_expiry then
            end_session(tonumber(batch_expiry))
            batch_leave(visitor, batch_expiry)
            removed = 1
        elseif not ticket_expiry and tail_ends() then
            -- It may wait in the tail (see the prelude), which is not looked
            -- up by visitor: the mark ends the place there, and its member's
            -- move to `queue` leaves it out. Answered as released, since it
            -- may have been. (Not a session's ticket: that is no place.)
            -- (A room that never abandons keeps the mark as long as its keys.)
            local mark = abandon_ms > 0 and abandon_ms + TAIL_MARK_MS or key_ttl_ms
            redis.call('ZADD', K_PLACES, int(now + mark), visitor)
            removed = 1
        end
    end
end
if removed == 0 and ticket_expiry and ticket_expiry > now then
    -- A live ticket whose session is not here (lost with its key, or
    -- renewed where this store did not see it): ended all the same, so
    -- that no ticket of it brings it back.
    end_session(ticket_expiry)
end
return removed
