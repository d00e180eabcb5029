-- check_in: an admitted visitor checks in. ARGV[12] = visitor.
-- Returns the session expiry, or nil when the session is gone.
local visitor = ARGV[12]

housekeep()
promote()

local expiry = session_of(visitor)
if expiry and renewal then
    -- Renewal extends; it never cuts short a promoted visitor's grace.
    local renewed = now + session_ms
    if renewed > expiry then
        redis.call('ZADD', K_SESSIONS, 'XX', renewed, visitor)
        expiry = renewed
    end
end
touch()
if expiry then
    return expiry
end
return false
