-- stats: live figures, after housekeeping and the periodic maintenance
-- (the daemon calls this every few seconds per room).
-- Returns {active, queued, admitted_last_minute, oldest_admission or -1}.
housekeep(c)
maintain(c)
promote(c)
local oldest = redis.call('ZRANGE', c.k.admits, 0, 0, 'WITHSCORES')
local oldest_ms = -1
if #oldest == 2 then
    oldest_ms = tonumber(oldest[2])
end
counts(c)
return {
    c.active_n,
    queue_length(c),
    c.window_n,
    oldest_ms,
}
