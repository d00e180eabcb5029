-- check_in: an admitted visitor checks in. ARGV[4] = visitor,
-- ARGV[5] = the session expiry its ticket carries.
-- Returns the session expiry, or nil when the session was ended or expired.
local visitor = ARGV[4]
local ticket_expiry = tonumber(ARGV[5])

housekeep()
promote()

local expiry = session_of(visitor)
if not expiry then
    if marked(K_ENDED, visitor) or ticket_expiry <= now then
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
        redis.call('ZADD', K_SESSIONS, 'XX', int(renewed), visitor)
        expiry = renewed
    end
end
return expiry
