-- check_in: an admitted visitor checks in. ARG_VISITOR = visitor,
-- ARG_TICKET = the session expiry its ticket carries.
-- Returns the session expiry, or nil when the session was ended or expired.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: batch_find, batch_leave, housekeep, int, marked, promote, session_of
local visitor = c.argv[ARG_VISITOR]
local ticket_s = c.argv[ARG_TICKET]
local ticket_expiry = tonumber(ticket_s)

housekeep(c)
promote(c)

local expiry = session_of(c, visitor)
local batch_expiry
if not expiry then
    -- Ended (also by another of its tickets, one that names no batch: a
    -- revoke after a renewal by the fallback store, which leaves the batch
    -- unmarked).
    if marked(c, c.k.ended, visitor) then
        return false
    end
    -- A newcomer's session may be in a batch, found by the ticket's expiry.
    batch_expiry = batch_find(c, visitor, ticket_s, ticket_s)
    expiry = batch_expiry and tonumber(batch_expiry)
end
if not expiry then
    if ticket_expiry <= c.now then
        return false
    end
    -- Redis lost a live session (restart without persistence, FLUSHALL):
    -- the ticket proves the admission, so the session is counted again.
    expiry = ticket_expiry
    redis.call('ZADD', c.k.sessions, ticket_s, visitor)
end
if c.p.renewal then
    -- Renewal extends; it never cuts short a promoted visitor's grace.
    local renewed = c.now + c.p.session_ms
    if renewed > expiry then
        if batch_expiry then
            -- A renewed session is one of its own.
            batch_leave(c, visitor, batch_expiry)
            redis.call('ZADD', c.k.sessions, int(renewed), visitor)
            redis.call('PEXPIRE', c.k.sessions, c.p.key_ttl_ms)
        else
            redis.call('ZADD', c.k.sessions, 'XX', int(renewed), visitor)
        end
        expiry = renewed
    end
end
return expiry
