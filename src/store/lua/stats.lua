-- stats: live figures after housekeeping.
-- Returns {active, queued, admitted_last_minute, oldest_admission or -1}.
housekeep()
promote()
local oldest = redis.call('ZRANGE', K_ADMITS, 0, 0, 'WITHSCORES')
local oldest_ms = -1
if #oldest == 2 then
    oldest_ms = tonumber(oldest[2])
end
local result = {
    redis.call('ZCARD', K_SESSIONS),
    redis.call('ZCARD', K_QUEUE),
    redis.call('ZCARD', K_ADMITS),
    oldest_ms,
}
touch()
return result
