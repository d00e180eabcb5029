-- release: ends a visitor's session or queue place. ARG_VISITOR = visitor;
-- ARG_EXPIRY_MIN, ARG_EXPIRY_MAX = the bounds of its session's expiry, if
-- known ('' if not): equal for the expiry its ticket carries
-- (end_session), the min alone for an arrival whose caller gave up
-- (End::Arrival: no earlier than that). ARG_CURSOR = where a search by
-- visitor goes on ('b:<n>' in the batches, 't:<n>' in the tail; absent:
-- from the start).
-- Returns 1 if there was one, 0 if not, or {cursor} when a release that
-- knows no expiry must go on in another call from `cursor` (it reads the
-- batches and the tail a bounded part a call, so no call holds Redis
-- long however many there are). The room it frees goes to the queue in
-- the next operation's promotion, as with every other change.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: batch_find, batch_leave, batch_scan, gone_of, housekeep, int,
-- uses: lane_key, lane_of, marked, promote, session_of, waiting_seq
local visitor = c.argv[ARG_VISITOR]
local expiry_min = c.argv[ARG_EXPIRY_MIN] ~= '' and c.argv[ARG_EXPIRY_MIN] or nil
local expiry_max = c.argv[ARG_EXPIRY_MAX] ~= '' and c.argv[ARG_EXPIRY_MAX] or nil
local ticket_expiry = expiry_min and expiry_min == expiry_max and tonumber(expiry_min)
local cursor = c.argv[ARG_CURSOR] or 'b:0'
local phase, from = string.match(cursor, '^(%a):(%d+)$')
from = tonumber(from or '0')

housekeep(c)
promote(c)

-- Remembered until it would have expired, so its ticket cannot bring it
-- back, and as long as the queue ticket that led to it could still poll
-- (see poll).
local function end_session(expiry)
    redis.call('ZADD', c.k.ended, int(math.max(expiry, c.now + c.p.abandon_ms)), visitor)
end

local function decide()
    local expiry = session_of(c, visitor)
    if expiry then
        end_session(expiry)
        return redis.call('ZREM', c.k.sessions, visitor)
    end
    local lane = lane_of(c, visitor)
    if lane then
        redis.call('ZREM', lane_key(c, lane), visitor)
    end
    if lane or redis.call('ZREM', c.k.queue, visitor) == 1 then
        redis.call('HDEL', c.k.polls, visitor)
        -- Remembered as long as its ticket could still poll.
        redis.call('ZADD', c.k.places, int(c.now + c.p.abandon_ms), visitor)
        return 1
    end
    -- A newcomer's session in a batch: those within the bounds are read.
    if expiry_min then
        local batch_expiry = batch_find(c, visitor, expiry_min, expiry_max or '+inf')
        if batch_expiry then
            end_session(tonumber(batch_expiry))
            batch_leave(c, visitor, batch_expiry)
            return 1
        end
        if ticket_expiry and ticket_expiry > c.now then
            -- A live ticket whose session is not here (lost with its key,
            -- or renewed where this store did not see it): ended all the
            -- same, so that no ticket of it brings it back.
            end_session(ticket_expiry)
        end
        return 0
    end
    -- Nothing known but the visitor: every batch, then the tail, a part a
    -- call.
    if phase == 'b' then
        local batch_expiry, next_from = batch_scan(c, visitor, from)
        if batch_expiry then
            end_session(tonumber(batch_expiry))
            batch_leave(c, visitor, batch_expiry)
            return 1
        end
        if next_from then
            return { 'b:' .. int(next_from) }
        end
        phase, from = 't', 0
    end
    local seq, next_from = waiting_seq(c, visitor, from)
    if seq and marked(c, c.k.places, visitor) then
        -- Released before: its id stays in the tail until it moves up.
        return 0
    end
    if seq and #gone_of(c, { visitor, int(seq) }) == 1 then
        -- Abandoned: left out when its member moves up.
        return 0
    end
    if seq then
        -- It waits in the tail, which is not written by visitor: the mark
        -- ends the place there, and its member's move to `queue` leaves
        -- it out. (A room that never abandons keeps the mark as long as
        -- its keys.)
        local mark = c.p.abandon_ms > 0 and c.p.abandon_ms + TAIL_MARK_MS or c.p.key_ttl_ms
        redis.call('ZADD', c.k.places, int(c.now + mark), visitor)
        return 1
    end
    if next_from then
        return { 't:' .. int(next_from) }
    end
    return 0
end

return decide()
