-- check_in: an admitted visitor checks in. ARGV[4] = visitor,
-- ARGV[5] = the session expiry its ticket carries.
-- Returns the session expiry, or nil when the session was ended or expired.
local visitor = ARGV[4]
local ticket_expiry = tonumber(ARGV[5])

housekeep()
promote()

local expiry = session_of(visitor)
local batch_expiry
if not expiry then
    -- Ended (also by another of its tickets, one that names no batch: a
    -- revoke after a renewal by the fallback store, which leaves the batch
    -- unmarked).
    if marked(K_ENDED, visitor) then
        return false
    end
    -- A newcomer's session may be in a batch, found by the ticket's expiry.
    batch_expiry = batch_find(visitor, ARGV[5], ARGV[5])
    expiry = batch_expiry and tonumber(batch_expiry)
end
if not expiry then
    if ticket_expiry <= now then
        return false
    end
    -- Redis lost a live session (restart without persistence, FLUSHALL):
    -- the ticket proves the admission, so the session is counted again.
    expiry = ticket_expiry
    redis.call('ZADD', K_SESSIONS, ARGV[5], visitor)
end
if renewal then
    -- Renewal extends; it never cuts short a promoted visitor's grace.
    local renewed = now + session_ms
    if renewed > expiry then
        if batch_expiry then
            -- A renewed session is one of its own.
            batch_leave(visitor, batch_expiry)
            redis.call('ZADD', K_SESSIONS, int(renewed), visitor)
            redis.call('PEXPIRE', K_SESSIONS, key_ttl_ms)
        else
            redis.call('ZADD', K_SESSIONS, 'XX', int(renewed), visitor)
        end
        expiry = renewed
    end
end
return expiry
